"""Today's Redis layout against a batch-oriented segment layout (issue 16), side by side in one run.

    .venv/bin/pip install -e ".[bench]"        # msgpack, for the prototype
    .venv/bin/python bench/redis_layouts.py [--events 100000] [--tenants 1000] [--partitions 8] [--batch 500]
                                            [--roll 256] [--rounds 3] [--repeat 300] [--deep 30 1000 100000]
                                            [--deep-step 8] [--shared-redis]

Starts a redis-server of its own (as bench/peers/compare.py does: append-only, fsync every second), so that
the Redis CPU figures (INFO CPU, used_cpu_user + used_cpu_sys) are this run's alone; --shared-redis uses
KEEL_REDIS_URL instead (the figures then include other clients' load). Steps:

1. finance-shaped events (bench/common.py's generator, interleaved over tenants as bench/ingest.py
   publishes them) go through the real Projector of cartridges/finance; the writes and event ids (with their
   marks) it produces are cut like a worker cuts them: per partition (crc32 of the tenant), polls of
   --batch records, one step per tenant and partition carrying its last offset, one round trip per poll.
2. today: `RedisStore.commit_many` (the APPLY script: sorted set per entity, provenance list, ids, marks,
   offsets); the prototype: `SegmentStore.commit_many` (bench/segment_layout.py). Both in fresh namespaces,
   alternating for --rounds rounds; the medians of Redis CPU µs/event and client CPU µs/event (encoding,
   sending, reading answers) are printed, and of the encoding alone (today's ApplyBatch vs the prototype's
   encode_step, nothing sent). Sampled entities must read back the same labels and facts from both.
3. reads of a debt with --deep daily snapshots (all in the past), written in steps of --deep-step events
   (30 snapshots stay in one segment, so the prototype has no head for it and reads the segment whole):
   today `RedisStore.view` (what `context` reads) of labels and facts (lf) and of everything (lfr: relation
   timelines whole), at now and at the middle of its history; the prototype's head read and as-of read.
4. bytes per fact version: MEMORY USAGE over every key of each namespace / fact versions.

The prototype (bench/segment_layout.py, its docstring gives the key layout): per tenant step one
APPLY_SEGMENTS script, atomic: it refuses (writes nothing) when an event id is already applied (the writer drops
those events, as today) or when the writer's guess of an entity's segment state is stale (the writer reads it
and encodes again); then one APPEND of a msgpack delta per touched entity (a roll after --roll assertions: the
new segment starts with a checkpoint, the head as it was), one MSET of the heads the writer computed, SADD ids
and new entities, HSET marks, segment states, offset, sv, rl, kt and lag as today.
Head read: one GET (+ one MGET of the subjects' heads for relations naming the entity). As-of read at t: the
segment with the greatest lowest point <= t (the open one, or ZREVRANGEBYSCORE of the directory of closed
ones: one small script with the GET), decoded; a timeline whose checkpoint entry is later than t sends the
read one segment back.

What the prototype does NOT do yet, compared with production (keel/store/redis):
- generations: keys are built for one generation and the script checks `gen` like APPLY, but there is no
  switch, bulk loader (GenerationLoader) or zero-downtime replay cut-over for this layout;
- reads: no known_at (transaction-time) folding, no void handling in as-of reads (a void winner of
  keel.timeline's rules is returned as an end; the head read falls back to as-of), no EntityView/result
  objects, no whole-timeline reads (history), no search documents, and late data (a segment whose lowest point
  is below the previous one's: flagged) has no bounded as-of path (it would scan the directory);
- writes: a step's delta goes to one segment whole (a step with more than --roll assertions of one entity
  makes a larger segment); the writer holds every entity's head and segment state in memory (a worker's
  mirror holds that state, this bench keeps it in a dict); an entity it has not met is guessed new, and read
  when the script refuses that guess;
- no dump/digest, drop or key walk over the layout, no layout-version stamp, no Cluster run (the hash
  tags make it legal, nothing more was checked);
- id conflicts are found as today (the script answers ids already applied, the Projector compares marks),
  but the worker's retry/strict-generation paths around it are not ported.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import hashlib
import json
import os
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
from segment_layout import SegmentStore

from keel.cartridge import load_cartridge
from keel.projector import Projector
from keel.store.base import BatchStep, EventWrites, Write
from keel.store.redis import RedisStore
from keel.store.redis.batch import ApplyBatch, PendingStep
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


def today_encode(step: BatchStep) -> ApplyBatch:
    p = PendingStep(*step)
    return ApplyBatch(p.events, 0, p.field, p.offset, p.latest, p.lag)


def proto_encoder(client: redis.Redis, roll: int) -> Callable[[BatchStep], Any]:
    """encode_step of a writer that keeps the states of its steps as if the script had accepted each."""
    store = SegmentStore(client, "enc", roll)

    def encode(step: BatchStep) -> None:
        moves: list[Any] = []
        store.encode_step(*step, moves=moves)
        for k, (state, added) in moves[0].items():
            state.incoming.update(added)
            store._states[k] = state
    return encode


def same_values(proto: dict[str, tuple[Any, ...]], view: Any) -> bool:
    """Whether the prototype's winners carry the labels and fact values of today's EntityView."""
    labels = {p.split("|")[1]: a[1] for p, a in proto.items() if p[0] == "l"}
    facts = {p.split("|")[1]: a[1] for p, a in proto.items() if p[0] == "f"}
    ref = labels.pop("ref", None)
    return ref == view.info.ref and labels == view.info.labels and \
        facts == {f["predicate"]: f["value"] for f in view.facts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--tenants", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--batch", type=int, default=500, help="records per poll and partition")
    ap.add_argument("--roll", type=int, default=256, help="assertions after which a segment is closed")
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
    gc.set_threshold(100_000, 50, 100)      # as `keel worker` runs (workers/app.py): the prototype's writer
    #                                         state is long-lived like a worker's mirrors
    client = redis.Redis.from_url(url)
    text_client = redis.Redis.from_url(url, decode_responses=True)
    figures: dict[str, list[tuple[float, float, float]]] = {"today": [], "proto": []}
    encoding: dict[str, list[float]] = {"today": [], "proto": []}
    memory: dict[str, tuple[int, int]] = {}
    for r in range(args.rounds):
        ns_today, ns_proto = f"lt{os.getpid()}r{r}", f"lp{os.getpid()}r{r}"
        today = RedisStore(text_client, namespace=ns_today, owns_client=False)
        proto = SegmentStore(client, ns_proto, args.roll)
        figures["today"].append(measured(client, lambda store=today: [store.commit_many(s) for s in all_polls], len(log)))
        figures["proto"].append(measured(client, lambda store=proto: [store.commit_many(s) for s in all_polls], len(log)))
        if r == 0:
            memory = {"today": namespace_bytes(client, ns_today), "proto": namespace_bytes(client, ns_proto)}
            checked = check_sample(today, proto, log)
            content = namespace_content(client, ns_proto)
            restarted = SegmentStore(client, ns_proto, args.roll)     # knows nothing: guesses, is refused, reads
            for steps in all_polls[:2]:
                restarted.commit_many(steps)
            unchanged = namespace_content(client, ns_proto) == content
        drop(client, ns_today)
        drop(client, ns_proto)
        encoding["today"].append(encode_cpu(all_polls, today_encode, len(log)))
        encoding["proto"].append(encode_cpu(all_polls, proto_encoder(client, args.roll), len(log)))
    enc_today, enc_proto = statistics.median(encoding["today"]), statistics.median(encoding["proto"])
    med = {k: [statistics.median(x[i] for x in v) for i in range(3)] for k, v in figures.items()}
    print(f"\nwrites, medians of {args.rounds} alternating rounds      today      prototype   prototype/today")
    for i, name in enumerate(("Redis CPU µs/event", "client CPU µs/event (encode + send)", "events/s (wall, one client)")):
        print(f"  {name:<40}{med['today'][i]:>9.1f}   {med['proto'][i]:>10.1f}   {med['proto'][i] / med['today'][i]:>8.2f}")
    print(f"  {'client encode only µs/event':<40}{enc_today:>9.1f}   {enc_proto:>10.1f}   {enc_proto / enc_today:>8.2f}")
    print(f"  Redis CPU goal <= {GOAL_REDIS} µs/event: today {'met' if med['today'][0] <= GOAL_REDIS else 'NOT met'}, "
          f"prototype {'met' if med['proto'][0] <= GOAL_REDIS else 'NOT met'}")
    bt, bp = memory["today"][0] / fact_versions, memory["proto"][0] / fact_versions
    print(f"\nmemory (sum of MEMORY USAGE / {fact_versions:,} fact versions): today {bt:.0f} B ({memory['today'][1]:,} keys), "
          f"prototype {bp:.0f} B ({memory['proto'][1]:,} keys), ratio {bp / bt:.2f}")
    print(f"same labels and facts read back from both layouts on {checked} sampled entities (now and at a past date)")
    print(f"a restarted prototype writer redelivering the first 2 polls changed nothing: {unchanged}")
    if args.deep:
        reads(args, cartridge, client, text_client)


def check_sample(today: RedisStore, proto: SegmentStore, log: list[tuple[str, list[Write], Any]]) -> int:
    """Both layouts answer the same labels and fact values, now and at a past date, on sampled entities."""
    pairs = sorted({(t, key[1]) for t, w, _ in log[:: max(1, len(log) // 200)] for key, _ in w})
    past = parse_time("2000-06-15")
    for tenant, entity in pairs:
        for at, got in ((None, proto.current(tenant, entity, "lf")), (past, proto.as_of(tenant, entity, past, "lf"))):
            view = today.view(tenant, entity, at=at, parts="lf")
            if view is None:
                assert not got, (tenant, entity, at, got)
            elif not same_values(got, view):
                raise AssertionError(f"layouts differ on {tenant} {entity} at {at}: {got} vs {view}")
    return len(pairs)


def reads(args: argparse.Namespace, cartridge: Any, client: redis.Redis, text_client: redis.Redis) -> None:
    """p50/p99 of reads of a deep debt in both layouts, the sizes in alternating rounds (medians printed)."""
    ns_today, ns_proto = f"dt{os.getpid()}", f"dp{os.getpid()}"
    today = RedisStore(text_client, namespace=ns_today, owns_client=False)
    proto = SegmentStore(client, ns_proto, args.roll)
    subjects = {}
    for versions in args.deep:
        tenant = f"deep-{versions}"
        recorder = Recorder()
        entity, mid = deep_debt(Projector(cartridge, recorder), tenant, versions)
        evs = [(w, eid) for _, w, eid in recorder.log]
        for i in range(0, len(evs), args.deep_step):
            step = [(tenant, evs[i:i + args.deep_step], (TOPIC, 0, i + args.deep_step - 1))]
            today.commit_many(step)
            proto.commit_many(step)
        subjects[versions] = (tenant, entity, mid, parse_time(mid))
        now_ok = same_values(proto.current(tenant, entity, "lf"), today.view(tenant, entity, parts="lf"))
        past_ok = same_values(proto.as_of(tenant, entity, parse_time(mid), "lf"),
                              today.view(tenant, entity, at=mid, parts="lf"))
        fv = sum(1 for w, _ in evs for k, _ in w if k[0] == "f")
        bt, bp = namespace_bytes(client, ns_today)[0], namespace_bytes(client, ns_proto)[0]
        print(f"deep debt, {versions:,} snapshots in steps of {args.deep_step}: same labels and facts now {now_ok}, at {mid} {past_ok}; "
              f"{fv:,} fact versions; bytes per fact version of the namespace so far: today {bt / fv:.0f} B, "
              f"prototype {bp / fv:.0f} B")
    calls = {
        "now: today view (lf)": lambda t, e, m, pm: partial(today.view, t, e, parts="lf"),
        "now: prototype head (lf)": lambda t, e, m, pm: partial(proto.current, t, e, "lf"),
        "now: today view (lfr)": lambda t, e, m, pm: partial(today.view, t, e),
        "now: prototype head (lfr)": lambda t, e, m, pm: partial(proto.current, t, e, "lfr"),
        "past: today view (lf)": lambda t, e, m, pm: partial(today.view, t, e, at=m, parts="lf"),
        "past: prototype as-of (lf)": lambda t, e, m, pm: partial(proto.as_of, t, e, pm, "lf"),
    }
    rounds: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for _ in range(3):
        for versions, subject in subjects.items():
            for name, make in calls.items():
                slow = "lfr" in name and "today" in name and versions > 10_000    # whole relation timelines
                rounds.setdefault((versions, name), []).append(
                    percentiles(make(*subject), max(5, args.repeat // 30) if slow else args.repeat))
    fig = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v)) for k, v in rounds.items()}
    print(f"\nreads of the deep debt (ms, medians of 3 rounds of {args.repeat} calls; lfr at 100k: fewer calls)")
    print(f"  {'':32}" + "".join(f"{f'{v:,} p50':>12}{f'{v:,} p99':>12}" for v in subjects))
    for name in calls:
        print(f"  {name:<32}" + "".join(f"{fig[(v, name)][0]:>12.3f}{fig[(v, name)][1]:>12.3f}" for v in subjects))
    big, small = max(subjects), 1_000 if 1_000 in subjects else min(subjects)     # the issue compares 100k with 1k
    print("ratios (p99):")
    for now_or_past, t_name, p_name in (("now", "now: today view (lf)", "now: prototype head (lf)"),
                                        ("now lfr", "now: today view (lfr)", "now: prototype head (lfr)"),
                                        ("past", "past: today view (lf)", "past: prototype as-of (lf)")):
        print(f"  {now_or_past:<8} prototype/today at {small:,}: {fig[(small, p_name)][1] / fig[(small, t_name)][1]:.3g}, "
              f"at {big:,}: {fig[(big, p_name)][1] / fig[(big, t_name)][1]:.3g}; {big:,} vs {small:,}: today "
              f"{fig[(big, t_name)][1] / fig[(small, t_name)][1]:.3g}, prototype {fig[(big, p_name)][1] / fig[(small, p_name)][1]:.3g}")
    drop(client, ns_today)
    drop(client, ns_proto)


if __name__ == "__main__":
    main()
