"""Replay benchmark: rebuild one big tenant with `keel replay` while a worker ingests other tenants live.

    .venv/bin/python bench/replay.py [--events 500000] [--others 20] [--other-events 100000] [--batch 5000]
    (quick run: --events 50000 --other-events 20000)

Needs KEEL_KAFKA_BOOTSTRAP and KEEL_REDIS_URL (or --kafka/--redis). On a fresh cartridge name (fresh topic and
Redis namespace): publishes the big tenant's finance-shaped events, starts a `keel worker`, publishes the other
tenants' events in the background (`keel publish`, another process), and replays the big tenant. Prints the
replay rate (events applied per second of the replay, goal >= 20,000 events/s) and the worker's live-ingest
rate during the replay (records its group committed per second over the replay's duration).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import finance_events

from keel.cartridge import load_cartridge
from keel.config import resolve
from keel.kafka import KafkaUnavailable, TopicSpec, group_offsets
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
    ap.add_argument("--keep", action="store_true", help="keep the Redis namespace afterwards")
    args = ap.parse_args()
    if not args.kafka or not args.redis:
        ap.error("needs --kafka and --redis (or KEEL_KAFKA_BOOTSTRAP / KEEL_REDIS_URL)")
    work = Path(tempfile.mkdtemp(prefix="keel-bench-replay-"))
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

    worker = subprocess.Popen([sys.executable, "-m", "keel.cli", "worker", str(folder), "--quiet", "-l", "warn"],
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
                                      "--quiet"], env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
        started, cpu0 = time.monotonic(), time.process_time()
        result = replay(cartridge, settings, tenants=[BIG], options=ReplayOptions(batch=args.batch),
                        progress=Progress(f"replay {BIG}"))
        seconds, cpu = time.monotonic() - started, time.process_time() - cpu0
        live = committed(args.kafka, name) - before
        publisher.wait(600)
    finally:
        worker.terminate()
        worker.wait(120)
    rate = result.applied / result.seconds if result.seconds else 0.0
    print(result.summary())
    print(f"replay rate: {rate:,.0f} events/s (goal >= {GOAL:,}) {'OK' if rate >= GOAL else 'BELOW GOAL'}; "
          f"the replay process's CPU: {cpu / max(1, result.applied) * 1e6:.0f} µs/event (load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    print(f"live ingest during the replay: {live:,} records of {args.others} other tenants in {seconds:.1f}s = "
          f"{live / seconds:,.0f} records/s")
    if not args.keep:
        from keel.store.redis import RedisStore
        store = RedisStore.from_url(args.redis, namespace=name)
        store.drop_namespace()
        store.close()
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
