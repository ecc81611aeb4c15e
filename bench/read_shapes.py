"""Reads of one deep entity in every shape issue 23 names, Redis layout 1 against layout 2, side by side in one run.

    .venv/bin/python bench/read_shapes.py [--versions 1000 100000] [--repeat 200] [--step 8] [--shapes ...]

Starts a redis-server of its own (bench/peers/compare.py's private_redis). For each size, one tenant per shape
holds one entity with that many versions, written through the real Projector of cartridges/finance (relations
with ends through the store's write primitives), committed in steps of --step events to both layouts. Every
event carries a recorded_at one second after the previous one, so `known_at` cuts the history in the middle.
Each row times `view` (what `context` reads: labels, facts and relations) in one shape:

    now                 the present, believed now
    past                at the middle valid day
    known_at now        the present as believed at the middle recorded time
    known_at past       the middle valid day as believed at the middle recorded time
    late past           at the middle valid day of a debt whose every 10th snapshot arrives 40 days late
    ends now / past     a debt linked to and unlinked from its household by turns (a relation with ends)
    voids now / past    a debt whose every 7th snapshot is corrected and every 13th retracted

Before timing, the collector is kept off the recorded histories (gc.freeze, and a young threshold like the one
`keel worker` sets), as bench/redis_layouts.py does: a full collection over them otherwise lands in the timed calls.
Both layouts must answer every shape the same (checked once per shape and size before timing). Printed: p50
and p99 in milliseconds (medians of --rounds rounds; a read slower than 50 ms is timed --repeat/40 times), and the p99 at the largest size over the p99 at 1,000
(issue 23's goal: p99 <= 2 ms at 100,000 versions and <= 2x the 1,000-version figure).
"""
from __future__ import annotations

import argparse
import datetime
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import percentiles
from peers.compare import private_redis
from redis_memory import Recorder

from keel import reading
from keel.cartridge import load_cartridge
from keel.projector import Projector
from keel.store.base import Store
from keel.store.redis import RedisStore
from keel.store.redis.segment_store import SegmentStore
from keel.store.writes import event_key, relation_write
from keel.times import parse_time

TOPIC = "keel.bench.events"
START = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
SHAPES = ("now", "past", "known_at now", "known_at past", "late past", "ends now", "ends past", "voids now",
          "voids past")


def stamp(i: int) -> str:
    """The recorded_at of the i-th event: one second after the previous one."""
    return (START + datetime.timedelta(seconds=i)).strftime("%Y-%m-%dT%H:%M:%S.000000Z")


def day(i: int) -> str:
    return (datetime.date(1900, 1, 1) + datetime.timedelta(days=i)).isoformat()


def snapshots(tenant: str, debt: str, n: int, *, late: bool = False, voids: bool = False) -> list[dict[str, Any]]:
    """n envelopes of one debt's daily snapshots; `late`: every 10th is 40 days late; `voids`: every 7th is
    corrected by the next event and every 13th retracted (the corrections and retractions count in n)."""
    out: list[dict[str, Any]] = []
    i = 0
    while len(out) < n:
        point = i - 40 if late and i % 10 == 9 else i
        env = {"id": f"{debt}-{i}", "tenant": tenant, "type": "debt.snapshot", "subject": f"debt:{debt}",
               "occurred_at": day(point), "recorded_at": stamp(len(out)),
               "payload": {"creditor": "Banco Andino", "product": "Visa", "balance_cop": 1000 + i, "rate_ea_pct": 20.5,
                           "installment_cop": 100, "month": day(point)[:7]}}
        out.append(env)
        if voids and i % 7 == 6 and len(out) < n:
            fixed = {**env, "id": f"{debt}-{i}-fix", "corrects": env["id"], "recorded_at": stamp(len(out)),
                     "payload": {**env["payload"], "balance_cop": 5 + i}}
            out.append(fixed)
        elif voids and i % 13 == 12 and len(out) < n:
            out.append({"id": f"{debt}-{i}-retract", "tenant": tenant, "type": "keel.retracted",
                        "subject": f"debt:{debt}", "occurred_at": day(point), "recorded_at": stamp(len(out)),
                        "by": "bench", "payload": {"event": env["id"], "reason": "bench"}})
        i += 1
    return out


def family(shape: str) -> str:
    """The entity a shape reads: shapes of one family share it."""
    first = shape.split()[0]
    return first if first in ("late", "ends", "voids") else "plain"


def read_args(shape: str, n: int) -> dict[str, Any]:
    """The view's arguments of a shape: the middle valid day and recorded time of n events."""
    args: dict[str, Any] = {}
    if shape.endswith("past"):
        args["at"] = parse_time(day(n // 2))
    if shape.startswith("known_at"):
        args["known_at"] = parse_time(stamp(n // 2))
    return args


def build(cartridge: Any, shape: str, tenant: str, n: int) -> tuple[Recorder, str]:
    """The writes of one family's entity and the entity."""
    recorder = Recorder()
    debt = f"deep-{family(shape)}"
    if shape.startswith("ends"):
        projector = Projector(cartridge, recorder)
        for env in snapshots(tenant, debt, 1):
            projector.apply_raw(env)
        for i in range(1, n):
            write = relation_write(f"debt:{debt}", "owed_by", f"household:{tenant}", day(i), i % 2 == 0,
                                   source="bench", evidence=f"link-{i}", recorded_at=stamp(i), by=None)
            recorder.apply_writes(tenant, [write], event_key(f"link-{i}", None, parse_time(stamp(i))))
    else:
        projector = Projector(cartridge, recorder)
        for env in snapshots(tenant, debt, n, late=shape.startswith("late"), voids=shape.startswith("voids")):
            projector.apply_raw(env)
    return recorder, f"debt:{debt}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--versions", type=int, nargs="+", default=[1_000, 100_000], help="versions of the deep entity")
    ap.add_argument("--repeat", type=int, default=200, help="calls per shape, size and round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds (medians printed)")
    ap.add_argument("--step", type=int, default=8, help="events per commit step when writing")
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=SHAPES, metavar="SHAPE",
                    help=f"the shapes to time (default all: {', '.join(SHAPES)})")
    args = ap.parse_args()
    cartridge = load_cartridge(ROOT / "cartridges" / "finance")
    tmp = Path(tempfile.mkdtemp(prefix="keel-shapes-"))
    proc, url = private_redis(tmp)
    try:
        client = redis.Redis.from_url(url, decode_responses=True)
        stores: dict[str, Store] = {
            "layout 1": RedisStore(client, namespace=f"rs1{os.getpid()}", owns_client=False),
            "layout 2": SegmentStore(client, namespace=f"rs2{os.getpid()}", owns_client=False)}
        calls: dict[tuple[int, str, str], Callable[[], Any]] = {}
        for n in args.versions:
            built: dict[str, tuple[str, Recorder, str]] = {}
            for shape in args.shapes:
                if family(shape) not in built:
                    tenant = f"{family(shape)}-{n}"
                    recorder, entity = build(cartridge, shape, tenant, n)
                    evs = [(w, eid) for _, w, eid in recorder.log]
                    for i in range(0, len(evs), args.step):
                        step = [(tenant, evs[i:i + args.step], (TOPIC, 0, i + args.step - 1))]
                        for store in stores.values():
                            store.commit_many(step)
                    built[family(shape)] = (tenant, recorder, entity)
                tenant, recorder, entity = built[family(shape)]
                read = read_args(shape, n)
                answers = [reading.view(store, tenant, entity, **read) for store in stores.values()]
                if answers[0] != answers[1] or answers[0] != reading.view(recorder, tenant, entity, **read):
                    raise SystemExit(f"the layouts answer {shape} at {n:,} versions differently")
                for name, store in stores.items():
                    calls[(n, shape, name)] = lambda store=store, t=tenant, e=entity, r=read: reading.view(store, t, e, **r)
                print(f"{shape} at {n:,} versions: written, same answer in both layouts and in memory", flush=True)
        gc.collect()
        gc.freeze()     # the recorded histories are long-lived: keep the collector off them while timing
        gc.set_threshold(100_000, 50, 100)      # a young threshold like `keel worker` sets (workers/collector.py)
        rounds: dict[tuple[int, str, str], list[tuple[float, float]]] = {}
        for _ in range(args.rounds):
            for key, call in calls.items():
                t0 = time.perf_counter()
                call()
                slow = time.perf_counter() - t0 > 0.05           # a read of the whole history: fewer calls
                rounds.setdefault(key, []).append(percentiles(call, max(5, args.repeat // 40) if slow else args.repeat))
        fig = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v)) for k, v in rounds.items()}
        small, big = min(args.versions), max(args.versions)
        print(f"\nview of one deep entity (ms; medians of {args.rounds} rounds of {args.repeat} calls, "
              f"{max(5, args.repeat // 40)} for a read slower than 50 ms)")
        head = "".join(f"{f'{n:,} p50':>12}{f'{n:,} p99':>12}" for n in args.versions)
        print(f"  {'shape':<16}{'layout':<10}{head}{'p99 ratio':>11}")
        for shape in args.shapes:
            for name in stores:
                cells = "".join(f"{fig[(n, shape, name)][0]:>12.3f}{fig[(n, shape, name)][1]:>12.3f}"
                                for n in args.versions)
                ratio = fig[(big, shape, name)][1] / fig[(small, shape, name)][1]
                print(f"  {shape:<16}{name:<10}{cells}{ratio:>11.2f}")
        for store in stores.values():
            store.close()
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
