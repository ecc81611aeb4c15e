"""Where each assigned partition of a worker starts reading.

Positioning. On every assignment, and after Redis lost acknowledged writes (`rewind`), the partitions are paused
until the consume loop has read where Redis's state of each ends and sought there (workers/resume.py decides),
so nothing is fetched from a commit that is ahead of Redis. When Redis or Kafka cannot answer, they stay paused
and are tried again. A rebalance while this reads or seeks ends the attempt: the next one positions the new
assignment.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Mapping

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import IllegalStateError

from keel.errors import KafkaUnavailable, StoreUnavailable
from keel.kafka import kafka_guard
from keel.store.redis import RedisStore

from .metrics import CartridgeMetrics
from .resume import Resume, decide

POSITION_RETRY_S = 1.0    # a partition whose resume point could not be read is tried again after this


class Positions:
    """The positioning of one cartridge's consumer."""

    def __init__(self, consumer: AIOKafkaConsumer, topic: str, *, log: logging.Logger, label: str,
                 metrics: CartridgeMetrics, bootstrap: str, on_outage: Callable[[BaseException], None]) -> None:
        self.consumer = consumer
        self.topic = topic
        self.log = log
        self.label = label
        self.metrics = metrics
        self.bootstrap = bootstrap
        self.on_outage = on_outage
        self.unpositioned: set[TopicPartition] = set()   # assigned, paused until their resume point is set
        self.rewound: set[TopicPartition] = set()        # positioned again after Redis lost writes (rewind)
        self.behind: dict[TopicPartition, int] = {}      # partition -> offset Redis must reach to be repaired

    # ---- the assignment (aiokafka's coordinator task; never awaits) ---------------------------------------

    def assigned(self, tps: Collection[TopicPartition]) -> None:
        """New partitions: paused until `position` has sought each to where Redis's state of it ends."""
        if tps:
            self.consumer.pause(*tps)
            self.unpositioned |= set(tps)

    def revoked(self, tps: Collection[TopicPartition]) -> None:
        self.unpositioned -= set(tps)
        self.rewound -= set(tps)
        for tp in tps:
            self.behind.pop(tp, None)
            self.metrics.drop_redis_behind(tp.partition)      # its new owner reports it

    def rewind(self) -> None:
        """Redis holds less than this worker wrote: every assigned partition is positioned again."""
        assigned = self.consumer.assignment()
        if assigned:
            self.consumer.pause(*assigned)
        self.unpositioned |= assigned
        self.rewound |= assigned

    # ---- the consume loop -----------------------------------------------------------------------------

    async def position(self, store: RedisStore, watermarks: dict[tuple[str, int], int | None],
                       epoch: Callable[[], int]) -> None:
        """Seek each unpositioned partition to where Redis's state ends, then let them be fetched. `epoch()` is
        the loop's assignment epoch (bumped by every revocation)."""
        started = epoch()
        tps = sorted(self.unpositioned & self.consumer.assignment(), key=lambda tp: tp.partition)
        self.unpositioned &= self.consumer.assignment()
        if not tps:
            return
        try:
            applied = await asyncio.to_thread(store.partitions_applied, self.topic, [tp.partition for tp in tps])
            async with kafka_guard("read committed offsets", self.bootstrap):
                committed = {tp: await self.consumer.committed(tp) for tp in tps}
            legacy = False
            if any(applied[tp.partition] is None and committed[tp] is not None for tp in tps):
                legacy = await asyncio.to_thread(store.predates_watermarks)
        except (StoreUnavailable, KafkaUnavailable) as e:
            self.on_outage(e)
            self.log.warning("%s: cannot read where partitions %s resume, retrying in %.0fs: %s", self.label,
                             [tp.partition for tp in tps], POSITION_RETRY_S, e)
            await asyncio.sleep(POSITION_RETRY_S)
            return
        try:
            for tp in tps:
                if epoch() != started:
                    return
                await self._seek(tp, decide(tp.partition, applied[tp.partition], committed[tp], legacy), watermarks)
            if epoch() != started:
                return
            self.consumer.resume(*tps)
        except (AssertionError, IllegalStateError):     # a partition revoked under the seek: aiokafka refuses it
            self.log.info("%s: the assignment changed while partitions %s were positioned; positioning the new "
                          "one", self.label, [tp.partition for tp in tps])
            return
        self.unpositioned -= set(tps)

    async def _seek(self, tp: TopicPartition, r: Resume, watermarks: dict[tuple[str, int], int | None]) -> None:
        watermarks[(tp.topic, tp.partition)] = None if r.start is None or r.how != "state" else r.start - 1
        if r.how == "state":
            self.consumer.seek(tp, r.start)
        elif r.how == "committed":
            self.consumer.seek(tp, r.start)
            self.log.info("%s: %s", self.label, r.describe())
        elif r.how == "beginning" or tp in self.rewound:   # nothing of it applied, and the consumer read past it
            await self.consumer.seek_to_beginning(tp)
        # "new" on a fresh assignment: the consumer has no position yet, its reset policy (earliest) applies
        self.rewound.discard(tp)
        if r.behind:
            self.behind[tp] = r.behind + (r.start or 0)
            self.metrics.redis_behind(tp.partition, r.behind)
            self.log.warning("%s: %s", self.label, r.describe())
        else:
            self.metrics.redis_behind(tp.partition, 0)

    def repaired(self, through: Mapping[tuple[str, int], int]) -> None:
        """Partitions found behind at their positioning: once Redis holds what the commit said, say so."""
        for (topic, partition), offset in through.items():
            tp = TopicPartition(topic, partition)
            target = self.behind.get(tp)
            if target is not None and offset + 1 >= target:
                del self.behind[tp]
                self.metrics.redis_behind(partition, 0)
                self.log.info("%s: partition %d repaired: Redis holds the log again through offset %d", self.label,
                              partition, offset)
