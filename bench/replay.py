"""Replay benchmark: rebuild one big tenant with `keel replay` while a worker ingests other tenants live.

    .venv/bin/python bench/replay.py [--events 500000] [--others 20] [--other-events 100000] [--batch 5000]
        [--rounds N] [--private-redis] [--worker-batch N] [--commandstats]
    (quick run: --events 50000 --other-events 20000)

Needs KEEL_KAFKA_BOOTSTRAP and KEEL_REDIS_URL (or --kafka/--redis). On a fresh cartridge name (fresh topic and
Redis namespace): publishes the big tenant's finance-shaped events, starts a `keel worker`, publishes the other
tenants' events in the background (`keel publish`, another process), and replays the big tenant. Prints the
replay rate (events applied per second of the replay, goal >= 20,000 events/s) and the worker's live-ingest
rate during the replay (records its group committed per second over the replay's duration). `--rounds N` replays
the tenant N times in turn (the others are published during the first round only; `--other-events 0` publishes
none) and prints the median; `--private-redis` uses a redis-server of this run only (configured like
deploy/local/services), so that its CPU per event (printed) is the replay's alone; with it, `--commandstats`
prints the Redis commands of the last round per replayed event (INFO commandstats, reset before each round).
The namespace is written in Keel's one Redis key layout (segments, keel/store/redis/segment_store.py); its
layout stamp, set by the worker, is printed after the run.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import redis
from common import finance_events
from peers.compare import print_commandstats, private_redis

from keel.cartridge import load_cartridge
from keel.config import resolve
from keel.kafka import KafkaUnavailable, TopicSpec, group_offsets
from keel.store.redis import RedisStore
from keel.store.redis.keys import layout_key
from keel.wire import events_topic, group_id
from workers.publish import publish_file
from workers.replay import ReplayOptions, replay
from workers.replay_progress import Progress

GOAL = 20_000
BIG = "big-tenant"


def write_events(path: Path, n: int, tenants: int, rename: str | None = None) -> Path:
    with open(path, "w") as f:
        for e in finance_events(n, tenants, debts_per_tenant=1000 if tenants == 1 else 20):
            if rename:
                e["tenant"] = rename
                e["id"] = e["id"].replace("tenant-00000", rename)
            f.write(json.dumps(e) + "\n")
    return path


def committed(bootstrap: str, cartridge: str) -> int:
    try:
        offsets = asyncio.run(group_offsets(bootstrap, events_topic(cartridge), group_id(cartridge)))
    except KafkaUnavailable:            # a fresh broker has no group coordinator for a few seconds
        return 0
    return sum(p.committed or 0 for p in offsets)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=500_000, help="events of the replayed tenant")
    ap.add_argument("--others", type=int, default=20, help="tenants ingested live during the replay")
    ap.add_argument("--other-events", type=int, default=100_000, help="their events, published during the replay")
    ap.add_argument("--batch", type=int, default=5000, help="events per commit to the shadow generation")
    ap.add_argument("--kafka", default=os.environ.get("KEEL_KAFKA_BOOTSTRAP"))
    ap.add_argument("--redis", default=os.environ.get("KEEL_REDIS_URL"))
    ap.add_argument("--rounds", type=int, default=1, help="replays of the tenant, one after the other")
    ap.add_argument("--private-redis", action="store_true", help="use a redis-server of this run only")
    ap.add_argument("--worker-batch", type=int, help="the live worker's --batch (default: the worker's)")
    ap.add_argument("--commandstats", action="store_true", help="with --private-redis: the Redis commands of the "
                    "last round per replayed event")
    ap.add_argument("--keep", action="store_true", help="keep the Redis namespace afterwards")
    args = ap.parse_args()
    if not args.kafka or not (args.redis or args.private_redis):
        ap.error("needs --kafka and --redis (or KEEL_KAFKA_BOOTSTRAP / KEEL_REDIS_URL, or --private-redis)")
    if args.commandstats and not args.private_redis:
        ap.error("--commandstats resets the server's statistics: use it with --private-redis")
    work = Path(tempfile.mkdtemp(prefix="keel-bench-replay-"))
    redis_proc = None
    if args.private_redis:
        redis_proc, args.redis = private_redis(work)
    try:
        return run(args, work)
    finally:
        if redis_proc is not None:
            redis_proc.terminate()
            redis_proc.wait(60)
        shutil.rmtree(work, ignore_errors=True)


def redis_cpu(url: str) -> float:
    """Seconds of CPU the redis-server spent so far."""
    client = redis.Redis.from_url(url)
    info = client.info("cpu")
    client.close()
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def reset_commandstats(url: str) -> None:
    """Zero INFO commandstats, so that the next print counts one round only."""
    client = redis.Redis.from_url(url)
    client.config_resetstat()
    client.close()


def run(args: argparse.Namespace, work: Path) -> int:
    """Publish, build the served graph with a worker, replay `--rounds` times."""
    folder = work / "finance"
    shutil.copytree(ROOT / "cartridges" / "finance", folder)
    name = f"bench{uuid.uuid4().hex[:8]}"
    spec = (folder / "cartridge.yaml").read_text()
    (folder / "cartridge.yaml").write_text(spec.replace("name: finance", f"name: {name}", 1))
    cartridge = load_cartridge(folder)
    settings = resolve({"kafka": args.kafka, "redis": args.redis})
    env = {**os.environ, "KEEL_KAFKA_BOOTSTRAP": args.kafka, "KEEL_REDIS_URL": args.redis}

    big = write_events(work / "big.jsonl", args.events, 1, rename=BIG)
    others = write_events(work / "others.jsonl", args.other_events, args.others)
    t0 = time.monotonic()
    report = publish_file(cartridge, big, args.kafka, topics=TopicSpec())
    print(f"published {report.sent:,} events of {BIG} in {time.monotonic() - t0:.1f}s")

    batch = ["--batch", str(args.worker_batch)] if args.worker_batch else []
    worker = subprocess.Popen([sys.executable, "-m", "keel.cli", "worker", str(folder), "--quiet", "-l", "warn",
                               *batch],
                              env=env, cwd=ROOT, stdout=open(work / "worker.log", "wb"),  # noqa: SIM115
                              stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600          # the worker first ingests the big tenant (its served graph)
        while committed(args.kafka, name) < args.events and time.monotonic() < deadline:
            time.sleep(1.0)
        print(f"worker built {BIG} live in {time.monotonic() - t0:.1f}s (since publishing started)")
        before = committed(args.kafka, name)
        # a process of its own, like a product's: a thread here would take the replay's interpreter lock
        publisher = subprocess.Popen([sys.executable, "-m", "keel.cli", "publish", str(folder), str(others),
                                      "--quiet"], env=env, cwd=ROOT, stdout=subprocess.DEVNULL) \
            if args.other_events else None
        rates, cpus = [], []
        for i in range(args.rounds):
            if args.commandstats:
                reset_commandstats(args.redis)
            started, cpu0, rcpu0 = time.monotonic(), time.process_time(), redis_cpu(args.redis)
            result = replay(cartridge, settings, tenants=[BIG], options=ReplayOptions(batch=args.batch),
                            progress=Progress(f"replay {BIG}"))
            seconds, cpu = time.monotonic() - started, time.process_time() - cpu0
            rcpu = redis_cpu(args.redis) - rcpu0
            rate = result.applied / result.seconds if result.seconds else 0.0
            rates.append(rate)
            cpus.append(cpu / max(1, result.applied) * 1e6)
            if i == 0:
                print(result.summary())
                live = committed(args.kafka, name) - before
            print(f"round {i + 1}: replay rate: {rate:,.0f} events/s (goal >= {GOAL:,}) "
                  f"{'OK' if rate >= GOAL else 'BELOW GOAL'}; the replay process's CPU: {cpus[-1]:.0f} µs/event"
                  f"{f', Redis {rcpu / max(1, result.applied) * 1e6:.0f} µs/event' if args.private_redis else ''} "
                  f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
            if i == 0:
                print(f"live ingest during the replay: {live:,} records of {args.others} other tenants in "
                      f"{seconds:.1f}s = {live / seconds:,.0f} records/s")
        if args.commandstats:
            print_commandstats(args.redis, max(1, result.applied))
        if publisher is not None:
            publisher.wait(600)
    finally:
        worker.terminate()
        worker.wait(120)
    client = redis.Redis.from_url(args.redis, decode_responses=True)
    print(f"Redis key layout of the namespace: {client.get(layout_key(name))} ({layout_key(name)})")
    client.close()
    if args.rounds > 1:
        print(f"median of {args.rounds} rounds: {statistics.median(rates):,.0f} events/s, "
              f"{statistics.median(cpus):.0f} µs CPU/event")
    if not args.keep:
        store = RedisStore.from_url(args.redis, namespace=name)
        store.drop_namespace()
        store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
