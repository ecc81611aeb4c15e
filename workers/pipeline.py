"""Batches, start to finish: plan on the mirrors → dead letters to Kafka → counts and commit to Redis.

The order is what makes a crash anywhere harmless: a batch's dead letters are acknowledged by Kafka
before Redis holds the batch, and the caller commits Kafka offsets only after the batch is written.

Two threads: planning (handlers on the mirrors; the only thread that touches them) and writing (Redis).
While batch k is written, batch k+1 may be planned; it is written only after k, and when k's write fails
both plans are discarded with the mirrors they touched, and the batches are redone in order.

Through an outage a batch is tried again after 0.2 s, doubling up to RETRY_CAP_S (1 s): a write resumes within
about a second of Redis accepting writes again (with a 10 s cap, two out-of-memory squeezes 9 s apart stalled
workers for 65 s, issue 44). The retries are logged as one outage (keel/outages.py): a WARNING at the first
failure, a reminder at most every 30 s with the count; the worker's progress clock logs the resumption.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from keel.errors import StateBehind, StoreUnavailable
from keel.kafka import KafkaUnavailable
from keel.outages import OutageLog
from keel.store.redis import GenerationChanged

from .applier import BatchApplier, BatchPlan
from .dlq import DeadLetterCounts, DeadLetterQueue
from .mirror import TopicPartition
from .records import Record

T = TypeVar("T")
Outage = (StoreUnavailable, KafkaUnavailable)     # worth retrying; anything else is a bug
RETRY_FIRST_S = 0.2
RETRY_CAP_S = 1.0         # the longest wait between two tries of a batch
# StateBehind (a StoreUnavailable) is not retried here: Redis lost acknowledged writes, so the records to write
# again start before this batch; the caller (workers/ingest.py) resumes each partition from what Redis holds.


class BatchPipeline:
    """Runs the batches of one cartridge on a planning thread and a writing thread."""

    def __init__(self, applier: BatchApplier, dlq: DeadLetterQueue, counts: DeadLetterCounts, *,
                 log: logging.Logger, backoff: tuple[float, float] = (RETRY_FIRST_S, RETRY_CAP_S),
                 on_outage: Callable[[BaseException], None] | None = None) -> None:
        self.applier = applier
        self.on_outage = on_outage or (lambda e: None)   # counts errors, and tells a retrying loop is alive
        self.dlq = dlq
        self.counts = counts
        self.log = log
        self.backoff = backoff
        self.waits: deque[float] = deque(maxlen=256)    # the last waits between tries, in order
        self.retrying = OutageLog(log, f"batches of {applier.cartridge.name}", end_line=False)
        self.timings = (0.0, 0.0)      # seconds of the last batch: plan, write (dead letters + commit)
        self.cpu = {"plan": 0.0, "write": 0.0}     # CPU seconds spent by each thread so far
        name = applier.cartridge.name
        self._planner = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"keel-{name}-plan")
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"keel-{name}-write")

    async def _on(self, pool: ThreadPoolExecutor, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    # ---- steps --------------------------------------------------------------------------------

    async def plan(self, records: list[Record]) -> BatchPlan:
        """Handlers on the mirrors (raises StoreUnavailable when a mirror cannot be loaded)."""
        started = time.perf_counter()
        plan = await self._on(self._planner, self._cpu, "plan", self.applier.plan, records)
        self.timings = (time.perf_counter() - started, self.timings[1])
        return plan

    async def write(self, plan: BatchPlan) -> None:
        """Dead letters to Kafka (acknowledged), then counts and the plan to Redis. Raises on an outage."""
        started = time.perf_counter()
        await self.dlq.send(plan.dead_letters)
        await self._on(self._writer, self._cpu, "write", self._write, plan)
        self.timings = (self.timings[0], time.perf_counter() - started)

    def _cpu(self, what: str, fn: Callable[..., T], *args: object) -> T:
        started = time.thread_time()
        try:
            return fn(*args)
        finally:
            self.cpu[what] += time.thread_time() - started

    def _write(self, plan: BatchPlan) -> None:
        self.counts.record(plan.dead_letters)
        self.applier.write(plan)

    async def settle(self, plan: BatchPlan) -> None:
        """After a successful write: mirrors' applied offsets follow Redis."""
        await self._on(self._planner, self.applier.settle, plan)

    async def discard(self, *plans: BatchPlan | None) -> None:
        """Plans that will not be written as computed: drop the mirrors they changed."""
        for plan in plans:
            await asyncio.shield(self._on(self._planner, self.applier.discard, plan))

    async def forget(self, partitions: set[TopicPartition] | None) -> int:
        """Drop mirrors of tenants of these partitions (all when None)."""
        return await self._on(self._planner, self.applier.forget, partitions)

    # ---- with retries -------------------------------------------------------------------------

    async def plan_until_done(self, records: list[Record], *, stopping: Callable[[], bool]) -> BatchPlan | None:
        """`plan`, retried through outages; None when the worker started stopping first."""
        delay = self.backoff[0]
        while True:
            try:
                return await self.plan(records)
            except Outage as e:
                self.on_outage(e)
                if stopping():
                    return None
                self.retrying.failed(f"a batch of {len(records)} records not planned: {e}")
                await self._wait(delay)
                delay = min(delay * 2, self.backoff[1])

    async def process(self, records: list[Record], *, stopping: Callable[[], bool],
                      plan: BatchPlan | None = None) -> BatchPlan | None:
        """Plan (unless given) and write one batch, redoing it from the mirrors' reload through outages;
        None when the worker started stopping before the batch could be written."""
        delay = self.backoff[0]
        while True:
            if plan is None:
                plan = await self.plan_until_done(records, stopping=stopping)
                if plan is None:
                    return None
            try:
                await self.write(plan)
            except StateBehind:            # Redis lost writes: the caller resumes from what it holds
                await self.discard(plan)
                raise
            except Outage as e:
                self.on_outage(e)
                await self.discard(plan)
                plan = None
                if stopping():
                    self.log.warning("stopping with a batch of %d records not written (%s); it will be "
                                     "redelivered", len(records), e)
                    return None
                if isinstance(e, GenerationChanged):        # a replay cut over: plan again at once, from
                    self.log.info("%s; planning the batch of %d records again", e, len(records))  # the new one
                    continue
                self.retrying.failed(f"a batch of {len(records)} records not written: {e}")
                await self._wait(delay)
                delay = min(delay * 2, self.backoff[1])
                continue
            except BaseException:
                await self.discard(plan)
                raise
            await self.settle(plan)
            self._written()
            return plan

    async def process_overlapped(self, previous: tuple[list[Record], BatchPlan], records: list[Record], *,
                                 stopping: Callable[[], bool]) -> tuple[BatchPlan | None, BatchPlan | None]:
        """Write the previous batch while planning the next one. Returns (previous plan as written, or None
        when stopping before it was; next batch's plan, or None when it must be planned again)."""
        prev_records, prev_plan = previous
        writing = asyncio.ensure_future(self.write(prev_plan))
        try:
            plan: BatchPlan | None = await self.plan(records)
        except Outage as e:
            self.on_outage(e)
            plan = None                                # plan() already dropped what it touched
        except BaseException:
            await asyncio.gather(writing, return_exceptions=True)
            raise
        try:
            await writing
        except StateBehind:
            await self.discard(prev_plan, plan)
            raise
        except Outage as e:
            self.on_outage(e)
            self.retrying.failed(f"a batch of {len(prev_records)} records not written, redoing it: {e}")
            await self.discard(prev_plan, plan)        # the next plan was built on the failed one
            return await self.process(prev_records, stopping=stopping), None
        except BaseException:
            await self.discard(prev_plan, plan)
            raise
        await self.settle(prev_plan)
        self._written()
        return prev_plan, plan

    async def _wait(self, delay: float) -> None:
        self.waits.append(delay)
        await asyncio.sleep(delay)

    def _written(self) -> None:
        self.retrying.ok()

    def close(self, *, wait: bool = True) -> None:
        """Stop the threads; `wait=False` when a cancelled loop may have left a step running (it ends on
        its own; what it writes is safe, see workers/ingest.py) and the mirrors are left to the process end."""
        self._writer.shutdown(wait=wait, cancel_futures=not wait)
        self._planner.shutdown(wait=wait, cancel_futures=not wait)
