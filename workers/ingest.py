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
both plans are discarded and redone in order).

Rebalances never wait for the loop. aiokafka calls `on_partitions_revoked` from its coordinator task after
marking the assignment as changing; from then on `getmany()` waits for the new assignment, which only comes
after the callback returns. So the callback only bumps the assignment epoch and notes the revoked
partitions (waiting there for the loop was the hang of issue 10). The loop compares each batch's epoch
with the current one: a batch planned under an older assignment is abandoned (its mirrors dropped; the
records are fetched again by whoever owns them now, from where Redis's state ends), its retries stop, its
offsets are not committed, and the revoked partitions' mirrors are forgotten before anything else is
planned. A write already under way may land after the partition moved: the Redis APPLY script skips
event ids already applied and only moves a tenant's applied offset forward, so a late write by the old
owner changes nothing the new owner wrote (tests/test_store_redis.py). What it wrote is committed by the new
owner: with its own batches, or by its positioning when Redis held it already (workers/positioning.py).

SIGTERM: the loop finishes the batch it is writing (and drops the one only planned) within
SHUTDOWN_BUDGET_S; past that it is cancelled and the clients are closed with bounded waits; a watchdog
(workers/app.py) ends the process by TERM_BOUND_S whatever happens. SIGKILL anywhere is harmless: Redis
keeps each tenant's applied offset with its writes, in one atomic step, and redelivered records at or
below it are skipped.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aiokafka import (
    AIOKafkaConsumer,
    AIOKafkaProducer,
    ConsumerRebalanceListener,
    OffsetAndMetadata,
    TopicPartition,
)
from aiokafka.errors import CommitFailedError, ConsumerStoppedError, KafkaError
from mode import Service

from keel.cartridge import Cartridge
from keel.config import Settings
from keel.connect import open_redis_store
from keel.errors import ServiceUnavailable, StateBehind, StoreRefusingWrites, StoreUnavailable, UsageError
from keel.health import Health
from keel.kafka import KafkaUnavailable, TopicSpec, ensure_topics, kafka_guard, new_consumer, new_producer
from keel.keystore_pg import privacy_of
from keel.outages import KAFKA
from keel.store.base import went_back
from keel.store.redis import GenerationChanged, RedisStore
from keel.wire import dlq_topic, events_topic, group_id

from .applier import BatchApplier, BatchPlan
from .diagnose import consumer_state
from .dlq import DeadLetterCounts, DeadLetterQueue
from .held import HeldPartitions
from .metrics import CartridgeMetrics
from .pipeline import BatchPipeline
from .positioning import COMMIT_TIMEOUT_S, Positions
from .progress import Progress
from .records import Record
from .status import commit_metadata

PROGRESS_EVERY_S = 10.0
LAG_EVERY_S = 5.0             # how often an idle worker asks the broker for its partitions' log ends
SHUTDOWN_BUDGET_S = 10.0      # SIGTERM: time for the batch being written before the loop is cancelled
CLOSE_TIMEOUT_S = 2.0         # each client's close (leave group, flush) after that
END_OFFSETS_TIMEOUT_S = 5.0   # the idle lag request: a broker that does not answer in time counts as unreachable
DEFAULT_UNREADY_AFTER_S = 30.0    # /readyz fails when no batch was committed (nor the partitions found caught up) for this long
DEFAULT_BATCH = 20_000        # records per batch: per-batch and per-step costs spread over more events (docs/performance.md)


@dataclass(frozen=True)
class WorkerOptions:
    """Tuning of `keel worker` (flags)."""
    batch: int = DEFAULT_BATCH            # records per batch (per fetch)
    within_s: float = 0.5                 # how long a fetch waits for records before a smaller batch
    topics: TopicSpec = field(default_factory=TopicSpec)
    max_mirrored_tenants: int = 100_000
    shutdown_timeout_s: float = SHUTDOWN_BUDGET_S   # how long SIGTERM waits for the batch being written
    unready_after_s: float = DEFAULT_UNREADY_AFTER_S  # no progress for this long: /readyz 503 with the cause


@dataclass
class _Planned:
    """A fetched batch whose plan is computed but not written."""
    fetched: dict[TopicPartition, list]
    records: list[Record]
    plan: BatchPlan
    epoch: int                   # the assignment it was fetched under (CartridgeIngest._epoch)


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, service: CartridgeIngest) -> None:
        self.service = service

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.service.on_revoked(revoked)        # never awaits the consume loop (see the module docstring)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.service.on_assigned(assigned)


class CartridgeIngest(Service):
    """Consumes `keel.<cartridge>.events` in group `keel.<cartridge>.worker` and writes batches to Redis."""

    def __init__(self, cartridge: Cartridge, settings: Settings, options: WorkerOptions, *,
                 metrics: CartridgeMetrics, health: Health, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        if not settings.redis_url:
            raise UsageError("the worker needs Redis: pass --redis URL or set KEEL_REDIS_URL")
        self.cartridge = cartridge
        self.settings = settings
        self.options = options
        self.topic = events_topic(cartridge.name)
        self.log = logging.getLogger(f"keel.worker.{cartridge.name}")
        self.metrics = metrics
        self.health = health
        self.beat_name = f"consume {cartridge.name}"
        self.assigned_count = 0               # readiness: partitions the group gave this worker
        self._kafka_failing: str | None = None    # readiness: why the last fetch failed (None: it worked)
        self._lag_at = 0.0                        # monotonic time the idle lag was last measured
        self.positions: Positions | None = None           # where each partition resumes (workers/positioning.py)
        self.progress = Progress(options.unready_after_s, self.log, self.label,
                                 lambda: len(self.positions.unpositioned) if self.positions is not None else 0)
        self._went_back: StateBehind | None = None        # the idle check found Redis holding less than written
        self._held = HeldPartitions(self.log, self.label)   # stopped at a version the cartridge lacks (held.py)
        self._epoch = 0                       # bumped by every revocation
        self._revoked: set[TopicPartition] = set()     # revoked, mirrors not forgotten yet
        self._loop_task: asyncio.Task | None = None
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
        self.client_id = f"keel-worker-{socket.gethostname()}-{os.getpid()}"    # the group member `keel status` shows

    @property
    def label(self) -> str:  # mode's name for logs
        return f"{type(self).__name__}({self.cartridge.name})"

    async def on_start(self) -> None:
        s, o = self.settings, self.options
        for _ in range(2):
            self.stores.append(await asyncio.to_thread(open_redis_store, self.cartridge, s,  # strict: a replay's
                                                       strict_generations=True))   # cutover makes a batch be planned again
        reader, writer = self.stores
        await ensure_topics(s.kafka_bootstrap, [self.topic, dlq_topic(self.cartridge.name)], o.topics)
        self.producer = new_producer(s.kafka_bootstrap)
        self.consumer = new_consumer(s.kafka_bootstrap, self.topic, group_id(self.cartridge.name),
                                     max_poll_records=o.batch, client_id=self.client_id)
        self.positions = Positions(self.consumer, self.topic, log=self.log, label=self.label, metrics=self.metrics,
                                   bootstrap=s.kafka_bootstrap, on_outage=self._outage)
        async with kafka_guard("start producer and consumer", s.kafka_bootstrap):
            await self.producer.start()
            await self.consumer.start()
            self.consumer.subscribe([self.topic], listener=_Rebalance(self))
        privacy = await asyncio.to_thread(privacy_of, self.cartridge, s)
        applier = BatchApplier(self.cartridge, reader, writer=writer, allow_global_notes=s.allow_global_notes,
                               max_mirrored_tenants=o.max_mirrored_tenants,
                               reveal=None if privacy is None else privacy.reveal_line,
                               prefetch_keys=None if privacy is None else privacy.prefetch)
        self.pipeline = BatchPipeline(applier, DeadLetterQueue(self.producer, dlq_topic(self.cartridge.name),
                                                               self.cartridge.name, s.kafka_bootstrap),
                                      DeadLetterCounts(writer.client, self.cartridge.name), log=self.log,
                                      on_outage=self._outage)
        self.health.check(f"kafka {self.cartridge.name}", lambda: self._kafka_failing)
        self.health.check(f"partitions {self.cartridge.name}",
                          lambda: None if self.assigned_count else "no partition assigned: waiting for the group, "
                                                                   "or more workers than partitions")
        self.health.check(f"redis {self.cartridge.name}", self._redis_reachable)
        self.health.check(f"progress {self.cartridge.name}", self.progress.unready)
        self.health.check(f"versions {self.cartridge.name}", self._held.reason)
        self.metrics.ready.set_function(lambda: 1.0 if self.health.readiness()[0] else 0.0)
        self.metrics.since_commit.set_function(       # a spare worker (no partition) has nothing to commit
            lambda: self.progress.idle_s() if self.assigned_count else 0.0)
        self.log.info("%s: consuming %s as group %s into Redis namespace %r", self.label, self.topic,
                      group_id(self.cartridge.name), self.cartridge.name)

    async def on_started(self) -> None:
        self._loop_done.clear()
        self._loop_task = asyncio.ensure_future(self._consume())

    async def _consume(self) -> None:
        """Fetch → plan → write → commit offsets; batch k is written while batch k+1 is planned."""
        pending: _Planned | None = None          # planned, not written yet
        try:
            while not self.should_stop:
                self.health.beat(self.beat_name)
                await self._position()
                fetched = await self._fetch()
                epoch = self._epoch              # the fetch returns records of the current assignment only
                if self.should_stop:
                    break
                pending = await self._after_rebalance(pending)
                if self._went_back is not None:   # the idle check: Redis lost writes
                    await self._rewind(self._went_back, pending)
                    pending = None
                    continue
                if epoch != self._epoch:          # revoked meanwhile: fetched again from the committed offsets
                    continue
                try:
                    if not fetched:               # nothing new: write what is planned
                        if pending is not None:
                            await self._write_alone(pending)
                            pending = None
                        continue
                    pending = await self._step(pending, self._records(fetched), fetched, epoch)
                except StateBehind as e:          # a write found Redis holding less than this worker wrote
                    await self._rewind(e, None)
                    pending = None
            pending = await self._after_rebalance(pending)
            if pending is not None and self.pipeline is not None:
                self.log.info("%s: stopping; a planned batch of %d record(s) is left to be redelivered",
                              self.label, len(pending.records))
                await self.pipeline.discard(pending.plan)
        except asyncio.CancelledError:
            raise
        except BaseException as e:     # a bug, not an outage: stop the worker (nothing more is acknowledged)
            self.log.exception("%s: crashed", self.label)
            await self.crash(e)
            raise
        finally:
            self._loop_done.set()
            if self.should_stop:
                self.health.retire(self.beat_name)

    async def _after_rebalance(self, pending: _Planned | None) -> _Planned | None:
        """Abandon a planned batch of an older assignment, then forget the revoked partitions' mirrors."""
        assert self.pipeline is not None
        if pending is not None and pending.epoch != self._epoch:
            self.log.info("%s: partitions were revoked; a planned batch of %d record(s) is abandoned (it is "
                          "redelivered to their owner)", self.label, len(pending.records))
            await self.pipeline.discard(pending.plan)
            pending = None
        if self._revoked:
            revoked, self._revoked = self._revoked, set()
            n = await self.pipeline.forget({(tp.topic, tp.partition) for tp in revoked})
            self.log.info("%s: partitions %s revoked; %d mirrored tenant(s) dropped", self.label,
                          sorted(tp.partition for tp in revoked), n)
        return pending

    async def _fetch(self) -> dict[TopicPartition, list]:
        assert self.consumer is not None
        try:
            fetched = await self.consumer.getmany(timeout_ms=int(self.options.within_s * 1000),
                                                  max_records=self.options.batch)
        except ConsumerStoppedError:
            return {}
        except KafkaError as e:
            self.metrics.kafka_errors.inc()
            self._kafka_failing = f"fetch failed: {type(e).__name__}: {e}"
            self.progress.outage(f"Kafka: {self._kafka_failing}")
            KAFKA.failed(f"{self.label}: fetch: {type(e).__name__}: {e}")    # one line per outage, not per try
            await asyncio.sleep(1.0)
            return {}
        self._kafka_failing = None
        assigned = self.consumer.assignment()
        fetched = {tp: recs for tp, recs in fetched.items() if recs and tp in assigned}
        if fetched:
            KAFKA.ok()                 # records came: a broker outage the client logged has ended
        if not fetched:
            await self._caught_up(assigned)
        return fetched

    async def _caught_up(self, assigned: set[TopicPartition]) -> None:
        """Nothing new was fetched: every LAG_EVERY_S, the lag of each assigned partition is its log end (asked
        from the broker: partitions that returned no records have no known high watermark) minus the
        consumer's position, which is where the written batches end."""
        assert self.consumer is not None
        now = time.monotonic()
        if not assigned or now - self._lag_at < min(LAG_EVERY_S, self.options.unready_after_s / 3):
            return
        self._lag_at = now
        try:
            ends = await asyncio.wait_for(self.consumer.end_offsets(list(assigned)), END_OFFSETS_TIMEOUT_S)
            lags = {tp: end - await self.consumer.position(tp) for tp, end in ends.items()}
        except (KafkaError, TimeoutError) as e:      # the broker does not answer: no progress to report
            self.metrics.kafka_errors.inc()
            self.progress.outage(f"Kafka: cannot read the partitions' log ends ({type(e).__name__})")
            return
        except AssertionError:                       # assignment changed meanwhile: next time
            return
        KAFKA.ok()                     # the broker answered
        for tp, lag in lags.items():
            self.metrics.lag(tp.partition, lag)
        if not any(lag for tp, lag in lags.items() if tp not in self._held):   # a held partition waits on purpose
            await self._check_state(assigned)

    async def _check_state(self, assigned: set[TopicPartition]) -> None:
        """Caught up: Redis still holds what this worker wrote? (A failover to a lagging replica while idle.)
        Found holding less: the loop rewinds. Else this counts as progress (readiness)."""
        held = self.pipeline.applier.watermarks if self.pipeline is not None else {}
        mine = sorted(tp.partition for tp in assigned if held.get((tp.topic, tp.partition)) is not None)
        try:
            stored = await asyncio.to_thread(self.stores[0].partitions_applied, self.topic, mine) if mine else {}
        except StoreUnavailable as e:
            self.metrics.redis_errors.inc()
            self.progress.outage(f"Redis: {e}")
            return
        for p, value in stored.items():
            h = held.get((self.topic, p))
            if went_back(value, h):
                self._went_back = StateBehind(f"Redis holds {self.topic} partition {p} applied up to {value}, less "
                                              f"than the {h} this worker wrote", topic=self.topic, partition=p,
                                              held=int(h or 0), stored=value)
                return
        self.progress.progressed()

    def _outage(self, error: BaseException) -> None:
        """A retried outage in the pipeline: count it and keep its cause for readiness; the loop is alive."""
        if isinstance(error, GenerationChanged):
            return
        service = error.service if isinstance(error, ServiceUnavailable) else "Kafka"   # Redis, the key store's
        if service in ("Redis", "Kafka"):                                               # PostgreSQL, Kafka
            (self.metrics.redis_errors if service == "Redis" else self.metrics.kafka_errors).inc()
        refusing = error.refusal if isinstance(error, StoreRefusingWrites) else None
        self.progress.outage(f"{service}: {error}", refusing=refusing)
        self.health.beat(self.beat_name)

    def _redis_reachable(self) -> str | None:
        if not self.stores:
            return "not connected yet"
        try:
            self.stores[0].ping()
        except StoreUnavailable as e:
            return f"ping failed: {e}"
        return None

    @staticmethod
    def _records(fetched: dict[TopicPartition, list]) -> list[Record]:
        return [Record.of(r) for tp in sorted(fetched, key=lambda t: t.partition) for r in fetched[tp]]

    def _stopping(self, epoch: int) -> Callable[[], bool]:
        """When retries of a batch fetched under `epoch` stop: SIGTERM, or its partitions were revoked."""
        return lambda: bool(self.should_stop) or self._epoch != epoch

    async def _step(self, pending: _Planned | None, records: list[Record],
                    fetched: dict[TopicPartition, list], epoch: int) -> _Planned | None:
        """Write `pending` (if any) while planning `records`; returns the new pending batch (None when stopping)."""
        assert self.pipeline is not None
        stopping = self._stopping(epoch)
        if pending is None:
            plan = await self.pipeline.plan_until_done(records, stopping=stopping)
        else:
            written, plan = await self.pipeline.process_overlapped((pending.records, pending.plan), records,
                                                                   stopping=stopping)
            if written is None:
                return None
            await self._written(pending, written)
            if plan is None and not stopping():
                plan = await self.pipeline.plan_until_done(records, stopping=stopping)
        if plan is None:
            return None
        plan.log_ends = self._log_ends(fetched)
        if plan.held and epoch == self._epoch and self.consumer is not None:
            self._held.hold(self.consumer, plan)       # paused at the held record before the next fetch
        return _Planned(fetched, records, plan, epoch)

    def _log_ends(self, fetched: dict[TopicPartition, list]) -> dict[tuple[str, int], int]:
        """The log end of each fetched partition as the last fetch saw it (no request): committed with the
        batch, it tells readers how far behind the workers were (the `lag` of tool results)."""
        assert self.consumer is not None
        mine = self.consumer.assignment()    # highwater() asserts on a partition a rebalance took meanwhile
        ends = {(tp.topic, tp.partition): self.consumer.highwater(tp) for tp in fetched if tp in mine}
        return {tp: end for tp, end in ends.items() if end is not None}

    async def _write_alone(self, pending: _Planned) -> None:
        assert self.pipeline is not None
        written = await self.pipeline.process(pending.records, stopping=self._stopping(pending.epoch),
                                              plan=pending.plan)
        if written is not None:
            await self._written(pending, written)

    async def _written(self, batch: _Planned, plan: BatchPlan) -> None:
        """Redis holds the batch: count it, then commit its Kafka offsets."""
        assert self.pipeline is not None and self.consumer is not None
        self.batches += 1
        self.records += len(batch.records)
        self.dead_letters += len(plan.dead_letters)
        m = self.metrics
        m.applied.inc(plan.applied)
        m.dead_lettered.inc(len(plan.dead_letters))
        m.records.inc(len(batch.records))
        m.batch_size.observe(len(batch.records))
        if self.log.isEnabledFor(logging.DEBUG):
            self.log.debug("%s: batch of %d: %d applied, %d duplicate, %d skipped (already in Redis), %d dead, "
                           "%d tenant step(s); last plan %.3fs, last write %.3fs", self.label, len(batch.records),
                           plan.applied, plan.duplicates, plan.skipped, len(plan.dead_letters), len(plan.tenants),
                           *self.pipeline.timings)
        self._progress()
        self._positions().repaired(plan.through)
        if plan.dead_letters:
            first = plan.dead_letters[0]
            self.log.warning("%s: %d dead letter(s) in a batch of %d, e.g. partition %d offset %d: %s", self.label,
                             len(plan.dead_letters), len(batch.records), first.record.partition,
                             first.record.offset, first.reason)
        self.progress.progressed()
        metadata = commit_metadata(self.client_id)        # `keel status` tells a stalled owner by it
        offsets = {tp: OffsetAndMetadata(recs[-1].offset + 1, metadata) for tp, recs in batch.fetched.items()}
        if plan.held and batch.epoch == self._epoch:       # (a plan redone after an outage holds here first)
            self._held.hold(self.consumer, plan)
            offsets.update(self._held.offsets(plan, self.client_id))
        if batch.epoch != self._epoch:       # their owner now commits them (or skips them by Redis's offsets)
            self.log.info("%s: a batch written as its partitions were revoked; its offsets are not committed",
                          self.label)
            return
        mine = self.consumer.assignment()
        for tp, done in offsets.items():
            end = self.consumer.highwater(tp) if tp in mine else None
            if end is not None:
                m.lag(tp.partition, end - done.offset)
        committing = time.perf_counter()
        try:
            async with kafka_guard("commit offsets", self.settings.kafka_bootstrap):
                await asyncio.wait_for(self.consumer.commit(offsets), COMMIT_TIMEOUT_S)
            m.commit_latency.observe(self.pipeline.timings[1] + time.perf_counter() - committing)
            self._positions().due.covered(offsets)
        except KafkaUnavailable as e:
            m.kafka_errors.inc()
            # Redis already holds the batch: a redelivery is skipped by offset, and the offsets are due (committed
            # by the loop later, or found due by the next owner's positioning). Those partitions may be owned
            # elsewhere by now, so their mirrors are forgotten.
            level = logging.INFO if isinstance(e.__cause__, CommitFailedError) else logging.WARNING
            self.log.log(level, "%s: offset commit not done (%s); redelivered records will be skipped",
                         self.label, e)
            if batch.epoch == self._epoch:         # (a revocation meanwhile: the new owner's positioning does it)
                self._positions().due.add(offsets)
            await self.pipeline.forget({(tp.topic, tp.partition) for tp in offsets})

    def _positions(self) -> Positions:
        assert self.positions is not None
        return self.positions

    async def _position(self) -> None:
        """Seek newly assigned (or rewound) partitions to where Redis's state ends, then commit what is due
        (workers/positioning.py)."""
        assert self.pipeline is not None
        positions = self._positions()
        if positions.unpositioned:
            await positions.position(self.stores[0], self.pipeline.applier.watermarks, lambda: self._epoch,
                                     commit_metadata(self.client_id))
        if positions.due:
            await positions.commit_due()

    async def _rewind(self, error: StateBehind, pending: _Planned | None) -> None:
        """Redis holds less than this worker wrote: every mirror and planned batch is dropped, and every assigned
        partition is positioned again from what Redis holds (what it lost is applied again from the log)."""
        assert self.consumer is not None and self.pipeline is not None
        self._went_back = None
        self.metrics.state_losses.inc()
        self.progress.outage(f"Redis lost acknowledged writes ({error})")
        self.log.warning("%s: Redis lost acknowledged writes (%s): a failover to a replica that lagged, or a "
                         "restart from an older backup; resuming every partition from what Redis holds",
                         self.label, error)
        if pending is not None:
            await self.pipeline.discard(pending.plan)
        await self.pipeline.forget(None)
        for store in self.stores:          # its caches of Redis's state may name what Redis lost
            store.forget_cached_state()
        self.pipeline.applier.watermarks.clear()
        self._positions().rewind()

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
        """Rebalance (aiokafka's coordinator task): the new partitions are paused until the loop has read where
        Redis's state of each ends and sought there (`_position`), so nothing is fetched from a commit that is
        ahead of Redis."""
        self._positions().assigned(assigned)
        self._held.assigned(assigned)
        self.assigned_count = len(assigned)
        self.metrics.rebalances.inc()
        self.metrics.assigned.set(len(assigned))
        self.log.info("%s: assigned partitions %s", self.topic, sorted(tp.partition for tp in assigned) or "none")

    def on_revoked(self, revoked: set[TopicPartition]) -> None:
        """Rebalance (aiokafka's coordinator task): a new assignment epoch; the loop abandons older batches
        and forgets these partitions' mirrors. Waits for nothing: the loop may be parked in a fetch that
        returns only after the rebalance."""
        self._epoch += 1
        self._revoked |= revoked
        self._positions().revoked(revoked)
        for tp in revoked:
            self.metrics.drop_lag(tp.partition)

    def diagnosis(self) -> str:
        """The loop's rebalance state, for the SIGUSR1 dump (workers/diagnose.py)."""
        p = self.positions
        return (f"{self.label}: epoch {self._epoch}, loop {'ended' if self._loop_done.is_set() else 'running'}, "
                f"unpositioned {sorted(tp.partition for tp in p.unpositioned) if p else []}, commits due "
                f"{ {tp.partition: o.offset for tp, o in p.due.offsets.items()} if p else {} }; "
                f"{consumer_state(self.consumer)}")

    async def on_stop(self) -> None:
        """SIGTERM: the loop sees should_stop after its fetch or batch, finishes the write under way and
        ends; wait for that (bounded, then cancel it), then close the clients (each bounded)."""
        cancelled = False
        if self._loop_task is not None and not self._loop_task.done():
            try:
                await asyncio.wait_for(self._loop_done.wait(), self.options.shutdown_timeout_s)
            except TimeoutError:
                self.log.warning("%s: the consume loop did not end within %.0fs; cancelled (what it had not "
                                 "committed is redelivered)", self.label, self.options.shutdown_timeout_s)
                self._loop_task.cancel()
                cancelled = True
                await asyncio.gather(self._loop_task, return_exceptions=True)
        for what, client in (("consumer", self.consumer), ("producer", self.producer)):
            if client is not None:
                try:
                    await asyncio.wait_for(client.stop(), CLOSE_TIMEOUT_S)
                except (KafkaError, TimeoutError) as e:
                    self.log.warning("%s: %s stop: %s", self.label, what, type(e).__name__)
        if self.pipeline is not None:
            self.pipeline.close(wait=not cancelled)      # a thread of the cancelled loop may still be busy
        for store in self.stores:
            store.close()
        self.log.info("%s: stopped after %d batch(es), %d record(s)", self.label, self.batches, self.records)
