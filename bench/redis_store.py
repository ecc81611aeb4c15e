"""The one Redis store (keel.store.redis.RedisStore, segments) on a worker's writes: Redis and client CPU per
event, events/s, bytes per fact version and reads of deep entities; optionally side by side with a baseline
checkout's layouts 1 and 2 in the same invocation (--baseline REF).

    .venv/bin/python bench/redis_store.py [--events 100000] [--tenants 1000] [--partitions 8] [--batch 5000]
                                          [--rounds 3] [--repeat 300] [--deep 30 1000 100000] [--deep-step 8]
                                          [--shared-redis] [--baseline [REF]]

Starts a redis-server of its own (as bench/peers/compare.py does: append-only, fsync every second), so that
the Redis CPU figures (INFO CPU, used_cpu_user + used_cpu_sys) are this run's alone; --shared-redis uses
KEEL_REDIS_URL instead (the figures then include other clients' load). Steps:

1. finance-shaped events (bench/common.py's generator, interleaved over tenants as bench/ingest.py
   publishes them) go through the real Projector of cartridges/finance; the writes and event ids (with their
   marks) it produces are cut like a worker cuts them: per partition (crc32 of the tenant), polls of
   --batch records, one step per tenant and partition carrying its last offset, one round trip per poll.
2. `RedisStore.commit_many` (one APPEND of a JSON delta per entity and step, segments closed with a
   restatement by the writer) into a fresh namespace, --rounds rounds; the medians of Redis CPU µs/event and
   client CPU µs/event (encoding, sending, answers, closing segments) are printed, and of the encoding alone
   (encode_step; nothing sent). Every sampled entity must have the same view in Redis as in the in-memory
   store the Projector wrote (now and at a past date), and every sampled tenant the same digest.
3. reads of a debt with --deep daily snapshots (all in the past), written in steps of --deep-step events: `view`
   (what `context` reads) of labels and facts (lf) and of everything (lfr), now and at the middle of its
   history. bench/read_shapes.py measures every other read shape of issue 23.
4. bytes per fact version: MEMORY USAGE over every key of the namespace / fact versions.

--baseline REF (default 76cd00d: main before layout 1's removal, both layouts) runs that checkout's own
bench/redis_layouts.py (bench/baseline.py: a git worktree in the temporary folder) with the same sizes, one
round of it after each round here (alternating), its reads after the last; its table (medians of its rounds,
layouts 1 and 2) is printed after this store's, then the ratios of the key figures: this store / layout 1 and
this store / layout 2.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import hashlib
import json
import os
import random
import re
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

from baseline import DEFAULT_REF, Baseline, ratio
from common import percentiles
from ingest import write_events
from peers.compare import private_redis
from redis_memory import Recorder

from keel import reading
from keel.cartridge import load_cartridge
from keel.digest import digest
from keel.projector import Projector
from keel.store.base import BatchStep, EventWrites, Store, Write
from keel.store.redis import RedisStore
from keel.store.redis.batch import PendingStep
from keel.store.redis.segments import StepBlocks, encode_step
from keel.times import parse_time

TOPIC = "keel.bench.events"
GOAL_REDIS = 7.0             # µs of Redis CPU per event (issue 23)
GOAL_BYTES = 268             # bytes per fact version (issue 23)
BASE_SCRIPT = "bench/redis_layouts.py"      # the baseline checkout's script: layouts 1 and 2 side by side
# Its reads call `store.view`, which Store lost in 37d0a53 (before 76cd00d: the script's read part failed there);
# the baseline's stores get one that is keel.reading.view, what this script's reads call too.
BASE_PRELUDE = ("import keel.reading, keel.store.base\n"
                "if not hasattr(keel.store.base.Store, 'view'):\n"
                "    keel.store.base.Store.view = lambda self, *a, **k: keel.reading.view(self, *a, **k)")
WRITE_ROWS = ("Redis CPU µs/event", "client CPU µs/event (encode + send)", "events/s (wall, one client)",
              "client encode only µs/event")


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


def encode(step: BatchStep) -> StepBlocks:
    return encode_step(PendingStep(*step).events)


# ---- the baseline checkout's figures -----------------------------------------------------------------


def base_writes(text: str) -> dict[str, tuple[float, float]]:
    """(layout 1, layout 2) of each write row of the baseline script's table, and of bytes per fact version."""
    out: dict[str, tuple[float, float]] = {}
    for line in text.splitlines():
        for name in WRITE_ROWS:
            m = re.match(rf"\s+{re.escape(name)}\s+([\d.]+)\s+([\d.]+)\s+[\d.]+\s*$", line)
            if m:
                out[name] = (float(m.group(1)), float(m.group(2)))
        m = re.match(r"memory \(.*\): layout 1 (\d+) B .*layout 2 (\d+) B", line)
        if m:
            out["bytes per fact version"] = (float(m.group(1)), float(m.group(2)))
    missing = [name for name in (*WRITE_ROWS, "bytes per fact version") if name not in out]
    if missing:
        raise SystemExit(f"the baseline's output has no {', '.join(missing)}:\n{text[-2000:]}")
    return out


def base_reads(text: str) -> tuple[str, dict[str, list[float]]]:
    """The baseline script's read section (as printed) and its rows: name -> [p50, p99] per size."""
    at = text.find("\nreads of the deep debt")
    if at < 0:
        return "", {}
    section = text[at + 1:]
    rows: dict[str, list[float]] = {}
    for line in section.splitlines()[2:]:
        m = re.match(r"\s+((?:now|past): layout \d \(\w+\))((?:\s+[\d.]+)+)\s*$", line)
        if m:
            rows.setdefault(m.group(1), [float(x) for x in m.group(2).split()])
    return section.rstrip(), rows


def base_args(args: argparse.Namespace, deep: bool) -> list[str]:
    """The baseline script's arguments for one round (with the reads when `deep`)."""
    out = ["--events", str(args.events), "--tenants", str(args.tenants), "--partitions", str(args.partitions),
           "--batch", str(args.batch), "--rounds", "1", "--repeat", str(args.repeat),
           "--deep-step", str(args.deep_step), "--deep", *(map(str, args.deep) if deep else [])]
    return [*out, "--shared-redis"] if args.shared_redis else out


# ---- the run ---------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--tenants", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--batch", type=int, default=5000, help="records per poll and partition")
    ap.add_argument("--rounds", type=int, default=3, help="write rounds (medians are printed)")
    ap.add_argument("--repeat", type=int, default=300, help="calls per read figure and round")
    ap.add_argument("--deep", type=int, nargs="*", default=[30, 1_000, 100_000], help="versions of the deep debts (none: no read figures)")
    ap.add_argument("--deep-step", type=int, default=8, help="events per step when the deep debts are written (a "
                    "worker's steps hold a few events of a tenant; a step's delta goes to one segment whole)")
    ap.add_argument("--shared-redis", action="store_true", help="use KEEL_REDIS_URL, not a redis-server of this run")
    ap.add_argument("--baseline", nargs="?", const=DEFAULT_REF, metavar="REF", help="also run REF's own "
                    f"{BASE_SCRIPT} (layouts 1 and 2; default REF {DEFAULT_REF}) in alternating rounds, and print "
                    "the ratios")
    args = ap.parse_args()
    if args.shared_redis and not os.environ.get("KEEL_REDIS_URL"):
        raise SystemExit("--shared-redis needs KEEL_REDIS_URL")
    if not args.shared_redis and shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not on PATH: install it or pass --shared-redis with KEEL_REDIS_URL")
    base = Baseline(args.baseline) if args.baseline else None
    if base is not None:
        base.checkout()
        print(f"baseline: {base}, its {BASE_SCRIPT}")
    with tempfile.TemporaryDirectory(prefix="keel-store-") as tmp_name:
        tmp = Path(tmp_name)
        proc = None
        url = os.environ.get("KEEL_REDIS_URL", "")
        if not args.shared_redis:
            proc, url = private_redis(tmp)
        try:
            run(args, url, tmp, base)
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(30)


def run(args: argparse.Namespace, url: str, tmp: Path, base: Baseline | None) -> None:
    cartridge = load_cartridge(ROOT / "cartridges" / "finance")
    path = tmp / "events.jsonl"
    write_events(path, args.events, args.tenants, "interleaved")
    events = [json.loads(line) for line in path.read_text().splitlines()]
    t0 = time.process_time()
    recorder = project(events, cartridge)
    log = recorder.log
    print(f"{len(log):,} finance events of {args.tenants} tenants projected by the real Projector "
          f"({(time.process_time() - t0) * 1e6 / len(log):.0f} µs CPU/event); load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; Redis {'KEEL_REDIS_URL' if args.shared_redis else 'private'}")
    all_polls = polls(log, args.partitions, args.batch)
    nsteps = sum(len(p) for p in all_polls)
    print(f"{len(all_polls)} round trips of {args.partitions} partitions x {args.batch} records, {nsteps:,} tenant steps "
          f"({len(log) / nsteps:.1f} events per step)")
    fact_versions = sum(1 for _, w, _ in log for key, _ in w if key[0] == "f")
    gc.collect()
    gc.freeze()     # the projected log is long-lived (as a worker's mirrors): keep the collector off it
    gc.set_threshold(100_000, 50, 100)      # as `keel worker` runs (workers/collector.py)
    client = redis.Redis.from_url(url)
    text_client = redis.Redis.from_url(url, decode_responses=True)
    figures: list[tuple[float, float, float]] = []
    encoding: list[float] = []
    base_rounds: list[dict[str, tuple[float, float]]] = []
    base_text = ""
    memory = (0, 0)
    checked = (0, 0)
    for r in range(args.rounds):
        store = RedisStore(text_client, namespace=f"s{os.getpid()}r{r}", owns_client=False)
        figures.append(measured(client, lambda store=store: [store.commit_many(s) for s in all_polls], len(log)))
        if r == 0:
            memory = namespace_bytes(client, store.namespace)
            checked = check_sample(recorder, store, log)
        drop(client, store.namespace)
        encoding.append(encode_cpu(all_polls, encode, len(log)))
        if base is not None:            # one round of the baseline's layouts 1 and 2 after each round here
            last = r == args.rounds - 1
            base_text = base.run(BASE_SCRIPT, base_args(args, deep=last and bool(args.deep)), prelude=BASE_PRELUDE)
            base_rounds.append(base_writes(base_text))
            print(f"  round {r + 1}: this store and the baseline's, load average {os.getloadavg()[0]:.1f}")
    med = [statistics.median(x[i] for x in figures) for i in range(3)] + [statistics.median(encoding)]
    per_version = memory[0] / fact_versions
    print(f"\nwrites, medians of {args.rounds} rounds        one store")
    for name, value in zip(WRITE_ROWS, med):
        print(f"  {name:<40}{value:>9.1f}")
    print(f"  Redis CPU goal <= {GOAL_REDIS} µs/event: {'met' if med[0] <= GOAL_REDIS else 'NOT met'}")
    print(f"\nmemory (sum of MEMORY USAGE / {fact_versions:,} fact versions): {per_version:.0f} B ({memory[1]:,} keys); "
          f"goal <= {GOAL_BYTES} B: {'met' if per_version <= GOAL_BYTES else 'NOT met'}")
    print(f"same views in Redis as in the Projector's in-memory store on {checked[0]} sampled entities (now and at "
          f"a past date), same digests of {checked[1]} sampled tenants")
    if base is not None:
        print_baseline(args, base, base_rounds, dict(zip(WRITE_ROWS, med)) | {"bytes per fact version": per_version})
    mine: dict[str, list[float]] = {}
    if args.deep:
        mine = reads(args, cartridge, client, text_client)
    if base is not None and args.deep:
        section, rows = base_reads(base_text)
        print(f"\nbaseline {base.ref}, its {BASE_SCRIPT} (last round):\n{section}")
        print_read_ratios(args.deep, mine, rows)


def print_baseline(args: argparse.Namespace, base: Baseline, rounds: list[dict[str, tuple[float, float]]],
                   mine: dict[str, float]) -> None:
    """The baseline's write table (medians of its rounds) and the ratios of this store's figures to it."""
    med = {k: (statistics.median(r[k][0] for r in rounds), statistics.median(r[k][1] for r in rounds))
           for k in rounds[0]}
    print(f"\nbaseline {base.ref} ({base.commit[:9]}), its {BASE_SCRIPT}, medians of {len(rounds)} rounds "
          f"alternating with this store's      layout 1   layout 2   2/1")
    for name in (*WRITE_ROWS, "bytes per fact version"):
        one, two = med[name]
        print(f"  {name:<40}{one:>9.1f}  {two:>9.1f}  {ratio(two, one):>6}")
    print("\nthis store / baseline                      one store   layout 1   layout 2   one/1   one/2")
    for name in (*WRITE_ROWS, "bytes per fact version"):
        one, two = med[name]
        print(f"  {name:<40}{mine[name]:>9.1f}  {one:>9.1f}  {two:>9.1f}  {ratio(mine[name], one):>6}  "
              f"{ratio(mine[name], two):>6}")
    print("  (CPU and bytes: lower is better; events/s: higher is better)")


def print_read_ratios(sizes: list[int], mine: dict[str, list[float]], base: dict[str, list[float]]) -> None:
    """p99 of this store's reads / the baseline's layouts', per size."""
    print("\nreads, p99 of this store / the baseline's" + "".join(f"{f'{v:,} /1':>11}{f'{v:,} /2':>11}" for v in sizes))
    for name, values in mine.items():
        kind, parts = name.split(" ")
        ones, twos = base.get(f"{kind} layout 1 {parts}"), base.get(f"{kind} layout 2 {parts}")
        cells = ""
        for i in range(len(sizes)):
            p99 = values[2 * i + 1]
            cells += f"{ratio(p99, ones[2 * i + 1] if ones else None):>11}{ratio(p99, twos[2 * i + 1] if twos else None):>11}"
        print(f"  {name:<40}{cells}")


def same_view(store: Store, tenant: str, entity: str, at: Any) -> Any:
    """What must be the same in Redis and in memory: a view without its freshness (only Redis keeps the lag of
    the partition a commit step carries)."""
    v = reading.view(store, tenant, entity, at=at)
    return None if v is None else v._replace(freshness=None)


def check_sample(reference: Store, store: RedisStore, log: list[tuple[str, list[Write], Any]]) -> tuple[int, int]:
    """The store answers the same views now and at a past date as `reference` (the Projector's in-memory store,
    which applied the same writes) on sampled entities, and the same digests on sampled tenants (raises
    otherwise); returns how many of each were compared."""
    sample = random.Random(7).sample(log, min(200, len(log)))
    pairs = sorted({(t, key[1]) for t, w, _ in sample for key, _ in w})
    past = parse_time("2000-06-15")
    for tenant, entity in pairs:
        for at in (None, past):
            a, b = same_view(reference, tenant, entity, at), same_view(store, tenant, entity, at)
            if a != b:
                raise AssertionError(f"Redis differs from memory on {tenant} {entity} at {at}: {b} vs {a}")
    tenants = sorted({t for t, _, _ in sample})[:10]
    for tenant in tenants:
        if digest(reference, tenant) != digest(store, tenant):
            raise AssertionError(f"Redis and memory give tenant {tenant} different digests")
    return len(pairs), len(tenants)


def reads(args: argparse.Namespace, cartridge: Any, client: redis.Redis, text_client: redis.Redis
          ) -> dict[str, list[float]]:
    """p50/p99 of reads of a deep debt, the sizes in alternating rounds (medians printed); returns
    name -> [p50, p99] per size."""
    store = RedisStore(text_client, namespace=f"ds{os.getpid()}", owns_client=False)
    subjects = {}
    for versions in args.deep:
        tenant = f"deep-{versions}"
        recorder = Recorder()
        entity, mid = deep_debt(Projector(cartridge, recorder), tenant, versions)
        evs = [(w, eid) for _, w, eid in recorder.log]
        for i in range(0, len(evs), args.deep_step):
            store.commit_many([(tenant, evs[i:i + args.deep_step], (TOPIC, 0, i + args.deep_step - 1))])
        subjects[versions] = (tenant, entity, mid)
        same = all(same_view(recorder, tenant, entity, at) == same_view(store, tenant, entity, at)
                   for at in (None, mid))
        fv = sum(1 for w, _ in evs for k, _ in w if k[0] == "f")
        print(f"deep debt, {versions:,} snapshots in steps of {args.deep_step}: same views as in memory now and at "
              f"{mid}: {same}; {fv:,} fact versions; bytes per fact version of the namespace so far: "
              f"{namespace_bytes(client, store.namespace)[0] / fv:.0f} B")
    calls: dict[str, Callable[[str, str, str], Callable[[], Any]]] = {
        "now: (lf)": lambda t, e, m: partial(reading.view, store, t, e, parts="lf"),
        "now: (lfr)": lambda t, e, m: partial(reading.view, store, t, e),
        "past: (lf)": lambda t, e, m: partial(reading.view, store, t, e, at=m, parts="lf"),
    }
    rounds: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for _ in range(3):
        for versions, subject in subjects.items():
            for name, make in calls.items():
                rounds.setdefault((versions, name), []).append(percentiles(make(*subject), args.repeat))
    fig = {k: (statistics.median(r[0] for r in v), statistics.median(r[1] for r in v)) for k, v in rounds.items()}
    print(f"\nreads of the deep debt (ms, medians of 3 rounds of {args.repeat} calls)")
    print(f"  {'':24}" + "".join(f"{f'{v:,} p50':>12}{f'{v:,} p99':>12}" for v in subjects))
    for name in calls:
        print(f"  {name:<24}" + "".join(f"{fig[(v, name)][0]:>12.3f}{fig[(v, name)][1]:>12.3f}" for v in subjects))
    big, small = max(subjects), 1_000 if 1_000 in subjects else min(subjects)     # the issue compares 100k with 1k
    print(f"p99 at {big:,} / p99 at {small:,}:")
    for name in calls:
        print(f"  {name:<24}{fig[(big, name)][1] / fig[(small, name)][1]:>8.2f}")
    drop(client, store.namespace)
    return {name: [x for v in subjects for x in fig[(v, name)]] for name in calls}


if __name__ == "__main__":
    main()
