"""Rebalance scenarios of several `keel worker` processes on one cartridge topic, shared by the CI tests
(tests/test_workers_rebalance.py, modest sizes) and the soak (`make soak`, scripts/soak.py: big backlogs,
random moments, many runs).

Each scenario publishes a backlog over many tenants, changes the group's membership while batches are
planned or being written (joins, a SIGKILL, a SIGTERM during a rebalance), then requires: lag 0, every
tenant's Redis digest equal to the embedded build, every worker still alive ends on SIGTERM within
`TERM_BOUND_S`, and no log says a worker hung.
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from common import finance_events

from keel.cartridge import load_cartridge
from support.workers import (
    WorkerProcess,
    committed,
    embedded_digests,
    keel,
    redis_digests,
    status,
    wait_until,
    write_jsonl,
)

TERM_BOUND_S = 15.0          # the worker's own promise (workers/ingest.py: SHUTDOWN_BUDGET_S + its watchdog)
SCENARIOS = ("join", "double_join", "kill", "term_during_rebalance")


@dataclass(frozen=True)
class Size:
    events: int
    tenants: int
    batch: int
    drain_timeout_s: float


CI = Size(events=12_000, tenants=36, batch=400, drain_timeout_s=300)


def interleaved_events(path: Path, n: int, tenants: int, seed: int) -> Path:
    """A finance stream in canonical form (recorded_at set, so the embedded build is the oracle), tenants
    interleaved round-robin, each tenant's events in generation order."""
    by_tenant: dict[str, list[dict]] = {}
    for e in finance_events(n, tenants, seed=seed):
        by_tenant.setdefault(e["tenant"], []).append({**e, "recorded_at": e["occurred_at"]})
    queues = [list(reversed(q)) for q in by_tenant.values()]
    out = []
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop())
    return write_jsonl(path, out)


class Group:
    """The worker processes of one scenario, each logging to its own file."""

    def __init__(self, folder: Path, env: dict[str, str], logs: Path, batch: int) -> None:
        self.folder, self.env, self.logs, self.batch = folder, env, logs, batch
        self.workers: list[WorkerProcess] = []

    def start(self) -> WorkerProcess:
        w = WorkerProcess([self.folder], self.env, self.logs / f"worker-{len(self.workers)}.log",
                          "--batch", str(self.batch), "--within", "0.1")
        self.workers.append(w)
        return w

    def alive(self) -> list[WorkerProcess]:
        return [w for w in self.workers if w.alive()]

    def texts(self) -> str:
        return "\n".join(f"--- {w.log.name} (alive: {w.alive()})\n{w.text()}" for w in self.workers)

    def kill_all(self) -> None:
        for w in self.workers:
            w.kill()


def _wait_progress(group: Group, before: int, at_least: int, total: int) -> None:
    """Until the group committed `at_least` more records than `before` (or everything)."""
    wait_until(lambda: committed(group.folder, group.env) >= min(before + at_least, total), 180,
               "the workers to make progress", interval=0.1, on_timeout=group.texts)


def run_scenario(kind: str, tmp: Path, env: dict[str, str], size: Size, seed: int,
                 log: Callable[[str], None] = lambda _: None) -> None:
    """Run one scenario end to end; raises AssertionError (with the workers' logs) when it fails."""
    rng = random.Random(seed)
    tmp.mkdir(parents=True, exist_ok=True)
    folder = _fresh_cartridge(tmp)
    events = interleaved_events(tmp / "load.jsonl", size.events, size.tenants, seed)
    keel("publish", str(folder), str(events), "--quiet", env=env, timeout=1800)
    log(f"{kind}: published {size.events} events over {size.tenants} tenants")
    group = Group(folder, env, tmp, size.batch)
    try:
        first = group.start()
        if kind == "double_join":
            group.start()
        _wait_progress(group, 0, rng.randrange(1, max(2, size.events // 10)), size.events)
        time.sleep(rng.uniform(0, 1.5))            # somewhere in a batch: planned, being written, or between
        if kind in ("join", "double_join"):
            group.start()
            time.sleep(rng.uniform(0, 3))
            group.start()                          # a second change while the first rebalance may still run
        elif kind == "kill":
            group.start()
            _wait_progress(group, committed(folder, env), rng.randrange(1, size.batch * 4), size.events)
            time.sleep(rng.uniform(0, 1))
            first.kill()
        elif kind == "term_during_rebalance":
            group.start()
            time.sleep(rng.uniform(0, 2))          # the join's rebalance is (probably) under way
            _terminate_within_bound(first, group)
        else:
            raise ValueError(f"unknown scenario {kind!r}")
        log(f"{kind}: membership changed; {len(group.alive())} worker(s) alive")
        _wait_drained(group, size)
        expected = embedded_digests(load_cartridge(folder), events)
        assert redis_digests(folder, env, expected) == expected, "Redis differs from the embedded build"
        for w in group.alive():
            _terminate_within_bound(w, group)
        text = group.texts()
        for bad in ("Traceback", "still being written", "watchdog"):
            assert bad not in text, f"{bad!r} in a worker's log:\n{text}"
    finally:
        group.kill_all()


def _fresh_cartridge(tmp: Path) -> Path:
    from support.workers import unique_cartridge
    return unique_cartridge(tmp, "finance", prefix="rb")


def _wait_drained(group: Group, size: Size) -> None:
    from keel.errors import KafkaUnavailable

    def done() -> bool:
        if not group.alive():
            raise AssertionError(f"every worker exited:\n{group.texts()}")
        try:
            doc = status(group.folder, group.env)
        except KafkaUnavailable:
            return False
        return sum(p["end"] for p in doc["partitions"]) >= size.events and doc["lag"] == 0
    wait_until(done, size.drain_timeout_s, f"lag 0 over {size.events} records", interval=0.5,
               on_timeout=group.texts)


def _terminate_within_bound(worker: WorkerProcess, group: Group) -> None:
    """SIGTERM; the worker must exit 0 (the bound is the worker's own: it ends itself by TERM_BOUND_S)."""
    started = time.monotonic()
    code = worker.terminate(timeout=TERM_BOUND_S + 10)
    took = time.monotonic() - started
    assert code == 0, f"exit {code} after SIGTERM ({took:.1f}s):\n{group.texts()}"
