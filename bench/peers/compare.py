"""Keel's worker and its peers on one generated topic, in one run: events/s, CPU µs per event and the ratios.

    .venv/bin/pip install -e ".[bench]"        # the peers (quix-streams); never needed to run Keel
    .venv/bin/python bench/peers/compare.py [--events 100000] [--tenants 1000] [--partitions 8] [--batch 20000]
                                            [--no-faust] [--no-quix] [--commandstats] [--keep] [--baseline [REF]] [--rounds N]

Needs KEEL_KAFKA_BOOTSTRAP and KEEL_REDIS_URL (or --kafka/--redis). On a fresh cartridge name (fresh topics,
consumer groups and Redis namespace) it publishes finance-shaped events once, then reads the same topic with:
  1. `keel worker` (bench/ingest.py's run: rate from partitions assigned to lag 0; worker and Redis CPU);
  2. the quix-streams stateful app of bench/peers/quix_app.py (RocksDB state with changelog, one state write
     per Keel write; rate and its process's CPU from its first event to its last);
  3. unless --no-faust, a bare faust agent that only acks (bench/ingest.py's probe; rate only).
--no-quix --no-faust runs the worker alone (e.g. to compare two --batch values, or two checkouts in turn);
--commandstats prints what the private redis-server spent per event by command (INFO commandstats: calls and
µs of wall time, the commands a script runs counted too). The worker writes Keel's one Redis key layout (segments,
keel/store/redis/segment_store.py; the namespace's stamp is printed after the run).
--baseline REF (default 76cd00d: main before layout 1's removal) also runs that checkout's own compare.py
(bench/baseline.py: a git worktree in the temporary folder) with the same sizes, worker only (--no-quix
--no-faust), once with --layout 1 before this run and once with --layout 2 after it, and prints its figures and
the ratios of this worker's (events/s, worker and Redis CPU µs/event) to each. --rounds N repeats the whole
(each round on fresh topics; the peers in the first round only) and prints the medians.
Goals (issue 16): the worker at >= 2x the quix-streams app's events/s, and >= 15,000 events/s. On a shared
machine the rates move with the load; CPU per event moves less, so both are printed with their ratios.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import redis
from baseline import DEFAULT_REF, Baseline, ratio
from ingest import cartridge_copy, cleanup, faust_probe_rate, run_workers, write_events

from keel.cartridge import load_cartridge
from keel.kafka import TopicSpec, admin_client, bootstrap_list
from keel.store.redis.keys import layout_key
from keel.wire import events_topic
from workers.publish import prepare, publish_prepared

GOAL_RATE = 15_000
GOAL_RATIO = 2.0


def quix_peer(bootstrap: str, topic: str, total: int, tmp: Path, group: str) -> tuple[float, float] | None:
    """(events/s, CPU seconds) of the quix-streams app over the topic; None when it failed (printed)."""
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("quix_app.py")), bootstrap_list(bootstrap)[0],
                           topic, str(total), str(tmp / "quix-state"), group],
                          capture_output=True, text=True, timeout=1800, check=False)
    m = re.search(r"PEER quix (\d+) ([\d.]+) ([\d.]+)", proc.stdout)
    if m is None:
        print(f"quix-streams app failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
        return None
    return int(m.group(1)) / float(m.group(2)), float(m.group(3))


def private_redis(tmp: Path) -> tuple[subprocess.Popen, str]:
    """A redis-server of this run only, configured as deploy/local/services starts one (append-only file,
    fsync every second), so that its CPU figure is the worker's load alone, not other clients'."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp / "redis").mkdir()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp / "redis"),
                             "--save", "", "--appendonly", "yes", "--appendfsync", "everysec",
                             "--zset-max-listpack-entries", "512"], stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(100):
        try:
            redis.Redis.from_url(url).ping()
            return proc, url
        except redis.ConnectionError:
            time.sleep(0.1)
    proc.terminate()
    raise SystemExit("the private redis-server did not start")


async def drop_peer_topics(bootstrap: str, name: str) -> None:
    """The changelog and repartition topics quix-streams made for this run (they carry its unique name)."""
    async with admin_client(bootstrap) as admin:
        topics = [t for t in await admin.list_topics() if name in t and not t.startswith("keel.")]
        if topics:
            await admin.delete_topics(topics)


def print_commandstats(url: str, total: int) -> None:
    """Redis commands by µs per event (wall time inside the server; calls per event too)."""
    client = redis.Redis.from_url(url)
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    for name, v in sorted(stats.items(), key=lambda kv: -kv[1]["usec"])[:12]:
        print(f"  {name.removeprefix('cmdstat_'):<16} {v['calls'] / total:6.2f} calls/event "
              f"{v['usec'] / total:6.2f} µs/event ({v['usec_per_call']:.1f} µs/call)")


def layout_stamp(url: str, namespace: str) -> str:
    """The key layout the namespace was stamped with (by the worker, at its first open), as Redis holds it."""
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        return str(client.get(layout_key(namespace)))
    finally:
        client.close()


def run(args: argparse.Namespace, tmp: Path) -> Figures:
    """Publish once, then the worker and the peers on the same topic; the worker's figures."""
    folder = cartridge_copy(tmp)
    cartridge = load_cartridge(folder)
    topic = events_topic(cartridge.name)
    events = tmp / "events.jsonl"
    write_events(events, args.events, args.tenants, "interleaved")
    prepared = prepare(cartridge, events)
    report = asyncio.run(publish_prepared(cartridge, prepared, args.kafka, TopicSpec(args.partitions)))
    total = report.sent
    print(f"published {total:,} finance events of {report.tenants} tenants to {topic} "
          f"({report.partitions} partitions); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    env = {"KEEL_KAFKA_BOOTSTRAP": args.kafka, "KEEL_REDIS_URL": args.redis}
    t0 = time.perf_counter()
    logs = [tmp / f"worker{i}.log" for i in range(args.workers)]
    ready_s, _, worker_cpu, redis_cpu = run_workers(folder, env, total, args.batch, logs)
    keel_rate = total / ready_s
    who = "keel worker" if args.workers == 1 else f"{args.workers} keel workers (rate from their start)"
    print(f"{who}: {keel_rate:,.0f} events/s, worker CPU "
          f"{'?' if worker_cpu is None else f'{worker_cpu / total * 1e6:.0f}'} µs/event, "
          f"Redis CPU {redis_cpu / total * 1e6:.0f} µs/event (run {time.perf_counter() - t0:.0f}s); "
          f"Redis key layout {layout_stamp(args.redis, cartridge.name)} ({layout_key(cartridge.name)})")
    mine = (keel_rate, None if worker_cpu is None else worker_cpu / total * 1e6, redis_cpu / total * 1e6)
    if args.commandstats:
        print_commandstats(args.redis, total)
    quix = None if args.no_quix else quix_peer(args.kafka, topic, total, tmp, f"{cartridge.name}-quix")
    if quix is not None:
        quix_rate, quix_cpu = quix
        print(f"quix-streams stateful app: {quix_rate:,.0f} events/s, CPU {quix_cpu / total * 1e6:.0f} µs/event "
              f"(its process; the broker's work for its changelog is not counted)")
        ratio = keel_rate / quix_rate
        print(f"ratio keel/quix events/s: {ratio:.2f} (goal >= {GOAL_RATIO}: "
              f"{'met' if ratio >= GOAL_RATIO else 'NOT met'})")
        if worker_cpu is not None:
            print(f"ratio quix CPU / keel worker CPU per event: {quix_cpu / worker_cpu:.2f}; "
                  f"quix CPU / (keel worker + Redis) CPU: {quix_cpu / (worker_cpu + redis_cpu):.2f}")
    if not args.no_faust:
        probe = faust_probe_rate(args.kafka, topic, total, tmp)
        print(f"bare faust agent (acks only, no processing): "
              f"{'failed' if probe is None else f'{probe:,.0f} events/s; ratio keel/faust {keel_rate / probe:.2f}'}")
    print(f"keel worker {keel_rate:,.0f} events/s (goal >= {GOAL_RATE:,}: "
          f"{'met' if keel_rate >= GOAL_RATE else 'NOT met'})")
    if not args.keep:
        asyncio.run(cleanup(args.kafka, args.redis, folder, sorted(prepared.tenants)))
        asyncio.run(drop_peer_topics(args.kafka, cartridge.name))
    else:
        print(f"kept: topic {topic}, Redis namespace {cartridge.name!r}")
    return mine


Figures = tuple[float, float | None, float]         # events/s, worker CPU µs/event, Redis CPU µs/event
WORKER_LINE = re.compile(r"keel workers?\b.*?: ([\d,]+) events/s, worker CPU (\S+) µs/event, Redis CPU (\d+) µs/event")


def baseline_run(args: argparse.Namespace, base: Baseline, layout: int) -> Figures:
    """The baseline checkout's compare.py, worker only, in one layout (its worker line printed): its figures."""
    sizes = ["--events", str(args.events), "--tenants", str(args.tenants), "--partitions", str(args.partitions),
             "--batch", str(args.batch), "--workers", str(args.workers), "--kafka", args.kafka]
    shared = ["--shared-redis", "--redis", args.redis] if args.shared_redis else []
    text = base.run("bench/peers/compare.py", [*sizes, *shared, "--no-quix", "--no-faust", "--layout", str(layout)])
    m = WORKER_LINE.search(text)
    if m is None:
        raise SystemExit(f"the baseline's compare.py printed no worker line:\n{text[-2000:]}")
    print(f"baseline {base.ref}, its compare.py --layout {layout} (worker only): " + m.group(0))
    worker = None if m.group(2) == "?" else float(m.group(2))
    return float(m.group(1).replace(",", "")), worker, float(m.group(3))


def median_of(runs: list[Figures], i: int) -> float | None:
    values = [f[i] for f in runs if f[i] is not None]
    return statistics.median(values) if values else None


def print_ratios(base: Baseline, rounds: int, mine: list[Figures], ones: list[Figures], twos: list[Figures]) -> None:
    """Medians of the rounds: this worker, the baseline's layouts 1 and 2, and the ratios."""
    print(f"\nthis worker / baseline {base.ref} ({base.commit[:9]}, its compare.py --no-quix --no-faust --layout N), "
          f"medians of {rounds} round(s), each: layout 1, this worker, layout 2")
    print(f"  {'':32}{'one store':>10}{'layout 1':>10}{'layout 2':>10}{'one/1':>8}{'one/2':>8}")
    for i, name in enumerate(("events/s", "worker CPU µs/event", "Redis CPU µs/event")):
        m, one, two = median_of(mine, i), median_of(ones, i), median_of(twos, i)
        cells = "".join("         -" if f is None else f"{f:>10,.0f}" for f in (m, one, two))
        print(f"  {name:<32}{cells}{ratio(m, one):>8}{ratio(m, two):>8}")
    print("  (events/s: higher is better; CPU: lower is better)")
    # Paired: each round's layout 2 ran right after this worker, so the load they met is closer than across rounds.
    paired = [m[0] / two[0] for m, two in zip(mine, twos) if two[0]]
    if paired:
        print(f"  events/s this / layout 2, round by round: {', '.join(f'{r:.3f}' for r in paired)}; "
              f"median {statistics.median(paired):.3f}")



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--tenants", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--batch", type=int, default=20_000, help="worker --batch (default: the worker's)")
    ap.add_argument("--workers", type=int, default=1, help="keel worker processes in the group (the goal is per "
                    "process; 2 shows what a second process gains here)")
    ap.add_argument("--kafka", default=os.environ.get("KEEL_KAFKA_BOOTSTRAP"))
    ap.add_argument("--redis", default=os.environ.get("KEEL_REDIS_URL"))
    ap.add_argument("--no-faust", action="store_true", help="skip the bare faust agent")
    ap.add_argument("--no-quix", action="store_true", help="skip the quix-streams app")
    ap.add_argument("--commandstats", action="store_true", help="print the Redis commands' cost per event")
    ap.add_argument("--baseline", nargs="?", const=DEFAULT_REF, metavar="REF", help="also run REF's own "
                    f"bench/peers/compare.py, worker only, with --layout 1 before this run and --layout 2 after it "
                    f"(default REF {DEFAULT_REF}), and print the ratios")
    ap.add_argument("--rounds", type=int, default=1, help="runs of the worker on fresh topics (with --baseline: "
                    "each round runs layout 1, this worker, layout 2); medians are printed; the peers run in the "
                    "first round only")
    ap.add_argument("--shared-redis", action="store_true", help="use --redis rather than a redis-server of this "
                    "run (whose CPU then counts only this worker)")
    ap.add_argument("--keep", action="store_true", help="keep the topics and the Redis namespace")
    args = ap.parse_args()
    if not args.kafka or (args.shared_redis and not args.redis):
        raise SystemExit("set KEEL_KAFKA_BOOTSTRAP (and KEEL_REDIS_URL with --shared-redis), e.g. "
                         "eval \"$(deploy/local/services up)\", or pass --kafka and --redis")
    if not args.shared_redis and shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not on PATH: install it or pass --shared-redis")
    base = Baseline(args.baseline) if args.baseline else None
    mine: list[Figures] = []
    ones: list[Figures] = []
    twos: list[Figures] = []
    for r in range(args.rounds):
        if r:                           # the peers ran in the first round; the later ones repeat the workers only
            args.no_quix = args.no_faust = True
            print(f"\nround {r + 1} of {args.rounds}")
        if base is not None:
            ones.append(baseline_run(args, base, 1))
        mine.append(this_run(args))
        if base is not None:
            twos.append(baseline_run(args, base, 2))
    if base is not None:
        print_ratios(base, args.rounds, mine, ones, twos)
    elif args.rounds > 1:
        print(f"\nmedians of {args.rounds} rounds: {median_of(mine, 0):,.0f} events/s, worker "
              f"{median_of(mine, 1) or 0:.0f} µs, Redis {median_of(mine, 2) or 0:.0f} µs CPU/event")


def this_run(args: argparse.Namespace) -> Figures:
    """One run of this tree's worker (and, unless skipped, the peers) on a fresh topic and Redis."""
    with tempfile.TemporaryDirectory(prefix="keel-peers-") as tmp_name:
        tmp = Path(tmp_name)
        redis_proc = None
        if not args.shared_redis:
            redis_proc, args.redis = private_redis(tmp)
        try:
            return run(args, tmp)
        finally:
            if redis_proc is not None:
                redis_proc.terminate()
                redis_proc.wait(30)

if __name__ == "__main__":
    main()
