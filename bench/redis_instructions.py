"""Instructions redis-server executes per event for the same commit steps, this store against a baseline checkout's
layouts, counted by valgrind's callgrind: a figure the load of a shared machine does not move.

    .venv/bin/python bench/redis_instructions.py [--events 10000] [--tenants 200] [--partitions 8] [--batch 5000]
                                                 [--baseline [REF]] [--layouts 2 1]

Needs valgrind (`apt-get install valgrind`). Each side runs in a process of its own, in its own checkout (this
tree, or bench/baseline.py's worktree of REF, default 76cd00d: main before layout 1's removal, both layouts):
finance-shaped events (bench/ingest.py's seeded generator, so both sides see the same ones) go through that
checkout's Projector and are cut into a worker's polls and tenant steps (its bench module's `project` and
`polls`), then committed with that checkout's store to a redis-server started under callgrind (append-only file
on, fsync every second, as bench/peers/compare.py runs it). The counters are zeroed right before the first step
and dumped right after the last (the store's scripts loaded before), so the figure is the commit steps' alone:
instructions per event, and the ratio of this store's to each baseline layout's.

Why instructions: on this 2-core machine shared with other work, the CPU time `INFO` reports for the same run
moves by 30% and more with the load (bench/redis_store.py prints it); callgrind's count moves by well under 1%
between runs. It is not time: a cache miss costs more than an instruction, and valgrind runs the server about 50x
slower, so use it to compare versions of the write path, and the timed benches for the goal in µs.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from baseline import DEFAULT_REF, Baseline, interpreter, ratio


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _callgrind_total(path: str) -> int:
    """The instruction total of a callgrind dump."""
    with open(path) as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                return int(line.split()[1])
    raise RuntimeError(f"no totals in {path}")


def child(args: argparse.Namespace) -> None:
    """One side: project, cut, commit under callgrind; prints `RESULT <json>`. Runs in the checkout to measure
    (its keel first on sys.path), so it imports only what every checkout's bench folder has."""
    tree = Path.cwd()
    sys.path[:] = [str(tree), str(tree / "bench")] + [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
    import importlib

    import redis
    from redis.commands.core import Script
    side = importlib.import_module("redis_store" if (tree / "bench" / "redis_store.py").exists()
                                   else "redis_layouts")       # a checkout with both layouts (76cd00d)
    import keel
    if not Path(keel.__file__).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"keel imported from {keel.__file__}, not from {tree}")
    from keel.store.redis import RedisStore, segment_store
    two = hasattr(segment_store, "SegmentStore")       # a checkout with both layouts: RedisStore is layout 1
    if args.layout is not None and not two:
        raise RuntimeError(f"{tree} has one Redis layout: measure it without --layouts")
    store_class: type = segment_store.SegmentStore if two and args.layout == 2 else RedisStore
    tmp = Path(tempfile.mkdtemp(prefix="keel-instr-"))
    try:
        path = tmp / "events.jsonl"
        side.write_events(path, args.events, args.tenants, "interleaved")
        events = [json.loads(line) for line in path.read_text().splitlines()]
        log = side.project(events, side.load_cartridge(tree / "cartridges" / "finance")).log
        polls = side.polls(log, args.partitions, args.batch)
        port = _free_port()
        out = tmp / "callgrind.out"
        server = subprocess.Popen(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}.%p",
                                   "redis-server", "--port", str(port), "--save", "", "--appendonly", "yes",
                                   "--appendfsync", "everysec", "--dir", str(tmp), "--hz", "1"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            client = redis.Redis(port=port, decode_responses=True)
            deadline = time.monotonic() + 120
            while True:
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    if time.monotonic() > deadline or server.poll() is not None:
                        raise RuntimeError("redis-server under valgrind did not start") from None
                    time.sleep(0.3)
            store = store_class(client, namespace="instr", owns_client=False)
            for script in vars(store).values():                # loaded before the count starts
                if isinstance(script, Script):
                    client.script_load(script.script)
            subprocess.run(["callgrind_control", "-z", str(server.pid)], check=True, capture_output=True)
            for poll in polls:
                store.commit_many(poll)
            subprocess.run(["callgrind_control", "-d", str(server.pid)], check=True, capture_output=True)
            dumps = sorted(glob.glob(f"{out}.{server.pid}.*"))
            if not dumps:
                raise RuntimeError("callgrind wrote no dump")
            print("RESULT " + json.dumps({"instructions": _callgrind_total(dumps[-1]), "events": len(log),
                                          "layout": args.layout}), flush=True)
        finally:
            server.terminate()
            server.wait(timeout=60)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _side(cwd: Path, env: dict[str, str], args: argparse.Namespace, layout: int | None) -> dict[str, int]:
    command = [interpreter(), str(Path(__file__).resolve()), "--child", "--events", str(args.events), "--tenants",
               str(args.tenants), "--partitions", str(args.partitions), "--batch", str(args.batch)]
    if layout is not None:
        command += ["--layout", str(layout)]
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=7200)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise SystemExit(f"the side in {cwd} failed (exit {proc.returncode}):\n{proc.stdout[-1500:]}\n"
                         f"{proc.stderr[-2500:]}")
    return dict(json.loads(lines[-1][len("RESULT "):]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=10_000)
    ap.add_argument("--tenants", type=int, default=200)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--batch", type=int, default=5_000, help="records per poll and partition")
    ap.add_argument("--baseline", nargs="?", const=DEFAULT_REF, default=None, metavar="REF",
                    help=f"also count a checkout of REF (default {DEFAULT_REF}), its layouts given by --layouts")
    ap.add_argument("--layouts", type=int, nargs="+", default=[2], choices=[1, 2],
                    help="a two-layout baseline's layouts to count (default 2); a one-store baseline is counted once")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--layout", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind is not installed: apt-get install valgrind")
    print(f"{args.events:,} finance events of {args.tenants} tenants, polls of {args.batch} records over "
          f"{args.partitions} partitions; redis-server under callgrind, append-only file on")
    mine = _side(ROOT, dict(os.environ), args, None)
    per = mine["instructions"] / mine["events"]
    print(f"  this store: {per:,.0f} instructions/event")
    if args.baseline:
        base = Baseline(args.baseline)
        tree = base.checkout()
        two = (tree / "keel" / "store" / "redis" / "scripts.py").exists()      # layout 1's scripts
        for layout in args.layouts if two else [None]:
            got = _side(tree, base.env(), args, layout)
            theirs = got["instructions"] / got["events"]
            name = f"{base.ref} layout {layout}" if layout else str(base.ref)
            print(f"  {name}: {theirs:,.0f} instructions/event; this store / it: {ratio(per, theirs)}")


if __name__ == "__main__":
    main()
