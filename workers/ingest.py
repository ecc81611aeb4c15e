"""The consuming side of a worker: one mode/faust Service per cartridge, running a batch loop over its topic.

Why an aiokafka consumer inside a faust Service rather than a faust agent. Throughput: faust's per-event
stream machinery (conductor → channel → stream, several event-loop turns and tasks per event) moved about
4,700 events/s here with a bare agent (`stream.noack_take`, acks only, no processing; `bench/ingest.py
--faust-probe`), against ~140,000/s for a plain aiokafka consumer on the same topic. Offsets: faust commits
whatever its streams acked, `take`/`take_events` ack in `finally` (an exception or a cancellation acks the
batch, faust-streaming #189) and concurrency > 1 commits past events in flight (#606). Here offsets are
committed explicitly, only after Redis holds the batch.

The loop: fetch (at most `batch` records) → plan on the mirrors → dead letters → Redis → commit offsets.
Batch k is written while batch k+1 is planned (only k touches Redis or Kafka offsets; if k's write fails,
both plans are discarded and redone in order). A rebalance waits until nothing is planned or being written,
then the revoked tenants' mirrors are dropped; SIGTERM finishes what is planned and commits it; SIGKILL
anywhere is harmless: Redis keeps each tenant's applied offset with its writes, in one atomic step, and
redelivered records at or below it are skipped.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, ConsumerStoppedError, KafkaError
from mode import Service

from keel.cartridge import Cartridge
from keel.config import Settings
from keel.errors import UsageError
from keel.kafka import KafkaUnavailable, TopicSpec, ensure_topics, kafka_guard, new_consumer, new_producer
from keel.store.redis import RedisStore

from .applier import BatchApplier, BatchPlan
from .dlq import DeadLetterCounts, DeadLetterQueue
from .names import dlq_topic, events_topic, group_id
from .pipeline import BatchPipeline
from .records import Record

PROGRESS_EVERY_S = 10.0


@dataclass(frozen=True)
class WorkerOptions:
    """Tuning of `keel worker` (flags)."""
    batch: int = 5000                     # records per batch (per fetch)
    within_s: float = 0.5                 # how long a fetch waits for records before a smaller batch
    topics: TopicSpec = field(default_factory=TopicSpec)
    max_mirrored_tenants: int = 100_000
    shutdown_timeout_s: float = 120.0     # how long SIGTERM waits for the in-flight batch


@dataclass
class _Planned:
    """A fetched batch whose plan is computed but not written."""
    fetched: dict[TopicPartition, list]
    records: list[Record]
    plan: BatchPlan


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, service: CartridgeIngest) -> None:
        self.service = service

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.service.on_revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.service.on_assigned(assigned)


class CartridgeIngest(Service):
    """Consumes `keel.<cartridge>.events` in group `keel.<cartridge>.worker` and writes batches to Redis."""

    def __init__(self, cartridge: Cartridge, settings: Settings, options: WorkerOptions, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        if not settings.redis_url:
            raise UsageError("the worker needs Redis: pass --redis URL or set KEEL_REDIS_URL")
        self.cartridge = cartridge
        self.settings = settings
        self.options = options
        self.topic = events_topic(cartridge.name)
        self.log = logging.getLogger(f"keel.worker.{cartridge.name}")
        self._idle = asyncio.Event()         # set: no batch planned or being written
        self._idle.set()
        self._revoking = False
        self._loop_done = asyncio.Event()     # set: the consume loop is not running
        self._loop_done.set()
        self.pipeline: BatchPipeline | None = None
        self.stores: list[RedisStore] = []       # one for the planning thread, one for the writing thread
        self.consumer: AIOKafkaConsumer | None = None
        self.producer: AIOKafkaProducer | None = None
        self.batches = 0
        self.records = 0
        self.dead_letters = 0
        self._reported = (0.0, 0)         # (monotonic time, records) of the last progress line

    @property
    def label(self) -> str:  # mode's name for logs
        return f"{type(self).__name__}({self.cartridge.name})"

    async def on_start(self) -> None:
        s, o = self.settings, self.options
        for _ in range(2):
            self.stores.append(await asyncio.to_thread(RedisStore.from_url, s.redis_url,   # strict: a replay's
                                                       namespace=self.cartridge.name,   # cutover makes a batch
                                                       strict_generations=True))        # be planned again
        reader, writer = self.stores
        await ensure_topics(s.kafka_bootstrap, [self.topic, dlq_topic(self.cartridge.name)], o.topics)
        self.producer = new_producer(s.kafka_bootstrap)
        self.consumer = new_consumer(s.kafka_bootstrap, self.topic, group_id(self.cartridge.name),
                                     max_poll_records=o.batch)
        async with kafka_guard("start producer and consumer", s.kafka_bootstrap):
            await self.producer.start()
            await self.consumer.start()
            self.consumer.subscribe([self.topic], listener=_Rebalance(self))
        applier = BatchApplier(self.cartridge, reader, writer=writer, allow_global_notes=s.allow_global_notes,
                               max_mirrored_tenants=o.max_mirrored_tenants)
        self.pipeline = BatchPipeline(applier, DeadLetterQueue(self.producer, dlq_topic(self.cartridge.name),
                                                               self.cartridge.name, s.kafka_bootstrap),
                                      DeadLetterCounts(writer.client, self.cartridge.name), log=self.log)
        self.log.info("%s: consuming %s as group %s into Redis namespace %r", self.label, self.topic,
                      group_id(self.cartridge.name), self.cartridge.name)

    @Service.task
    async def _consume(self) -> None:
        """Fetch → plan → write → commit offsets; batch k is written while batch k+1 is planned."""
        pending: _Planned | None = None          # planned, not written yet
        self._loop_done.clear()
        try:
            while not self.should_stop:
                fetched = await self._fetch()
                if self.should_stop:
                    break
                if not fetched or self._revoking:
                    # nothing new, or a rebalance is waiting for us (records fetched now are fetched again
                    # from the committed offsets once it is over): write what is planned, then be idle
                    if pending is not None:
                        await self._write_alone(pending)
                        pending = None
                    self._idle.set()
                    continue
                self._idle.clear()
                pending = await self._step(pending, self._records(fetched), fetched)
            if pending is not None:
                await self._write_alone(pending)
        except asyncio.CancelledError:
            raise
        except BaseException as e:     # a bug, not an outage: stop the worker (nothing more is acknowledged)
            self.log.exception("%s: crashed", self.label)
            await self.crash(e)
            raise
        finally:
            self._idle.set()
            self._loop_done.set()

    async def _fetch(self) -> dict[TopicPartition, list]:
        assert self.consumer is not None
        try:
            fetched = await self.consumer.getmany(timeout_ms=int(self.options.within_s * 1000),
                                                  max_records=self.options.batch)
        except ConsumerStoppedError:
            return {}
        except KafkaError as e:
            self.log.warning("%s: fetch failed, retrying: %s: %s", self.label, type(e).__name__, e)
            await asyncio.sleep(1.0)
            return {}
        assigned = self.consumer.assignment()
        return {tp: recs for tp, recs in fetched.items() if recs and tp in assigned}

    @staticmethod
    def _records(fetched: dict[TopicPartition, list]) -> list[Record]:
        return [Record.of(r) for tp in sorted(fetched, key=lambda t: t.partition) for r in fetched[tp]]

    def _stopping(self) -> bool:
        return bool(self.should_stop)

    async def _step(self, pending: _Planned | None, records: list[Record],
                    fetched: dict[TopicPartition, list]) -> _Planned | None:
        """Write `pending` (if any) while planning `records`; returns the new pending batch (None when stopping)."""
        assert self.pipeline is not None
        if pending is None:
            plan = await self.pipeline.plan_until_done(records, stopping=self._stopping)
        else:
            written, plan = await self.pipeline.process_overlapped((pending.records, pending.plan), records,
                                                                   stopping=self._stopping)
            if written is None:
                return None
            await self._written(pending, written)
            if plan is None:
                plan = await self.pipeline.plan_until_done(records, stopping=self._stopping)
        if plan is None:
            return None
        plan.log_ends = self._log_ends(fetched)
        return _Planned(fetched, records, plan)

    def _log_ends(self, fetched: dict[TopicPartition, list]) -> dict[tuple[str, int], int]:
        """The log end of each fetched partition as the last fetch saw it (no request): committed with the
        batch, it tells readers how far behind the workers were (the `lag` of tool results)."""
        assert self.consumer is not None
        ends = {(tp.topic, tp.partition): self.consumer.highwater(tp) for tp in fetched}
        return {tp: end for tp, end in ends.items() if end is not None}

    async def _write_alone(self, pending: _Planned) -> None:
        assert self.pipeline is not None
        written = await self.pipeline.process(pending.records, stopping=self._stopping, plan=pending.plan)
        if written is not None:
            await self._written(pending, written)

    async def _written(self, batch: _Planned, plan: BatchPlan) -> None:
        """Redis holds the batch: count it, then commit its Kafka offsets."""
        assert self.pipeline is not None and self.consumer is not None
        self.batches += 1
        self.records += len(batch.records)
        self.dead_letters += len(plan.dead_letters)
        if self.log.isEnabledFor(logging.DEBUG):
            self.log.debug("%s: batch of %d: %d applied, %d duplicate, %d skipped (already in Redis), %d dead, "
                           "%d tenant step(s); last plan %.3fs, last write %.3fs", self.label, len(batch.records),
                           plan.applied, plan.duplicates, plan.skipped, len(plan.dead_letters), len(plan.tenants),
                           *self.pipeline.timings)
        self._progress()
        if plan.dead_letters:
            first = plan.dead_letters[0]
            self.log.warning("%s: %d dead letter(s) in a batch of %d, e.g. partition %d offset %d: %s", self.label,
                             len(plan.dead_letters), len(batch.records), first.record.partition,
                             first.record.offset, first.reason)
        offsets = {tp: recs[-1].offset + 1 for tp, recs in batch.fetched.items()}
        try:
            async with kafka_guard("commit offsets", self.settings.kafka_bootstrap):
                await self.consumer.commit(offsets)
        except KafkaUnavailable as e:
            # Redis already holds the batch: a redelivery is skipped by offset. Those partitions may be
            # owned elsewhere by now, so their mirrors are forgotten.
            level = logging.INFO if isinstance(e.__cause__, CommitFailedError) else logging.WARNING
            self.log.log(level, "%s: offset commit not done (%s); redelivered records will be skipped",
                         self.label, e)
            await self.pipeline.forget({(tp.topic, tp.partition) for tp in offsets})

    def _progress(self) -> None:
        now = time.monotonic()
        then, count = self._reported
        if now - then >= PROGRESS_EVERY_S:
            if then:
                cpu = self.pipeline.cpu if self.pipeline is not None else {}
                per = {k: v / max(self.records, 1) * 1e6 for k, v in cpu.items()}
                self.log.info("%s: %d record(s) in %d batch(es), %d dead letter(s); %.0f records/s; CPU per "
                              "record: plan %.0f µs, write %.0f µs, process %.0f µs", self.label, self.records,
                              self.batches, self.dead_letters, (self.records - count) / (now - then),
                              per.get("plan", 0), per.get("write", 0),
                              time.process_time() / max(self.records, 1) * 1e6)
            self._reported = (now, self.records)

    def on_assigned(self, assigned: set[TopicPartition]) -> None:
        self._revoking = False
        self.log.info("%s: assigned partitions %s", self.topic, sorted(tp.partition for tp in assigned) or "none")

    async def on_revoked(self, revoked: set[TopicPartition]) -> None:
        """Rebalance: let the batches in flight finish and commit, then forget the revoked tenants."""
        self._revoking = True
        await self._idle.wait()
        if self.pipeline is not None and revoked:
            n = await self.pipeline.forget({(tp.topic, tp.partition) for tp in revoked})
            self.log.info("%s: partitions %s revoked; %d mirrored tenant(s) dropped", self.label,
                          sorted(tp.partition for tp in revoked), n)

    async def on_stop(self) -> None:
        """SIGTERM: the loop sees should_stop after its fetch or batch, writes what it has planned and
        ends; wait for that (bounded), then close the clients."""
        try:
            await asyncio.wait_for(self._loop_done.wait(), self.options.shutdown_timeout_s)
        except TimeoutError:
            self.log.warning("%s: batch still being written after %.0fs; it will be redelivered",
                             self.label, self.options.shutdown_timeout_s)
        if self.consumer is not None:
            try:
                await self.consumer.stop()
            except KafkaError as e:
                self.log.warning("%s: consumer stop: %s", self.label, e)
        if self.producer is not None:
            try:
                await self.producer.stop()
            except KafkaError as e:
                self.log.warning("%s: producer stop: %s", self.label, e)
        if self.pipeline is not None:
            await asyncio.to_thread(self.pipeline.close)
        for store in self.stores:
            store.close()
        self.log.info("%s: stopped after %d batch(es), %d record(s)", self.label, self.batches, self.records)
