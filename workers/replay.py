"""`keel replay`: rebuild tenants from their partition of `keel.<cartridge>.events` without downtime.

For each tenant: claim a new (shadow) generation (workers/replay_state.py), read the tenant's partition from
its first offset (workers/replay_scan.py, no consumer group), apply its records with the cartridge's handlers
on an in-memory mirror (workers/replay_build.py) and bulk-load each tenant's events into the shadow in big
steps, each with the last offset scanned (RedisStore.load_generation: plain pipelined commands, one MULTI/EXEC
per step, no APPLY script and no reads, since nobody reads the shadow before the cutover; the result is what
APPLY would have written). Readers and the live worker keep using the current generation meanwhile. At the
partition's end, `switch_when_caught_up` cuts over atomically if the shadow has applied at least as far as the
live generation (else read further, load it and try again); then the old generation is dropped.

The live worker's writes are strict (GenerationChanged): a batch it planned on the old generation is not
written into the new one; it reloads the tenant from the new generation, where records up to the replay's
offset count as applied, and plans again. With `--all`, every tenant keyed in a partition is rebuilt in one
scan of it. Interrupted (Ctrl-C: the shadow is dropped at once; kill -9: by the next run) the served
generation is untouched.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from keel.cartridge import Cartridge
from keel.config import Settings
from keel.connect import open_redis_store
from keel.envelope import TENANT
from keel.errors import KeelError, StoreUnavailable, UsageError
from keel.kafka import KafkaUnavailable, describe_group
from keel.keystore_pg import privacy_of
from keel.store.base import EventWrites
from keel.store.redis import BulkLoader
from keel.store.redis.layout import LAYOUT_VERSION, namespace_layout, stamp_layout
from keel.wire import events_topic, group_id

from .collector import gc_young_threshold
from .offboarded import OffboardedSet, drop_tenant_keys
from .replay_build import PartitionBuild
from .replay_progress import Progress
from .replay_scan import PartitionScan, end_offsets, partition_count, tenant_partition
from .replay_state import ReplayState

T = TypeVar("T")
log = logging.getLogger("keel.replay")
HEARTBEAT_S = 5.0
LOADS_AHEAD = 2             # batches handed to the writer thread and not done, at most
IN_FLIGHT = 4               # tenants whose last steps may still be executing while the replay goes on


@dataclass(frozen=True)
class ReplayOptions:
    """Tuning of `keel replay` (flags)."""
    batch: int = 5000               # events per step loaded into the shadow generation
    fetch: int = 20_000             # records per Kafka fetch
    retry_for_s: float = 120.0      # how long a Kafka or Redis outage is retried before giving up
    max_switch_tries: int = 100


@dataclass
class TenantResult:
    """One tenant's replay."""
    tenant: str
    partition: int
    old_gen: int
    new_gen: int
    applied: int = 0
    skipped: int = 0
    duplicates: int = 0
    global_notes: int = 0
    dropped_keys: int = 0
    switched: bool = False


@dataclass
class ReplayReport:
    cartridge: str
    topic: str
    results: list[TenantResult] = field(default_factory=list)
    scanned: int = 0
    seconds: float = 0.0
    every: bool = False             # every tenant of the topic (--all): no line per tenant

    @property
    def applied(self) -> int:
        return sum(r.applied for r in self.results)

    @property
    def skipped(self) -> int:
        return sum(r.skipped for r in self.results)

    def summary(self) -> str:
        """One line (tenants, records, seconds, records/s, events); with named tenants, one more per tenant."""
        rate = self.scanned / self.seconds if self.seconds > 0 else 0.0
        head = (f"replayed {self.cartridge} from {self.topic}: {len(self.results):,} tenant(s) switched, "
                f"{self.scanned:,} record(s) scanned in {self.seconds:.1f}s, {rate:,.0f} records/s; "
                f"{self.applied:,} event(s) applied, {self.skipped:,} skipped (rejected or handler failed; "
                f"already dead-lettered), {sum(r.duplicates for r in self.results):,} duplicate(s)")
        if self.every:
            return head
        lines = [head]
        for r in self.results[:20]:
            lines.append(f"  {r.tenant}: partition {r.partition}, generation {r.old_gen} -> {r.new_gen}"
                         f" (switched), {r.applied:,} applied, "
                         f"{r.skipped:,} skipped, old generation dropped ({r.dropped_keys:,} keys)")
        if len(self.results) > 20:
            lines.append(f"  … {len(self.results) - 20} more tenant(s)")
        return "\n".join(lines)


def replay(cartridge: Cartridge, settings: Settings, *, tenants: list[str] | None,
           options: ReplayOptions | None = None, progress: Progress | None = None) -> ReplayReport:
    """Rebuild `tenants` (None: every tenant keyed in the topic) and cut each over; returns the report."""
    if not settings.redis_url:
        raise UsageError("replay writes to Redis: pass --redis URL or set KEEL_REDIS_URL")
    for t in tenants or ():
        if not TENANT.match(t):
            raise UsageError(f"bad tenant {t!r}: use [A-Za-z0-9][A-Za-z0-9._-]{{0,63}}")
    options = options or ReplayOptions()
    replayer = Replayer(cartridge, settings, options, progress or Progress(f"replay {cartridge.name}", quiet=True))
    try:
        if namespace_layout(replayer.store.client, cartridge.name) != LAYOUT_VERSION:
            _check_layout_change(cartridge, settings, tenants)
        report = asyncio.run(replayer.run(tenants))
        if tenants is None and all(r.switched for r in report.results):
            stamp_layout(replayer.store.client, cartridge.name)     # every tenant is in this Keel's layout
        return report
    finally:
        replayer.close()


def _check_layout_change(cartridge: Cartridge, settings: Settings, tenants: list[str] | None) -> None:
    """A namespace in an old key layout is rewritten whole, while nothing else writes (a worker of an older Keel
    would go on writing the old layout into the generations the replay replaces), so the worker group must be
    empty."""
    if tenants is not None:
        raise UsageError(f"namespace {cartridge.name!r} is in an old Redis key layout: rewrite every tenant with "
                         f"`keel replay <cartridge folder> --all` (a replay of some tenants would leave a mix)")
    group = asyncio.run(describe_group(settings.kafka_bootstrap, group_id(cartridge.name), events_topic(cartridge.name)))
    if group.members:
        raise UsageError(f"the worker group {group_id(cartridge.name)} has {len(group.members)} member(s): stop the "
                         f"workers (and tools servers) of {cartridge.name} before rewriting its Redis key layout, "
                         f"then start them again once the replay has stamped the namespace")


class Replayer:
    """One `keel replay` run over one cartridge."""

    def __init__(self, cartridge: Cartridge, settings: Settings, options: ReplayOptions, progress: Progress) -> None:
        self.cartridge = cartridge
        self.settings = settings
        self.options = options
        self.progress = progress
        self.topic = events_topic(cartridge.name)
        self.privacy = privacy_of(cartridge, settings)      # sealed personal fields: decrypted, or the mask
        self.store = open_redis_store(cartridge, settings, upgrading_layout=True)
        self.state = ReplayState(self.store)
        self.report = ReplayReport(cartridge.name, self.topic)
        self.claimed: dict[str, TenantResult] = {}          # shadows written and not switched yet
        self.loaders: dict[str, BulkLoader] = {}             # the claimed shadows' writers
        self._in_flight: list[BulkLoader] = []               # loaders whose last steps may still be executing
        self._planner = ThreadPoolExecutor(1, thread_name_prefix="keel-replay-plan")
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="keel-replay-write")
        self._beat = ThreadPoolExecutor(1, thread_name_prefix="keel-replay-heartbeat")
        self._beating: Future[None] | None = None
        self._heartbeat = 0.0
        self._total = 0                                      # records of the partitions to read (the bar's total)
        self._planned: dict[int, int] = {}                   # their end offsets when the run began

    async def run(self, tenants: list[str] | None) -> ReplayReport:
        started = time.monotonic()
        self.report.every = tenants is None
        self.offboarded = await self._run(self._writer, OffboardedSet(self.store).all)
        for t in tenants or ():
            if t in self.offboarded:
                raise UsageError(f"tenant {t!r} was offboarded at {self.offboarded[t].get('at')} (keel offboard): "
                                 f"there is nothing to rebuild")
        bootstrap = self.settings.kafka_bootstrap
        partitions = await self._retry("read topic metadata", partition_count, bootstrap, self.topic)
        if tenants is None:
            plan: dict[int, set[str] | None] = {p: None for p in range(partitions)}
        else:
            plan = {}
            for t in tenants:
                wanted = plan.setdefault(tenant_partition(t, partitions), set())
                assert wanted is not None
                wanted.add(t)
        self._planned = await self._retry("read the end offsets", end_offsets, bootstrap, self.topic, sorted(plan))
        self._total = sum(self._planned.values())
        threshold = gc.get_threshold()
        # the mirror grows by millions of objects, all long-lived (frozen after each fetch); a fetch's records
        # live until projected, so a young collection waits for a fetch's worth (as the worker's batch)
        gc.set_threshold(gc_young_threshold(self.options.fetch), 50, 1000)
        try:
            for rank, partition in enumerate(sorted(plan), 1):
                self.progress.partition = (partition, rank, len(plan))
                await self._partition(partition, plan[partition])
        finally:
            self.report.seconds = time.monotonic() - started
            self.progress.end()
            await asyncio.shield(self._run(self._writer, self._abandon))
            gc.unfreeze()
            gc.set_threshold(*threshold)
        return self.report

    # ---- one partition ----------------------------------------------------------------------------

    async def _partition(self, partition: int, wanted: set[str] | None) -> None:
        scan = PartitionScan(self.settings.kafka_bootstrap, self.topic, partition, max_records=self.options.fetch)
        gone = self.offboarded      # offboarded tenants are skipped (workers refuse their records)
        build = PartitionBuild(self.cartridge, (lambda t: t in wanted) if wanted is not None else
                               (lambda t: TENANT.match(t) is not None and t not in gone),
                               allow_global_notes=self.settings.allow_global_notes,
                               reveal=None if self.privacy is None else self.privacy.reveal_line,
                               prefetch_keys=None if self.privacy is None else self.privacy.prefetch)
        for t in sorted(wanted or ()):
            build.add_tenant(t)
            await self._run(self._writer, self._claim, t, partition)
        await self._retry("start the replay consumer", scan.start)
        try:
            await self._scan(scan, build, partition, explicit=wanted is not None)
        finally:
            await scan.stop()

    async def _scan(self, scan: PartitionScan, build: PartitionBuild, partition: int, *, explicit: bool) -> None:
        end = await self._retry("read the end offset", scan.end)
        self._total += end - self._planned.pop(partition, 0)
        position: int | None = None             # last offset scanned
        committed: int | None = None            # last offset committed to the shadows
        writing: list[asyncio.Future[None]] = []     # loads submitted to the writer thread, oldest first
        tries = 0
        while True:
            caught_up = end == 0 or (position is not None and position + 1 >= end)
            if not caught_up:
                records = await self._retry("fetch", scan.fetch)
                if records:
                    await self._run(self._planner, build.feed, records)
                    gc.freeze()                 # what the mirror holds now is never garbage: stop scanning it
                    position = records[-1].offset
                    self.report.scanned += len(records)
                    self._show(build)
                    caught_up = position + 1 >= end
            if build.pending >= self.options.batch or (caught_up and position != committed):
                steps = build.take()
                writing.append(asyncio.ensure_future(self._run(self._writer, self._load, steps, partition,
                                                               position)))
                committed = position
                while len(writing) > LOADS_AHEAD:     # project further while Redis runs the loaded steps
                    await writing.pop(0)
            if not caught_up:
                continue
            while writing:
                await writing.pop(0)
            if tries == 0 and explicit:         # (with --all the progress line says which partition)
                self.progress.note(f"partition {partition}: loaded into the shadow up to offset {end:,} "
                                   f"({time.monotonic() - self.progress.started:.1f}s); cutting over")
                self._check_found(build, partition)
            if await self._run(self._writer, self._switch_all, build, partition):
                return
            tries += 1
            if tries > self.options.max_switch_tries:
                raise KeelError(f"partition {partition}: the live worker kept getting ahead of the replay; "
                                f"{len(build.tenants)} tenant(s) not switched")
            new_end = await self._retry("read the end offset", scan.end)
            self._total += new_end - end
            if new_end == end:
                await asyncio.sleep(0.2)
            end = new_end

    def _show(self, build: PartitionBuild) -> None:
        applied = self.report.applied + sum(p.applied for p in build.tenants.values())
        self.progress.update(self.report.scanned, self._total, applied)

    def _check_found(self, build: PartitionBuild, partition: int) -> None:
        for tenant, p in build.tenants.items():
            if p.applied + p.skipped + p.duplicates == 0:
                raise UsageError(f"no records of tenant {tenant!r} in partition {partition} of {self.topic}; "
                                 f"nothing to replay (check the tenant name)")

    # ---- Redis side (the writer thread) ----------------------------------------------------------

    def _claim(self, tenant: str, partition: int) -> TenantResult:
        result = self.claimed.get(tenant)
        if result is not None:
            return result
        dropped = self.state.recover(tenant)
        if dropped:
            self.progress.note(f"{tenant}: dropped {dropped:,} key(s) left by an interrupted replay")
        old = self.store.current_generation(tenant)
        new = self.store.new_generation(tenant)
        self.state.put(tenant, new, old)
        result = self.claimed[tenant] = TenantResult(tenant, partition, old, new)
        self.loaders[tenant] = self._retry_sync("start loading the shadow generation", self.store.load_generation,
                                                tenant, new)
        return result

    def _load(self, steps: dict[str, list[EventWrites]], partition: int, position: int | None) -> None:
        """Each tenant's new events into its shadow, in steps of at most `batch` events (the last one carries
        the offset); Redis executes them while the next records are projected and encoded."""
        pos = None if position is None else (self.topic, partition, position)
        size = self.options.batch
        for tenant, events in steps.items():
            self._claim(tenant, partition)
            loader = self.loaders[tenant]
            starts = range(0, max(len(events), 1), size)
            for start in starts:        # each step sent once encoded: Redis runs it while the next is encoded
                loader.add(events[start:start + size], pos if start == starts[-1] else None)
                self._retry_sync("load the shadow generation", loader.flush, False)
            if loader not in self._in_flight:
                self._in_flight.append(loader)
            while len(self._in_flight) > IN_FLIGHT:             # each holds a connection meanwhile
                self._retry_sync("load the shadow generation", self._in_flight.pop(0).flush)
        now = time.monotonic()
        if now - self._heartbeat >= HEARTBEAT_S and (self._beating is None or self._beating.done()):
            self._heartbeat = now           # in a thread of its own: Redis answers once it ran the steps
            claims = [(t, self.claimed[t].new_gen, self.claimed[t].old_gen) for t in steps]
            self._beating = self._beat.submit(self._refresh, claims)

    def _heartbeat_done(self) -> None:
        """Before a marker is deleted: no refresh may write it again afterwards."""
        if self._beating is not None:
            self._beating.result()
            self._beating = None

    def _refresh(self, claims: list[tuple[str, int, int]]) -> None:
        try:
            for tenant, new, old in claims:
                self.state.put(tenant, new, old)
        except StoreUnavailable as e:
            log.warning("could not refresh the replay marker: %s", e)

    def _switch_all(self, build: PartitionBuild, partition: int) -> bool:
        """Try to cut every unswitched tenant of the partition over; True when none is left."""
        self._heartbeat_done()
        for tenant in sorted(build.tenants):
            self._retry_sync("load the shadow generation", self.loaders[tenant].flush)
        self._in_flight.clear()
        finishing: list[Future[None]] = []      # switched tenants whose mirror the planner thread is freeing
        try:
            self._switch_each(build, partition, finishing)
        finally:
            for f in finishing:
                f.result()
        return not build.tenants

    def _switch_each(self, build: PartitionBuild, partition: int, finishing: list[Future[None]]) -> None:
        for tenant in sorted(build.tenants):
            receipt = build.projector.offboarded.get(tenant)
            if receipt is not None:         # its keel.offboarded receipt is in the log: record it, keep nothing
                self._forget(build, tenant, receipt, finishing)
                continue
            r = self.claimed[tenant]
            outcome = self._retry_sync("switch generations", self.store.switch_when_caught_up, tenant, r.old_gen,
                                       r.new_gen, [(self.topic, partition)])
            if outcome is False:
                raise KeelError(f"tenant {tenant!r}: the current generation is no longer {r.old_gen} (another "
                                f"replay cut over meanwhile); the shadow generation {r.new_gen} is dropped")
            if outcome is not True:
                continue                                    # lagging: the live worker is ahead, read further
            p = build.tenants[tenant]
            r.applied, r.skipped, r.duplicates, r.global_notes = p.applied, p.skipped, p.duplicates, p.global_notes
            r.switched = True
            del self.claimed[tenant]
            self.loaders.pop(tenant).close()
            # its mirror is freed in the planner thread (idle now) while Redis drops the old generation
            finishing.append(self._planner.submit(build.finish, tenant))
            self.report.results.append(r)
            r.dropped_keys = self._retry_sync("drop the old generation", self.store.drop_generation, tenant,
                                              r.old_gen)
            self.state.clear(tenant)
            self.progress.switched(None if self.report.every else
                                   f"{tenant}: switched generation {r.old_gen} -> {r.new_gen} "
                                   f"({r.applied:,} events); old generation dropped")

    def _forget(self, build: PartitionBuild, tenant: str, receipt: dict[str, Any],
                finishing: list[Future[None]]) -> None:
        """A tenant whose offboarding receipt the log holds (the offboarded set lost with Redis): recorded in the
        set again, and every key of it dropped, the shadow included."""
        self.claimed.pop(tenant, None)
        loader = self.loaders.pop(tenant, None)
        if loader is not None:
            loader.abort()
        OffboardedSet(self.store).put(tenant, {**receipt, "produced": True, "dropped": False})
        drop_tenant_keys(self.store, tenant)
        OffboardedSet(self.store).put(tenant, {**receipt, "produced": True, "dropped": True})
        finishing.append(self._planner.submit(build.finish, tenant))
        self.progress.note(f"{tenant}: offboarded at {receipt['at']} (receipt {receipt['receipt']} in the log); "
                           f"its keys dropped, not rebuilt")

    def _abandon(self) -> None:
        """After an error or Ctrl-C: drop the shadows not switched (the served generations never changed)."""
        self._heartbeat_done()
        self._in_flight.clear()
        for tenant, r in list(self.claimed.items()):
            loader = self.loaders.pop(tenant, None)
            try:
                if loader is not None:
                    loader.abort()
                self.store.drop_generation(tenant, r.new_gen)
                self.state.clear(tenant)
            except KeelError as e:
                log.warning("could not drop the shadow generation %d of tenant %r (%s); the next replay of "
                            "the tenant drops it", r.new_gen, tenant, e)
            del self.claimed[tenant]

    # ---- plumbing ---------------------------------------------------------------------------------

    @staticmethod
    async def _run(pool: ThreadPoolExecutor, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    async def _retry(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        waits = self._waits()
        while True:
            try:
                return await fn(*args)
            except (KafkaUnavailable, StoreUnavailable) as e:
                await asyncio.sleep(self._wait_or_raise(waits, what, e))

    def _retry_sync(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        waits = self._waits()
        while True:
            try:
                return fn(*args)
            except StoreUnavailable as e:
                time.sleep(self._wait_or_raise(waits, what, e))

    def _waits(self) -> Iterator[float]:
        """The waits between tries of one operation: 0.2 s doubling up to 5 s, for `retry_for_s` in all."""
        deadline = time.monotonic() + self.options.retry_for_s
        delay = 0.2
        while time.monotonic() + delay <= deadline:
            yield delay
            delay = min(delay * 2, 5.0)

    def _wait_or_raise(self, waits: Iterator[float], what: str, error: KeelError) -> float:
        """The next wait after `error` (said on the progress line), or `error` raised once time is up."""
        delay = next(waits, None)
        if delay is None:
            raise error
        self.progress.note(f"{what} failed, retrying in {delay:.1f}s: {error}")
        return delay

    def close(self) -> None:
        self._planner.shutdown(wait=True)
        self._writer.shutdown(wait=True)
        self._beat.shutdown(wait=True)
        self.store.close()
