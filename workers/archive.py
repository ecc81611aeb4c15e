"""`keel archive <cartridge>`: the mover of the cold tier (keel/cold_pg.py, keel/store/redis/cold.py).

A process of its own, not a task of the workers: moving is the only work the cold tier adds, and it reads
PostgreSQL and Redis at its own pace; in a separate process it never takes CPU from a worker's batch (the
events/s goal), a PostgreSQL outage pauses it alone (workers and reads of the present go on), and it runs
where and when an operator wants (a sidecar looping, or `--once` from cron).

Each pass, per tenant of the namespace (its current generation): the closed segments still in Redis whose newest
valid time is older than `cold_after` (the namespace's override, else the cartridge's `history.cold_after`), and
when Redis's `used_memory` is over `--budget`, the oldest others until the excess is covered. Each batch is
copied to PostgreSQL in one transaction, then deleted from Redis by one Lua step per segment that checks its
content is unchanged (cold.move): a kill -9 at any point leaves every segment in Redis or in PostgreSQL (or
both), and the next pass finishes. Then, unless `cold_after` is `never` (and Redis is within the budget), each
tenant's change log: its oldest chunks, all but the newest `keep_chunks` (default cold.KEEP_CHUNKS, 256; a chunk
is one commit step's writes, up to 256), copied and then trimmed from the list's head in one atomic step with a
marker (cold.move_changes); positions never change, and pages below Redis's part read PostgreSQL first. By count,
not age: the log is ordered by recorded time, and a history loaded today is all recorded today, while the pages
read most are the newest; the count bounds each tenant's log in Redis. Rows of generations that no longer exist in Redis (a drop interrupted
between its two steps) are deleted. What the pass saw and its last error go to `keel:{<ns>}:cold`, read by
`keel status`.
"""
from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from keel.cartridge import Cartridge
from keel.config import Settings
from keel.connect import open_redis_store
from keel.errors import ServiceUnavailable, UsageError
from keel.store.redis import RedisStore
from keel.store.redis.cold import KEEP_CHUNKS, Candidate, candidates, move, move_changes, settings_key
from keel.store.redis.keys import gen_keys
from keel.times import format_time, now_micros, parse_duration

log = logging.getLogger("keel.archive")
BATCH = 200                 # segments per PostgreSQL transaction and Redis round trip


@dataclass
class ArchiveOptions:
    once: bool = False
    interval_s: float = 60.0
    batch: int = BATCH
    budget: int | None = None          # Redis used_memory in bytes past which the oldest segments move too
    keep_chunks: int = KEEP_CHUNKS     # the change log's newest chunks that stay in Redis whatever their age
    quiet: bool = False


@dataclass
class PassReport:
    tenants: int = 0
    moved: int = 0
    moved_bytes: int = 0
    waiting: int = 0                   # due at the start of the pass
    waiting_bytes: int = 0
    hot_closed: int = 0                # closed segments still in Redis after the pass
    hot_closed_bytes: int = 0
    orphans: int = 0                   # rows deleted for generations gone from Redis
    chunks_moved: int = 0              # change-log chunks moved
    chunks_moved_bytes: int = 0
    cold_after: str = "never"
    errors: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"moved {self.moved:,} closed segment(s) ({self.moved_bytes:,} bytes) of {self.tenants:,} tenant(s) "
                f"to the cold tier; {self.hot_closed:,} closed segment(s) ({self.hot_closed_bytes:,} bytes) stay "
                f"in Redis (cold_after {self.cold_after}); {self.chunks_moved:,} change-log chunk(s) "
                f"({self.chunks_moved_bytes:,} bytes) moved"
                + (f"; {self.orphans:,} orphaned row(s) deleted" if self.orphans else ""))


def policy(cartridge: Cartridge, store: RedisStore) -> tuple[str, int | None]:
    """The namespace's `cold_after` (its override in Redis, else the cartridge's) as text and micros."""
    with store._guard("cold policy"):
        override = store.client.hget(settings_key(store.namespace), "after")
    text = str(override) if override else cartridge.spec.history.cold_after
    return text, parse_duration(text)


def set_policy(store: RedisStore, after: str | None) -> None:
    """Set (a duration or `never`) or clear (None: the cartridge's again) the namespace's cold_after."""
    key = settings_key(store.namespace)
    with store._guard("cold policy"):
        if after is None:
            store.client.hdel(key, "after")
        else:
            parse_duration(after)                        # ValueError naming the forms
            store.client.hset(key, "after", after)


def open_with_cold_tier(cartridge: Cartridge, settings: Settings) -> RedisStore:
    """The cartridge's store with its cold tier; a missing DSN is a usage error."""
    if not settings.cold_dsn:
        raise UsageError("no cold tier: pass --cold-dsn DSN or set KEEL_COLD_DSN (a PostgreSQL database)")
    return open_redis_store(cartridge, settings)


class Mover:
    """Passes over a namespace; `run` loops until stopped, pausing on outages and resuming unaided."""

    def __init__(self, cartridge: Cartridge, store: RedisStore, options: ArchiveOptions) -> None:
        self.cartridge = cartridge
        self.store = store
        self.options = options
        self.stopping = threading.Event()
        self._last_note = 0.0

    def _note(self, text: str, force: bool = False) -> None:
        now = time.monotonic()
        if self.options.quiet or (not force and now - self._last_note < 2.0):
            return
        self._last_note = now
        print(f"archive {self.cartridge.name}: {text}", file=sys.stderr, flush=True)

    def pass_once(self) -> PassReport:
        store = self.store
        text, after = policy(self.cartridge, store)
        report = PassReport(cold_after=text)
        cutoff = None if after is None else now_micros() - after
        tenants = store.tenants()
        report.tenants = len(tenants)
        plan: list[tuple[str, int, list[Candidate]]] = []
        rest: list[tuple[str, int, Candidate]] = []
        for tenant in tenants:
            gen = store.current_generation(tenant)
            found = candidates(store, tenant, gen)
            due = [c for c in found if cutoff is not None and c.newest < cutoff]
            plan.append((tenant, gen, due))
            picked = {(c.entity, c.n) for c in due}
            rest += ((tenant, gen, c) for c in found if (c.entity, c.n) not in picked)
            report.hot_closed += len(found)
            report.hot_closed_bytes += sum(c.size for c in found)
        over = self._over_budget()
        over_budget = over > 0
        if over > 0:                                   # the oldest of the others, until the excess is covered
            extra: dict[tuple[str, int], list[Candidate]] = {}
            for tenant, gen, c in sorted(rest, key=lambda x: x[2].newest):
                if over <= 0:
                    break
                extra.setdefault((tenant, gen), []).append(c)
                over -= c.size
            plan += ((t, g, cs) for (t, g), cs in extra.items())
        report.waiting = sum(len(cs) for _, _, cs in plan)
        report.waiting_bytes = sum(c.size for _, _, cs in plan for c in cs)
        self._record({"waiting": report.waiting, "waiting_bytes": report.waiting_bytes})
        if report.waiting:
            self._note(f"{report.waiting:,} closed segment(s) ({report.waiting_bytes:,} bytes) to move", force=True)
        for tenant, gen, due in plan:
            for start in range(0, len(due), self.options.batch):
                if self.stopping.is_set():
                    break
                moved, nbytes = move(store, tenant, gen, due[start:start + self.options.batch])
                report.moved += moved
                report.moved_bytes += nbytes
                self._note(f"{report.moved:,}/{report.waiting:,} moved ({report.moved_bytes:,} bytes)")
        if cutoff is not None or over_budget:
            for tenant in tenants:                     # the change log's old chunks (cold.move_changes)
                if self.stopping.is_set():
                    break
                n, nbytes = move_changes(store, tenant, store.current_generation(tenant),
                                         keep=self.options.keep_chunks, batch=self.options.batch,
                                         stop=self.stopping)
                report.chunks_moved += n
                report.chunks_moved_bytes += nbytes
        report.hot_closed -= report.moved
        report.hot_closed_bytes -= report.moved_bytes
        report.orphans = self._sweep()
        self._record({"last_pass_at": format_time(now_micros()), "moved_last_pass": report.moved,
                      "waiting": report.waiting - report.moved,
                      "waiting_bytes": report.waiting_bytes - report.moved_bytes,
                      "hot_closed": report.hot_closed, "hot_closed_bytes": report.hot_closed_bytes},
                     incr={"moved_total": report.moved, "moved_bytes_total": report.moved_bytes,
                           "chunks_moved_total": report.chunks_moved,
                           "chunks_moved_bytes_total": report.chunks_moved_bytes})
        return report

    def _over_budget(self) -> int:
        if self.options.budget is None:
            return 0
        with self.store._guard("memory of the instance"):
            used = int(self.store.client.info("memory")["used_memory"])
        return used - self.options.budget

    def _sweep(self) -> int:
        """Delete rows of generations whose Redis data is gone (no entity set, no cold hash): nobody can read
        them, and a drop interrupted between its PostgreSQL and Redis steps leaves such rows."""
        store = self.store
        cold = store.cold
        assert cold is not None
        held = cold.generations(store.namespace)
        deleted = 0
        for tenant, gen in held:
            d = store.data_prefix(tenant, gen)
            with store._guard("cold sweep", tenant):
                alive = int(store.client.exists(gen_keys(d).first, gen_keys(d).cold))
            if not alive:
                deleted += cold.drop_generation(store.namespace, tenant, gen)
        return deleted

    def _record(self, fields: dict[str, Any], incr: dict[str, int] | None = None) -> None:
        key = settings_key(self.store.namespace)
        with self.store._guard("cold report"):
            pipe = self.store.client.pipeline(transaction=False)
            pipe.hset(key, mapping={k: str(v) for k, v in fields.items()})
            for k, v in (incr or {}).items():
                pipe.hincrby(key, k, v)
            pipe.execute()

    def record_error(self, error: BaseException) -> None:
        """The last move's error, for `keel status` (best effort: Redis may be the service that failed)."""
        try:
            self._record({"error": str(error).splitlines()[0][:500], "error_at": format_time(now_micros())})
        except ServiceUnavailable:
            pass

    def clear_error(self) -> None:
        with self.store._guard("cold report"):
            self.store.client.hdel(settings_key(self.store.namespace), "error", "error_at")

    def run(self) -> PassReport:
        """Passes every `interval_s` (one with `once`); an outage (PostgreSQL or Redis) is logged, recorded and
        waited out. With `once`, the outage is raised (exit 3) after recording it."""
        report = PassReport()
        while not self.stopping.is_set():
            try:
                report = self.pass_once()
                self.clear_error()
                if not self.options.quiet:
                    self._note(report.summary(), force=True)
            except ServiceUnavailable as e:
                self.record_error(e)
                if self.options.once:
                    raise
                log.warning("cold tier move paused: %s", e)
            if self.options.once:
                break
            self.stopping.wait(self.options.interval_s)
        return report


def archive(cartridge: Cartridge, settings: Settings, options: ArchiveOptions) -> PassReport:
    """Run the mover of one cartridge's namespace (SIGTERM/SIGINT end it after the batch in flight)."""
    store = open_with_cold_tier(cartridge, settings)
    mover = Mover(cartridge, store, options)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, lambda *_: mover.stopping.set())
    try:
        return mover.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        store.close()


def status_of(store: Any, settings: Settings) -> dict[str, Any] | None:
    """The cold tier's part of `keel status`: the mover's last report, the cold rows and bytes in PostgreSQL,
    the cold segments Redis records; None for a namespace that has none of these and no cold tier."""
    with store._guard("cold report"):
        seen = store.client.hgetall(settings_key(store.namespace))
    cold = getattr(store, "cold", None)
    if not seen and cold is None:
        return None
    doc: dict[str, Any] = {"configured": cold is not None}
    for k in ("after", "waiting", "waiting_bytes", "hot_closed", "hot_closed_bytes", "moved_total",
              "moved_bytes_total", "chunks_moved_total", "chunks_moved_bytes_total", "last_pass_at", "error",
              "error_at"):
        if k in seen:
            doc[k] = int(seen[k]) if seen[k].lstrip("-").isdigit() else seen[k]
    if cold is not None:
        try:
            rows, text_bytes, disk_bytes = cold.sizes(store.namespace)
            doc.update(cold_rows=rows, cold_bytes=text_bytes, cold_disk_bytes=disk_bytes)
            chunks, text_bytes, disk_bytes = cold.change_sizes(store.namespace)
            doc.update(cold_chunks=chunks, cold_chunk_bytes=text_bytes, cold_chunk_disk_bytes=disk_bytes)
        except ServiceUnavailable as e:
            doc["cold_unavailable"] = str(e)
    return doc


__all__ = ["ArchiveOptions", "Mover", "PassReport", "archive", "open_with_cold_tier", "policy", "set_policy",
           "status_of"]
