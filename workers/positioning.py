"""Where each assigned partition of a worker starts reading, and the group's commit catching up with Redis.

Positioning. On every assignment, and after Redis lost acknowledged writes (`rewind`), the partitions are paused
until the consume loop has read where Redis's state of each ends and sought there (workers/resume.py decides),
so nothing is fetched from a commit that is ahead of Redis. When Redis or Kafka cannot answer, they stay paused
and are tried again. A rebalance while this reads or seeks ends the attempt: the next one positions the new
assignment.

Commits due. A worker commits a batch's offsets only after Redis holds it, and Redis's state, not the commit,
says where a partition resumes. So Redis can hold records the group's commit does not cover: a batch written
while its partitions were revoked (its writer must not commit for the new owner), a writer killed between its
Redis write and its commit, a commit that failed. When such a batch ends a partition's log, its next owner
resumes after it and fetches nothing: nothing would ever commit that partition again, and `keel status` would
show its lag, and a STALLED owner, for good, with nothing left to apply (the rebalance tier's double join ended
so under load: every worker idle, no partition paused, a partition's commit 200 records behind Redis's watermark
at the log end). So the offsets Redis holds beyond the group's commit are due: positioning notes them (the
resume point, when the commit is behind it or absent), as does a batch commit that failed, and the loop commits
them until a commit covers them or the partition is revoked.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Mapping

from aiokafka import AIOKafkaConsumer, OffsetAndMetadata, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError

from keel.errors import KafkaUnavailable, StoreUnavailable
from keel.kafka import kafka_guard
from keel.store.redis import RedisStore

from .metrics import CartridgeMetrics
from .resume import Resume, decide

POSITION_RETRY_S = 1.0    # a partition whose resume point could not be read is tried again after this
COMMIT_TIMEOUT_S = 10.0   # an offset commit that takes longer is given up (Redis offsets make that safe)
COMMIT_RETRY_S = 5.0      # a due commit that failed is tried again after this


class CommitsDue:
    """Offsets Redis holds that the group's commit does not cover yet, per partition (the highest one)."""

    def __init__(self) -> None:
        self.offsets: dict[TopicPartition, OffsetAndMetadata] = {}
        self.not_before = 0.0          # monotonic time of the next attempt after a failed one

    def __bool__(self) -> bool:
        return bool(self.offsets)

    def add(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        for tp, o in offsets.items():
            if tp not in self.offsets or self.offsets[tp].offset < o.offset:
                self.offsets[tp] = o

    def covered(self, offsets: Mapping[TopicPartition, OffsetAndMetadata]) -> None:
        """A commit of these offsets succeeded: what it reached is no longer due."""
        for tp, o in offsets.items():
            if tp in self.offsets and self.offsets[tp].offset <= o.offset:
                del self.offsets[tp]

    def revoked(self, tps: Collection[TopicPartition]) -> None:
        """Their new owner commits them (its positioning finds them due again when they are)."""
        for tp in tps:
            self.offsets.pop(tp, None)

    def ready(self, now: float) -> dict[TopicPartition, OffsetAndMetadata]:
        """What to commit now: every due offset, unless the last attempt failed less than COMMIT_RETRY_S ago."""
        return dict(self.offsets) if now >= self.not_before else {}


class Positions:
    """The positioning of one cartridge's consumer, and its commits due."""

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
        self.due = CommitsDue()

    # ---- the assignment (aiokafka's coordinator task; never awaits) ---------------------------------------

    def assigned(self, tps: Collection[TopicPartition]) -> None:
        """New partitions: paused until `position` has sought each to where Redis's state of it ends (which
        notes the commits due afresh: one noted under an older assignment may be below its owner's commit since)."""
        self.due = CommitsDue()
        if tps:
            self.consumer.pause(*tps)
            self.unpositioned |= set(tps)

    def revoked(self, tps: Collection[TopicPartition]) -> None:
        self.unpositioned -= set(tps)
        self.rewound -= set(tps)
        self.due.revoked(tps)
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
                       epoch: Callable[[], int], metadata: str) -> None:
        """Seek each unpositioned partition to where Redis's state ends, note the commits that became due, then
        let them be fetched. `epoch()` is the loop's assignment epoch (bumped by every revocation); `metadata`
        goes with the commits due."""
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
        due = {}
        try:
            for tp in tps:
                if epoch() != started:
                    return
                r = decide(tp.partition, applied[tp.partition], committed[tp], legacy)
                await self._seek(tp, r, watermarks)
                if r.how == "state" and r.start is not None and (committed[tp] is None or committed[tp] < r.start):
                    due[tp] = OffsetAndMetadata(r.start, metadata)
            if epoch() != started:
                return
            self.consumer.resume(*tps)
        except (AssertionError, IllegalStateError):     # a partition revoked under the seek: aiokafka refuses it
            self.log.info("%s: the assignment changed while partitions %s were positioned; positioning the new "
                          "one", self.label, [tp.partition for tp in tps])
            return
        self.unpositioned -= set(tps)
        if due:
            moves = ", ".join(f"partition {tp.partition} from {committed[tp]} to {o.offset}" for tp, o in due.items())
            self.log.info("%s: Redis holds records beyond the group's commit (a batch written but not committed: its "
                          "writer lost the partition, was killed, or its commit failed); committing %s", self.label,
                          moves)
            self.due.add(due)

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

    async def commit_due(self) -> None:
        """Commit the offsets due (see the module docstring); a failure leaves them due, tried again later."""
        mine = self.consumer.assignment()
        offsets = {tp: o for tp, o in self.due.ready(time.monotonic()).items() if tp in mine}
        if not offsets:
            return
        try:
            async with kafka_guard("commit offsets", self.bootstrap):
                await asyncio.wait_for(self.consumer.commit(offsets), COMMIT_TIMEOUT_S)
        except KafkaUnavailable as e:
            self.metrics.kafka_errors.inc()
            self.due.not_before = time.monotonic() + COMMIT_RETRY_S
            level = logging.INFO if isinstance(e.__cause__, CommitFailedError) else logging.WARNING
            self.log.log(level, "%s: offsets of partitions %s not committed (%s); trying again in %.0fs", self.label,
                         sorted(tp.partition for tp in offsets), e, COMMIT_RETRY_S)
            return
        self.due.covered(offsets)

    def repaired(self, through: Mapping[tuple[str, int], int]) -> None:
        """Partitions found behind at their positioning: once Redis holds what the commit said, say so."""
        for (topic, partition), offset in through.items():
            tp = TopicPartition(topic, partition)
            target = self.behind.get(tp)
            if target is not None and offset + 1 < target:     # re-applying: the gauge counts what is left
                self.metrics.redis_behind(partition, target - offset - 1)
            elif target is not None:
                del self.behind[tp]
                self.metrics.redis_behind(partition, 0)
                self.log.info("%s: partition %d repaired: Redis holds the log again through offset %d", self.label,
                              partition, offset)
