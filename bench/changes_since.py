"""What changed since: the latency of one page of changes (`history` without an entity) on Redis.

    .venv/bin/python bench/changes_since.py [--events 100000] [--limit 100] [--calls 1000]
                                           [--rounds 2] [--redis URL]

One tenant of N finance-shaped events (bench/common.py; 400 debts, so about N x 6.7 writes) is projected by
the finance cartridge in process and committed to a fresh Redis namespace in steps of 1,000 events (the
worker's batch contract: each step's APPLY script also appends its writes to the tenant's change log,
keel/store/redis/changelog.py). Then `Tools.history(since=..., limit=L)` and `Tools.history(cursor=...,
limit=L)` are called in process at random places of the log, --rounds rounds interleaved, and the p50 / p99 of
each, the CPU microseconds per call of this process and of the Redis server (INFO cpu: on a shared server, every
client's; `--redis` a private redis-server for this run's alone) and the load average are printed next to the goal
(issue 27: p99 <= 5 ms for a page of 100 changes of a tenant with 100k events). Also printed: the change log's
Redis memory per entry and the writer's cost of encoding it (CPU microseconds per write, in process). The
namespace is dropped at the end.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import finance_events, lines

from keel import Projector, Tools, load_cartridge
from keel.changes import Cursor
from keel.embedded import replay_file
from keel.store.redis import RedisStore
from keel.store.redis.changelog import encode_copies
from keel.store.redis.keys import gen_keys
from keel.times import format_time
from workers.mirror import RecordingStore

TENANT = "tenant-00000"
GOAL_MS = 5.0


def build(store: RedisStore, n: int) -> int:
    """Project n events in process and commit them to `store` in steps of 1,000; returns the writes."""
    cartridge = load_cartridge(ROOT / "cartridges" / "finance")
    recording = RecordingStore()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events.jsonl"
        path.write_bytes(b"\n".join(lines(finance_events(n, 1, debts_per_tenant=400))) + b"\n")
        recording.recording = True
        report = replay_file(Projector(cartridge, recording), path)
    assert not report.rejected, report.rejected[:3]
    applied = recording.take()
    writes = 0
    for i in range(0, len(applied), 1000):
        step = [(w, event_id) for _, w, event_id in applied[i:i + 1000]]
        writes += sum(len(w) for w, _ in step)
        store.commit_batch(TENANT, step, None)
    return writes


def redis_cpu(client: Any) -> float:
    """The Redis server's CPU seconds so far (INFO cpu: every client's work, on a shared server)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def timed(calls: list, repeat: int, client: Any) -> tuple[float, float, float, float]:
    """(p50 ms, p99 ms, CPU µs per call of this process, of the Redis server) of the calls, in order, `repeat` of
    them."""
    samples = []
    cpu0, server0 = time.process_time(), redis_cpu(client)
    for i in range(repeat):
        t0 = time.perf_counter()
        calls[i % len(calls)]()
        samples.append((time.perf_counter() - t0) * 1000)
    cpu = (time.process_time() - cpu0) / repeat * 1e6
    server = (redis_cpu(client) - server0) / repeat * 1e6
    samples.sort()
    return samples[len(samples) // 2], samples[min(len(samples) - 1, int(len(samples) * 0.99))], cpu, server


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--redis", default=os.environ.get("KEEL_REDIS_URL"))
    args = ap.parse_args()
    if not args.redis:
        sys.exit("give --redis URL or set KEEL_REDIS_URL")
    probe = RedisStore.from_url(args.redis, namespace="probe")
    store = RedisStore(probe.client, namespace=f"bch{uuid.uuid4().hex[:10]}", owns_client=False)
    try:
        t0 = time.perf_counter()
        writes = build(store, args.events)
        print(f"tenant: {args.events} events, {writes} writes, "
              f"built in {time.perf_counter() - t0:.0f} s")
        tools = Tools(load_cartridge(ROOT / "cartridges" / "finance"), store, TENANT)
        whole = store.changes(TENANT, count=1)
        length, gen = whole.length, whole.generation
        rnd = random.Random(1)
        positions = [rnd.randrange(0, length - args.limit) for _ in range(200)]
        entries = [store.changes(TENANT, start=p, generation=gen, count=1).entries[0] for p in positions]
        cursors = [Cursor(gen, p + 1, e.assertion.recorded_at).text() for p, e in zip(positions, entries)]
        sinces = [e.assertion.recorded_at for e in entries]
        by_cursor = [lambda c=c: tools.history(cursor=c, limit=args.limit) for c in cursors]
        assert all(len(f()["changes"]) == args.limit for f in by_cursor[:5])
        since_text = [lambda s=s: tools.history(since=format_time(s), limit=args.limit) for s in sinces]
        for f in since_text[:3] + by_cursor[:3]:
            f()                                                 # warm: scripts loaded, caches filled
        rows = []
        for _ in range(args.rounds):                                        # rounds, interleaved
            for name, calls in (("cursor", by_cursor), ("since", since_text)):
                rows.append((name, *timed(calls, args.calls, probe.client), os.getloadavg()[0]))
        print(f"changes page of {args.limit} (log of {length} entries), in process, {args.calls} calls per round:")
        for name, p50, p99, cpu, server, load in rows:
            verdict = "ok" if p99 <= GOAL_MS else "OVER"
            print(f"  {name:6s} p50 {p50:6.2f} ms  p99 {p99:6.2f} ms  (goal <= {GOAL_MS} ms: {verdict})  "
                  f"CPU {cpu:6.0f} µs/call, Redis {server:6.0f} µs/call  (load {load:.1f})")
        used = int(probe.client.memory_usage(gen_keys(store.data_prefix(TENANT, gen)).changes) or 0)
        print(f"change log: {used / length:.0f} bytes of Redis memory per entry ({used / 2**20:.1f} MiB)")
        page = store.changes(TENANT, start=0, generation=gen, count=20_000).entries
        sample: list = []                   # the writes again as events: runs sharing evidence and recorded_at
        for e in page:
            a = e.assertion
            if sample and sample[-1][1] == (a.evidence, a.recorded_at):
                sample[-1][0].append((e.key, a))
            else:
                sample.append(([(e.key, a)], (a.evidence, a.recorded_at)))
        c0 = time.process_time()
        for _ in range(5):
            encode_copies(sample)
        print(f"writer: encoding the change log costs {(time.process_time() - c0) / 5 / len(page) * 1e6:.2f} "
              f"CPU µs per write (in process)")
    finally:
        store.drop_namespace()
        probe.close()



if __name__ == "__main__":
    main()
