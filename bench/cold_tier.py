"""The cold tier, tiering off vs on, same run: Redis bytes per event, reads of the present and of the past, and
the commit path's events/s, for a tenant with about two years of daily history.

    .venv/bin/python bench/cold_tier.py [--entities 20] [--days 730] [--cold-after 90d] [--reads 2000] [--private-redis]

Needs KEEL_POSTGRES_DSN and KEEL_REDIS_URL (deploy/local/services up), or --private-redis: a redis-server of this
run only, configured as the services' (bench/peers/compare.py), whose reads no other client's keys or load slow
down; works in a private PostgreSQL schema and two fresh Redis namespaces, both dropped at the end. Steps:
  1. finance events: each debt's snapshot every day (a new balance and rate: 3 fact versions, a relink) for
     --days days ending yesterday, a due scheduled and paid each month;
  2. the same events committed (the embedded projector, one commit per event) into two namespaces:
     "off" (no cold tier) and "on" (with one); then `keel archive`'s pass moves "on"'s closed segments older
     than --cold-after, and its change log's chunks but the newest 256 (cold.KEEP_CHUNKS), to PostgreSQL;
  3. Redis bytes (MEMORY USAGE of every key of the tenant, by kind) per event, off vs on; PostgreSQL bytes;
  4. reads in-process (the store's view, then Tools.context): now, at a past time older than --cold-after
     (served from the cold tier when on), and with known_at; p50/p99 µs and CPU µs per call, off vs on,
     reads now also with the store's FoldCache and PresentViews emptied before each call (the first read after writes to the
     entity and its relations' subjects: every open segment decoded again),
     in alternating blocks (after gc.freeze of what the build left, as bench/read_shapes.py: a full collection
     over it otherwise lands in about 1% of the calls, some 50 ms each);
  5. the commit path's events/s and CPU µs per event with tiering off vs on: 6 rounds of 15 more days committed
     into each (alternated; over all rounds, and the best and median round ratios).
Goals (issue 25): Redis bytes per event on <= 1/5 of off; reads now p99 unchanged (<= 0.5 ms); past reads from
the cold tier p99 <= 10 ms; events/s on >= 0.9x off.
"""
from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psycopg
from peers.compare import private_redis

from keel.cartridge import load_cartridge
from keel.cold_pg import ColdStore
from keel.embedded import build_embedded
from keel.store.base import ViewRequest
from keel.store.redis import RedisStore
from keel.times import now_micros, parse_time
from keel.tools import Tools
from workers.archive import ArchiveOptions, Mover, set_policy

TENANT = "bench"


def history(path: Path, entities: int, start: dt.date, days: int, first_day: int = 0) -> int:
    """Daily snapshots of `entities` debts from `start + first_day` for `days` days; returns events written."""
    n = 0
    with path.open("w") as f:
        for d in range(first_day, first_day + days):
            day = (start + dt.timedelta(days=d)).isoformat()
            for k in range(entities):
                f.write(json.dumps({"id": f"snap-{k}-{d}", "tenant": TENANT, "type": "debt.snapshot",
                                    "subject": f"debt:d{k}", "occurred_at": day,
                                    "payload": {"creditor": "Banco Andino", "product": f"Visa {k}",
                                                "balance_cop": 9_000_000 - 1_000 * d - k, "rate_ea_pct": 20 + d % 9,
                                                "installment_cop": 380_000 + d % 3, "month": day[:7]}}) + "\n")
                n += 1
                if d % 30 == 4:
                    due = f"due:d{k}-{d}"
                    f.write(json.dumps({"id": f"due-{k}-{d}", "tenant": TENANT, "type": "due.scheduled",
                                        "subject": due, "occurred_at": day,
                                        "payload": {"debt_id": f"d{k}", "due_on": day, "amount_cop": 380_000}}) + "\n")
                    f.write(json.dumps({"id": f"paid-{k}-{d}", "tenant": TENANT, "type": "due.paid", "subject": due,
                                        "occurred_at": day, "payload": {"paid_on": day, "amount_cop": 380_000,
                                                                        "account_id": "nomina",
                                                                        "movement_id": f"m{k}-{d}"}}) + "\n")
                    n += 2
    return n


def redis_bytes(store: RedisStore) -> dict[str, int]:
    """MEMORY USAGE (SAMPLES 0: exact for lists and hashes) of every key of the tenant's current generation, by
    kind: closed segments, open segments, change log, the rest (indexes, ids, meta)."""
    names = store.key_names(TENANT)
    pipe = store.client.pipeline(transaction=False)
    for k in names:
        pipe.execute_command("MEMORY", "USAGE", k, "SAMPLES", "0")
    out = {"closed segments": 0, "open segments": 0, "change log": 0, "event ids and marks (e:)": 0,
           "valid-time index": 0, "other (fr, i:, m, sg, cz)": 0}
    for k, n in zip(names, pipe.execute()):
        if n is None:
            continue
        local = k.split(":", 3)[-1]          # keel:{ns/tenant}:g<N>:<local name>
        if local.startswith("s:") and "|" in local:
            out["closed segments"] += int(n)
        elif local.startswith("s:"):
            out["open segments"] += int(n)
        elif local == "ch":
            out["change log"] += int(n)
        elif local.startswith("e:"):          # the event ids' buckets, id -> packed mark (event_ids.py)
            out["event ids and marks (e:)"] += int(n)
        elif local.startswith("v:"):
            out["valid-time index"] += int(n)
        else:
            out["other (fr, i:, m, sg, cz)"] += int(n)
    return out


def interleaved(calls: dict[str, Callable[[], object]], n: int, blocks: int = 40) -> dict[str, tuple[float, float, float]]:
    """Per label: (p50 µs, p99 µs, CPU µs per call) of n calls, run in `blocks` alternating blocks (the load of a
    shared machine changes by the second: each label sees the same mix); one warm-up block first."""
    samples: dict[str, list[float]] = {label: [] for label in calls}
    cpu: dict[str, float] = {label: 0.0 for label in calls}
    per = max(1, n // blocks)
    for b in range(blocks + 1):
        for label in (list(calls) if b % 2 == 0 else list(reversed(calls))):
            fn = calls[label]
            c0 = time.process_time()
            got = []
            for _ in range(per):
                t0 = time.perf_counter()
                fn()
                got.append((time.perf_counter() - t0) * 1e6)
            if b:                                          # block 0 warms caches up
                cpu[label] += time.process_time() - c0
                samples[label] += got
    out = {}
    for label, xs in samples.items():
        xs.sort()
        out[label] = (xs[len(xs) // 2], xs[min(len(xs) - 1, int(len(xs) * 0.99))], cpu[label] * 1e6 / len(xs))
    return out


ROUND_DAYS = 15        # days of history committed per round of the commit path (20 debts: ~330 events a round)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--redis", default=os.environ.get("KEEL_REDIS_URL"))
    p.add_argument("--postgres", default=os.environ.get("KEEL_POSTGRES_DSN"))
    p.add_argument("--entities", type=int, default=20)
    p.add_argument("--days", type=int, default=730)
    p.add_argument("--cold-after", default="90d")
    p.add_argument("--reads", type=int, default=2000)
    p.add_argument("--private-redis", action="store_true", help="a redis-server of this run only")
    args = p.parse_args()
    if not (args.redis or args.private_redis) or not args.postgres:
        sys.exit("set KEEL_REDIS_URL and KEEL_POSTGRES_DSN (or --redis/--postgres, or --private-redis)")
    cartridge = load_cartridge(ROOT / "cartridges" / "finance")
    schema = f"bench_cold_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(args.postgres, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    dsn = args.postgres + ("&" if "?" in args.postgres else "?") + f"options=-csearch_path%3D{schema}"
    tmp = Path(tempfile.mkdtemp(prefix="keel-cold-bench-"))
    redis_proc = None
    if args.private_redis:
        redis_proc, args.redis = private_redis(tmp)
    start = dt.date.today() - dt.timedelta(days=args.days)
    events_file = tmp / "history.jsonl"
    events = history(events_file, args.entities, start, args.days)
    stores: dict[str, RedisStore] = {}
    try:
        for label in ("off", "on"):
            probe = RedisStore.from_url(args.redis, namespace=f"bcold{label}{uuid.uuid4().hex[:8]}")
            stores[label] = probe
        stores["on"].cold = ColdStore(dsn)
        print(f"{events:,} events: {args.entities} debts x {args.days} days of daily snapshots "
              f"(~{3 * args.days} fact versions per debt), dues monthly; load average {os.getloadavg()[0]:.2f}")
        for label, store in stores.items():
            t0, c0 = time.perf_counter(), time.process_time()
            report = build_embedded(cartridge, events_file, store=store)[1]
            assert not report.rejected, report.rejected[:3]
            print(f"  built '{label}' in {time.perf_counter() - t0:.1f}s ({(time.process_time() - c0) * 1e6 / events:.0f}"
                  f" CPU µs/event)")
        set_policy(stores["on"], args.cold_after)
        c0, t0 = time.process_time(), time.perf_counter()
        moved = Mover(cartridge, stores["on"], ArchiveOptions(once=True, quiet=True)).pass_once()
        print(f"  archive pass: {moved.summary()}; {time.perf_counter() - t0:.1f}s, "
              f"{(time.process_time() - c0) * 1e6 / max(events, 1):.1f} CPU µs per event of the history")

        print("\nRedis bytes per event (MEMORY USAGE of the tenant's keys)")
        sizes = {label: redis_bytes(s) for label, s in stores.items()}
        print(f"  {'':32}{'off':>12}{'on':>12}{'on/off':>9}")
        for kind in sizes["off"]:
            a, b = sizes["off"][kind] / events, sizes["on"][kind] / events
            print(f"  {kind:32}{a:>12.1f}{b:>12.1f}{(b / a if a else 0):>9.3f}")
        total_off, total_on = sum(sizes["off"].values()) / events, sum(sizes["on"].values()) / events
        print(f"  {'total':32}{total_off:>12.1f}{total_on:>12.1f}{total_on / total_off:>9.3f}   (goal <= 0.200)")
        for what, out in (("w/o change log", ("change log",)), ("w/o change log, ids", ("change log", "event ids and marks (e:)"))):
            a = sum(v for k, v in sizes["off"].items() if k not in out) / events
            b = sum(v for k, v in sizes["on"].items() if k not in out) / events
            print(f"  {'total ' + what:32}{a:>12.1f}{b:>12.1f}{b / a:>9.3f}")
        rows, text_bytes, disk_bytes = stores["on"].cold.sizes(stores["on"].namespace)   # type: ignore[union-attr]
        print(f"  PostgreSQL: {rows:,} segments, {text_bytes / events:.1f} B/event as text, "
              f"{disk_bytes / events:.1f} B/event stored (TOAST-compressed; table and index overhead not included)")
        rows, text_bytes, disk_bytes = stores["on"].cold.change_sizes(stores["on"].namespace)  # type: ignore[union-attr]
        print(f"  PostgreSQL: {rows:,} change-log chunks, {text_bytes / events:.1f} B/event as text, "
              f"{disk_bytes / events:.1f} B/event stored")

        gc.collect()
        gc.freeze()     # what the build left (a tools server holds none of it): keep full collections out of the reads
        rng = random.Random(7)
        cutoff_days = args.days - int(args.cold_after.rstrip("d")) - 5 if args.cold_after.endswith("d") else args.days // 2
        tools = {label: Tools(cartridge, s, TENANT) for label, s in stores.items()}

        def ent() -> str:
            return f"debt:d{rng.randrange(args.entities)}"

        def past_day() -> str:
            return (start + dt.timedelta(days=rng.randrange(1, max(2, cutoff_days)))).isoformat()
        print(f"\nreads in-process, {args.reads} calls each, in alternating blocks (p50 / p99 µs, CPU µs per call)")
        print(f"  {'':34}{'off':>26}{'on':>26}{'p99 on/off':>12}")
        on = stores["on"]
        cold = on.cold
        assert cold is not None
        gen = on.current_generation(TENANT)
        fields = sorted(f for f in on.client.hkeys(on.data_prefix(TENANT, gen) + "cz") if "|" in f)   # not `ch`
        pieces = [(f[:f.rindex("|")], int(f[f.rindex("|") + 1:])) for f in fields]
        got = interleaved({"on": lambda: cold.fetch(on.namespace, TENANT, gen, rng.sample(pieces, 2))}, args.reads)
        print(f"  {'cold tier fetch of 2 segments':34}{'':26}{got['on'][0]:>8.0f} /{got['on'][1]:>7.0f} "
              f"({got['on'][2]:>5.0f})")
        views = {label: (lambda label=label, at=None: stores[label].read_views(
            [ViewRequest(TENANT, ent())], at if at is not None else now_micros(), None)) for label in stores}
        for what, fn in (("store view now", lambda v: v()),
                         ("store view at a past day (cold)", lambda v: v(at=parse_time(past_day())))):
            got = interleaved({label: (lambda label=label, fn=fn: fn(views[label])) for label in ("off", "on")},
                              args.reads)
            a, b = got["off"], got["on"]
            print(f"  {what:34}{a[0]:>8.0f} /{a[1]:>7.0f} ({a[2]:>5.0f}){b[0]:>8.0f} /{b[1]:>7.0f} ({b[2]:>5.0f})"
                  f"{b[1] / a[1]:>12.2f}")
        length = on.change_page(TENANT, count=1).length
        for size in (1, 100):
            def page(label: str, size: int = size) -> object:
                return stores[label].change_page(TENANT, start=rng.randrange(length), generation=gen, count=size)
            got = interleaved({label: (lambda label=label: page(label)) for label in ("off", "on")}, args.reads)
            a, b = got["off"], got["on"]
            print(f"  {f'change page of {size} at any position':34}{a[0]:>8.0f} /{a[1]:>7.0f} ({a[2]:>5.0f})"
                  f"{b[0]:>8.0f} /{b[1]:>7.0f} ({b[2]:>5.0f}){b[1] / a[1]:>12.2f}")
        def uncached(t: Tools) -> object:
            t.store._views._folds.clear()          # type: ignore[attr-defined]   # every segment decoded again
            t.store._views._views.clear()          # type: ignore[attr-defined]   # and every view built again
            return t.context(ent())
        for what, call in (("context now", lambda t: t.context(ent())),
                           ("context now, no folds cached", uncached),
                           ("context at a past day (cold)", lambda t: t.context(ent(), at=past_day())),
                           ("context at, known_at", lambda t: t.context(ent(), at=past_day(),
                                                                               known_at=past_day()))):
            got = interleaved({label: (lambda label=label, call=call: call(tools[label])) for label in ("off", "on")},
                              args.reads)
            a, b = got["off"], got["on"]
            print(f"  {what:34}{a[0]:>8.0f} /{a[1]:>7.0f} ({a[2]:>5.0f}){b[0]:>8.0f} /{b[1]:>7.0f} ({b[2]:>5.0f})"
                  f"{b[1] / a[1]:>12.2f}")

        print(f"\ncommit path (embedded projector, one commit per event), 6 rounds of {ROUND_DAYS} more days each, "
              "alternated")
        rates: dict[str, list[tuple[float, float]]] = {"off": [], "on": []}
        totals = {"off": [0, 0.0, 0.0], "on": [0, 0.0, 0.0]}      # events, seconds, CPU seconds
        ratios = []
        for round_ in range(6):
            more = tmp / f"more{round_}.jsonl"
            n = history(more, args.entities, start, ROUND_DAYS, first_day=args.days + ROUND_DAYS * round_)
            for label in ("off", "on") if round_ % 2 == 0 else ("on", "off"):
                t0, c0 = time.perf_counter(), time.process_time()
                build_embedded(cartridge, more, store=stores[label])
                took, cpu = time.perf_counter() - t0, time.process_time() - c0
                rates[label].append((n / took, cpu * 1e6 / n))
                totals[label][0] += n
                totals[label][1] += took
                totals[label][2] += cpu
            ratios.append(rates["on"][-1][0] / rates["off"][-1][0])
        whole = {label: (t[0] / t[1], t[2] * 1e6 / t[0]) for label, t in totals.items()}
        print(f"  all rounds: off {whole['off'][0]:,.0f} events/s ({whole['off'][1]:.0f} CPU µs/event), on "
              f"{whole['on'][0]:,.0f} events/s ({whole['on'][1]:.0f}): on/off {whole['on'][0] / whole['off'][0]:.2f}")
        best = {label: max(r) for label, r in rates.items()}
        ratios.sort()
        print(f"  best off: {best['off'][0]:,.0f} events/s ({best['off'][1]:.0f} CPU µs/event); best on: "
              f"{best['on'][0]:,.0f} events/s ({best['on'][1]:.0f} CPU µs/event); on/off best {best['on'][0] / best['off'][0]:.2f}, "
              f"median of the rounds {(ratios[2] + ratios[3]) / 2:.2f} (goal >= 0.9)")
        print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        for store in stores.values():
            store.drop_namespace()
            store.close()
        with psycopg.connect(args.postgres, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
        if redis_proc is not None:
            redis_proc.terminate()
            redis_proc.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
