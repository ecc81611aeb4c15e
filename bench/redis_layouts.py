"""Redis key layout 1 against layout 2 (issue 16), both production stores, side by side in one run.

    .venv/bin/python bench/redis_layouts.py [--events 100000] [--tenants 1000] [--partitions 8] [--batch 5000]
                                            [--rounds 3] [--repeat 300] [--deep 30 1000 100000] [--deep-step 8]
                                            [--shared-redis]

Starts a redis-server of its own (as bench/peers/compare.py does: append-only, fsync every second), so that
the Redis CPU figures (INFO CPU, used_cpu_user + used_cpu_sys) are this run's alone; --shared-redis uses
KEEL_REDIS_URL instead (the figures then include other clients' load). Steps:

1. finance-shaped events (bench/common.py's generator, interleaved over tenants as bench/ingest.py
   publishes them) go through the real Projector of cartridges/finance; the writes and event ids (with their
   marks) it produces are cut like a worker cuts them: per partition (crc32 of the tenant), polls of
   --batch records, one step per tenant and partition carrying its last offset, one round trip per poll.
2. `RedisStore.commit_many` (layout 1: the APPLY script, a sorted set and an index list per entity) and
   `SegmentStore.commit_many` (layout 2: one APPEND of a JSON delta per entity and step, segments closed with a
   restatement by the writer), in fresh namespaces, alternating for --rounds rounds; the medians of Redis CPU
   µs/event and client CPU µs/event (encoding, sending, answers, closing segments) are printed, and of the
   encoding alone (layout 1's ApplyBatch, layout 2's encode_step; nothing sent). Both layouts must give every
   sampled entity the same view now and at a past date, and every sampled tenant the same digest.
3. reads of a debt with --deep daily snapshots (all in the past), written in steps of --deep-step events: `view`
   (what `context` reads) of labels and facts (lf) and of everything (lfr), now and at the middle of its
   history, in both layouts.
4. bytes per fact version: MEMORY USAGE over every key of each namespace / fact versions.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import hashlib
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from common import percentiles
from ingest import write_events
from peers.compare import private_redis
from redis_memory import Recorder

from keel import reading
from keel.cartridge import load_cartridge
from keel.digest import digest
from keel.projector import Projector
from keel.store.base import BatchStep, EventWrites, Write
from keel.store.redis import RedisStore
from keel.store.redis.batch import ApplyBatch, PendingStep
from keel.store.redis.segment_store import SegmentStore
from keel.store.redis.segments import StepBlocks, encode_step
from keel.times import parse_time

TOPIC = "keel.bench.events"
GOAL_REDIS = 10.0            # µs of Redis CPU per event (issue 16)


# ---- the run ------------------------------------------------------------------------------------


def project(events: list[dict], cartridge: Any) -> Recorder:
    """The writes and event ids (with marks) the real Projector produces for each event, in log order."""
    recorder = Recorder()
    projector = Projector(cartridge, recorder)
    for i, e in enumerate(events):
        projector.apply_raw(e, origin=f"{TOPIC}@{i}")
    return recorder


def deep_debt(projector: Projector, tenant: str, versions: int) -> tuple[str, str]:
    """A debt with `versions` daily snapshots ending a year ago (all in the past, so the head is the state now),
    and the day in the middle of its history."""
    debt = f"deep{versions}"
    last = datetime.date.today() - datetime.timedelta(days=365)
    for i in range(versions):
        day = (last - datetime.timedelta(days=versions - i)).isoformat()
        projector.apply_raw({"id": f"{debt}-{i}", "tenant": tenant, "type": "debt.snapshot",
                             "subject": f"debt:{debt}", "occurred_at": day,
                             "payload": {"creditor": "Banco Andino", "product": "Visa", "balance_cop": 1000 + i,
                                         "rate_ea_pct": 20.5, "installment_cop": 100, "month": day[:7]}})
    return f"debt:{debt}", (last - datetime.timedelta(days=versions // 2)).isoformat()


def polls(log: list[tuple[str, list[Write], Any]], partitions: int, batch: int) -> list[list[BatchStep]]:
    """A worker's commits: per partition (crc32 of the tenant) polls of `batch` records, one step per tenant
    carrying its last offset; the polls of one round of all partitions share one round trip."""
    by_part: list[list[tuple[str, list[Write], Any]]] = [[] for _ in range(partitions)]
    for rec in log:
        by_part[zlib.crc32(rec[0].encode()) % partitions].append(rec)
    out = []
    for start in range(0, max(len(p) for p in by_part), batch):
        steps: list[BatchStep] = []
        for part, recs in enumerate(by_part):
            tenants: dict[str, tuple[list[EventWrites], int]] = {}
            for offset in range(start, min(start + batch, len(recs))):
                tenant, writes, eid = recs[offset]
                evs, _ = tenants.get(tenant, ([], 0))
                evs.append((writes, eid))
                tenants[tenant] = (evs, offset)
            steps += [(t, evs, (TOPIC, part, off, len(recs))) for t, (evs, off) in tenants.items()]
        out.append(steps)
    return out


def redis_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return 1e6 * (float(info["used_cpu_user"]) + float(info["used_cpu_sys"]))


def measured(client: redis.Redis, run: Callable[[], None], events: int) -> tuple[float, float, float]:
    """(Redis CPU µs/event, client CPU µs/event, events/s) of one run."""
    r0, c0, t0 = redis_cpu(client), time.process_time(), time.perf_counter()
    run()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return (redis_cpu(client) - r0) / events, cpu * 1e6 / events, events / wall


def namespace_bytes(client: redis.Redis, namespace: str) -> tuple[int, int]:
    """(sum of MEMORY USAGE, keys) over every key of a namespace (its tenants' keys and its registry)."""
    total = count = 0
    for pattern in (f"keel:{{{namespace}/*", f"keel:{{{namespace}}}:*"):
        names = list(client.scan_iter(match=pattern, count=1000))
        for i in range(0, len(names), 1000):
            pipe = client.pipeline(transaction=False)
            for k in names[i:i + 1000]:
                pipe.memory_usage(k, samples=0)
            for v in pipe.execute():
                total += int(v or 0)
                count += 1
    return total, count


def namespace_content(client: redis.Redis, namespace: str) -> str:
    """A digest of every key and value of a namespace, order-free where Redis is (sets, hashes)."""
    h = hashlib.sha256()
    names = sorted(client.scan_iter(match=f"keel:{{{namespace}/*", count=1000))
    for i in range(0, len(names), 1000):
        chunk = names[i:i + 1000]
        pipe = client.pipeline(transaction=False)
        for k in chunk:
            pipe.type(k)
        kinds = pipe.execute()
        pipe = client.pipeline(transaction=False)
        for k, kind in zip(chunk, kinds):
            if kind == b"string":
                pipe.get(k)
            elif kind == b"hash":
                pipe.hgetall(k)
            elif kind == b"set":
                pipe.smembers(k)
            elif kind == b"list":
                pipe.lrange(k, 0, -1)
            else:
                pipe.zrange(k, 0, -1, withscores=True)
        for k, kind, v in zip(chunk, kinds, pipe.execute()):
            if kind in (b"hash", b"set"):
                v = sorted(v.items()) if isinstance(v, dict) else sorted(v)
            h.update(k + b"=" + repr(v).encode() + b"\n")
    return h.hexdigest()


def drop(client: redis.Redis, namespace: str) -> None:
    for pattern in (f"keel:{{{namespace}/*", f"keel:{{{namespace}}}:*"):
        names = list(client.scan_iter(match=pattern, count=1000))
        for i in range(0, len(names), 1000):
            client.unlink(*names[i:i + 1000])


def encode_cpu(all_polls: list[list[BatchStep]], encode: Callable[[BatchStep], Any], events: int) -> float:
    """Client CPU µs/event of encoding every step, nothing sent."""
    c0 = time.process_time()
    for steps in all_polls:
        for step in steps:
            encode(step)
    return (time.process_time() - c0) * 1e6 / events


def layout1_encode(step: BatchStep) -> ApplyBatch:
    p = PendingStep(*step)
    return ApplyBatch(p.events, 0, p.field, p.offset, p.latest, p.lag)


def layout2_encode(step: BatchStep) -> StepBlocks:
    return encode_step(PendingStep(*step).events)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--tenants", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--batch", type=int, default=5000, help="records per poll and partition")
    ap.add_argument("--rounds", type=int, default=3, help="alternating write rounds (medians are printed)")
    ap.add_argument("--repeat", type=int, default=300, help="calls per read figure and round")
    ap.add_argument("--deep", type=int, nargs="*", default=[30, 1_000, 100_000], help="versions of the deep debts (none: no read figures)")
    ap.add_argument("--deep-step", type=int, default=8, help="events per step when the deep debts are written (a "
                    "worker's steps hold a few events of a tenant; a step's delta goes to one segment whole)")
    ap.add_argument("--shared-redis", action="store_true", help="use KEEL_REDIS_URL, not a redis-server of this run")
    args = ap.parse_args()
    if args.shared_redis and not os.environ.get("KEEL_REDIS_URL"):
        raise SystemExit("--shared-redis needs KEEL_REDIS_URL")
    if not args.shared_redis and shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not on PATH: install it or pass --shared-redis with KEEL_REDIS_URL")
    with tempfile.TemporaryDirectory(prefix="keel-layouts-") as tmp_name:
        tmp = Path(tmp_name)
        proc = None
        url = os.environ.get("KEEL_REDIS_URL", "")
        if not args.shared_redis:
            proc, url = private_redis(tmp)
        try:
            run(args, url, tmp)
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(30)


def run(args: argparse.Namespace, url: str, tmp: Path) -> None:
    cartridge = load_cartridge(ROOT / "cartridges" / "finance")
    path = tmp / "events.jsonl"
    write_events(path, args.events, args.tenants, "interleaved")
    events = [json.loads(line) for line in path.read_text().splitlines()]
    t0 = time.process_time()
    log = project(events, cartridge).log
    print(f"{len(log):,} finance events of {args.tenants} tenants projected by the real Projector "
          f"({(time.process_time() - t0) * 1e6 / len(log):.0f} µs CPU/event); load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; Redis {'KEEL_REDIS_URL' if args.shared_redis else 'private'}")
    all_polls = polls(log, args.partitions, args.batch)
    nsteps = sum(len(p) for p in all_polls)
    print(f"{len(all_polls)} round trips of {args.partitions} partitions x {args.batch} records, {nsteps:,} tenant steps "
          f"({len(log) / nsteps:.1f} events per step)")
    fact_versions = sum(1 for _, w, _ in log for key, _ in w if key[0] == "f")
    gc.collect()
    gc.freeze()     # the projected log is long-lived (as a worker's mirrors): keep the collector off it, for both
    gc.set_threshold(100_000, 50, 100)      # as `keel worker` runs (workers/collector.py)
    client = redis.Redis.from_url(url)
    text_client = redis.Redis.from_url(url, decode_responses=True)
    layouts: dict[str, type[RedisStore]] = {"layout 1": RedisStore, "layout 2": SegmentStore}
    encoders: dict[str, Callable[[BatchStep], Any]] = {"layout 1": layout1_encode, "layout 2": layout2_encode}
    figures: dict[str, list[tuple[float, float, float]]] = {k: [] for k in layouts}
    encoding: dict[str, list[float]] = {k: [] for k in layouts}
    memory: dict[str, tuple[int, int]] = {}
    checked = (0, 0)
    for r in range(args.rounds):
        stores = {name: cls(text_client, namespace=f"l{name[-1]}{os.getpid()}r{r}", owns_client=False)
                  for name, cls in layouts.items()}
        for name, store in stores.items():
            figures[name].append(measured(client, lambda store=store: [store.commit_many(s) for s in all_polls],
                                          len(log)))
        if r == 0:
            memory = {name: namespace_bytes(client, store.namespace) for name, store in stores.items()}
            checked = check_sample(stores["layout 1"], stores["layout 2"], log)
        for name, store in stores.items():
            drop(client, store.namespace)
            encoding[name].append(encode_cpu(all_polls, encoders[name], len(log)))
    med = {k: [statistics.median(x[i] for x in v) for i in range(3)] for k, v in figures.items()}
    enc = {k: statistics.median(v) for k, v in encoding.items()}
    one, two = med["layout 1"], med["layout 2"]
    print(f"\nwrites, medians of {args.rounds} alternating rounds      layout 1   layout 2   2/1")
    for i, name in enumerate(("Redis CPU µs/event", "client CPU µs/event (encode + send)", "events/s (wall, one client)")):
        print(f"  {name:<40}{one[i]:>9.1f}  {two[i]:>9.1f}  {two[i] / one[i]:>6.2f}")
    print(f"  {'client encode only µs/event':<40}{enc['layout 1']:>9.1f}  {enc['layout 2']:>9.1f}  "
          f"{enc['layout 2'] / enc['layout 1']:>6.2f}")
    print(f"  Redis CPU goal <= {GOAL_REDIS} µs/event: layout 1 {'met' if one[0] <= GOAL_REDIS else 'NOT met'}, "
          f"layout 2 {'met' if two[0] <= GOAL_REDIS else 'NOT met'}")
    b1, b2 = (memory[k][0] / fact_versions for k in layouts)
    print(f"\nmemory (sum of MEMORY USAGE / {fact_versions:,} fact versions): layout 1 {b1:.0f} B "
          f"({memory['layout 1'][1]:,} keys), layout 2 {b2:.0f} B ({memory['layout 2'][1]:,} keys), ratio {b2 / b1:.2f}")
    print(f"same views in both layouts on {checked[0]} sampled entities (now and at a past date), same digests of "
          f"{checked[1]} sampled tenants")
    if args.deep:
        reads(args, cartridge, client, text_client)


def check_sample(one: RedisStore, two: RedisStore, log: list[tuple[str, list[Write], Any]]) -> tuple[int, int]:
    """Both layouts answer the same views now and at a past date on sampled entities, and the same digests on
    sampled tenants (raises otherwise); returns how many of each were compared."""
    sample = random.Random(7).sample(log, min(200, len(log)))
    pairs = sorted({(t, key[1]) for t, w, _ in sample for key, _ in w})
    past = parse_time("2000-06-15")
    for tenant, entity in pairs:
        for at in (None, past):
            a, b = reading.view(one, tenant, entity, at=at), reading.view(two, tenant, entity, at=at)
            if a != b:
                raise AssertionError(f"layouts differ on {tenant} {entity} at {at}: {a} vs {b}")
    tenants = sorted({t for t, _, _ in sample})[:10]
    for tenant in tenants:
        if digest(one, tenant) != digest(two, tenant):
            raise AssertionError(f"layouts give tenant {tenant} different digests")
    return len(pairs), len(tenants)


def reads(args: argparse.Namespace, cartridge: Any, client: redis.Redis, text_client: redis.Redis) -> None:
    """p50/p99 of reads of a deep debt in both layouts, the sizes in alternating rounds (medians printed)."""
    stores = {"layout 1": RedisStore(text_client, namespace=f"dt{os.getpid()}", owns_client=False),
              "layout 2": SegmentStore(text_client, namespace=f"dp{os.getpid()}", owns_client=False)}
    subjects = {}
    for versions in args.deep:
        tenant = f"deep-{versions}"
        recorder = Recorder()
        entity, mid = deep_debt(Projector(cartridge, recorder), tenant, versions)
        evs = [(w, eid) for _, w, eid in recorder.log]
        for i in range(0, len(evs), args.deep_step):
            step = [(tenant, evs[i:i + args.deep_step], (TOPIC, 0, i + args.deep_step - 1))]
            for store in stores.values():
                store.commit_many(step)
        subjects[versions] = (tenant, entity, mid)
        same = all(reading.view(stores["layout 1"], tenant, entity, at=at) == reading.view(stores["layout 2"], tenant, entity, at=at)
                   for at in (None, mid))
        fv = sum(1 for w, _ in evs for k, _ in w if k[0] == "f")
        b1, b2 = (namespace_bytes(client, st.namespace)[0] / fv for st in stores.values())
        print(f"deep debt, {versions:,} snapshots in steps of {args.deep_step}: same views now and at {mid}: {same}; "
              f"{fv:,} fact versions; bytes per fact version of the namespace so far: layout 1 {b1:.0f} B, "
              f"layout 2 {b2:.0f} B")
    calls: dict[str, Callable[[str, str, str], Callable[[], Any]]] = {}
    for name, store in stores.items():
        calls[f"now: {name} (lf)"] = lambda t, e, m, store=store: partial(store.view, t, e, parts="lf")
        calls[f"now: {name} (lfr)"] = lambda t, e, m, store=store: partial(store.view, t, e)
        calls[f"past: {name} (lf)"] = lambda t, e, m, store=store: partial(store.view, t, e, at=m, parts="lf")
    rounds: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for _ in range(3):
        for versions, subject in subjects.items():
            for name, make in calls.items():
                slow = versions > 10_000 and name.startswith("past: layout 2")       # decodes every segment
                rounds.setdefault((versions, name), []).append(
                    percentiles(make(*subject), max(5, args.repeat // 30) if slow else args.repeat))
    fig = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v)) for k, v in rounds.items()}
    print(f"\nreads of the deep debt (ms, medians of 3 rounds of {args.repeat} calls; layout 2 past at 100k: fewer calls)")
    print(f"  {'':24}" + "".join(f"{f'{v:,} p50':>12}{f'{v:,} p99':>12}" for v in subjects))
    for name in calls:
        print(f"  {name:<24}" + "".join(f"{fig[(v, name)][0]:>12.3f}{fig[(v, name)][1]:>12.3f}" for v in subjects))
    big, small = max(subjects), 1_000 if 1_000 in subjects else min(subjects)     # the issue compares 100k with 1k
    print(f"p99 at {big:,} / p99 at {small:,}:")
    for name in calls:
        print(f"  {name:<24}{fig[(big, name)][1] / fig[(small, name)][1]:>8.2f}")
    for store in stores.values():
        drop(client, store.namespace)


if __name__ == "__main__":
    main()
