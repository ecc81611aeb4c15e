"""Embedded benchmark: replay throughput into the memory store, and tool latency vs version count.

    .venv/bin/python bench/embedded.py [--events 200000] [--tenants 100]

The replay is timed next to a fixed plain reference computation on the same lines in the same run
(`json.loads`, then the same writes appended to per-key lists of a dict: no checks, no timelines), and
through the public CLI (`keel digest --events`, process start included), so that the figures can be
compared across machines and loads by their ratios.

Goals (2-core machine): replay >= 50,000 events/s; context p99 <= 1 ms; an entity with 100,000 versions
no more than 2x slower than one with 1,000 (as-of lookups bisect, they do not scan).
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

from common import finance_events, finance_writes, lines, percentiles, version_point
from support.twins import python_twin

from keel import MemoryStore, Projector, Tools, load_cartridge
from keel.embedded import replay_file
from keel.eventlog import FileLog

ROUNDS = 5


def reference(raw: list[bytes]) -> dict[str, list[tuple]]:
    """The fixed plain computation the replay is compared with: parse each line, append its writes (value and
    provenance at the version's point) to per-key lists. What any projection of these events must at least do."""
    graph: dict[str, list[tuple]] = {}
    for line in raw:
        e = json.loads(line)
        version = (version_point(e), e["id"], e.get("source"), e.get("recorded_at"), e.get("by"))
        for key, value in finance_writes(e):
            graph.setdefault(key, []).append((value, *version))
    return graph


def cpu_of(fn) -> float:
    """CPU seconds of one call, with the collector off as the replay has it (keel.embedded.bulk_allocation)."""
    gc.collect()
    gc.disable()
    try:
        c0 = time.process_time()
        result = fn()
        spent = time.process_time() - c0
        del result                  # freeing it is not part of the figure (the replay's graph is kept too)
        return spent
    finally:
        gc.enable()


def deep_entity(projector: Projector, tenant: str, versions: int) -> str:
    """A debt with `versions` monthly snapshots (one fact version per predicate per snapshot)."""
    debt = f"deep{versions}"
    for i in range(versions):
        y, m = divmod(i, 12)
        day = f"{1000 + y:04d}-{m + 1:02d}-01"
        projector.apply_raw({"id": f"{debt}-{i}", "tenant": tenant, "type": "debt.snapshot",
                             "subject": f"debt:{debt}", "occurred_at": day,
                             "payload": {"creditor": "Banco Andino", "product": "Visa", "balance_cop": 1000 + i,
                                         "rate_ea_pct": 20.5, "installment_cop": 100, "month": day[:7]}})
    return f"debt:{debt}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--tenants", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=1000, help="calls per latency figure and round")
    args = ap.parse_args()
    cartridge = load_cartridge(ROOT / "cartridges" / "finance")

    raw = lines(finance_events(args.events, args.tenants))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events.jsonl"
        path.write_bytes(b"\n".join(raw) + b"\n")
        ref_cpu = [cpu_of(lambda: reference(raw))]
        projector = Projector(cartridge, MemoryStore())
        t0, c0 = time.perf_counter(), time.process_time()
        report = replay_file(projector, path)       # the embedded path: read, check, handle, store
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        ref_cpu.append(cpu_of(lambda: reference(raw)))
        twin = load_cartridge(python_twin(ROOT / "cartridges" / "finance", Path(tmp)))
        twin_cpu = cpu_of(lambda: replay_file(Projector(twin, MemoryStore()), path))
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "keel.cli", "digest", str(ROOT / "cartridges" / "finance"),
                               "--events", str(path), "--tenant", "tenant-00000"], capture_output=True, text=True,
                              check=False, cwd=ROOT)
        cli = time.perf_counter() - t0
    assert report.applied == len(raw) and not report.rejected
    assert done.returncode == 0, done.stderr
    rate, per_event, ref = len(raw) / elapsed, cpu / len(raw) * 1e6, min(ref_cpu) / len(raw) * 1e6
    print(f"replay: {len(raw):,} events over {args.tenants} tenants in {elapsed:.2f}s = {rate:,.0f} events/s "
          f"({len(raw) / cpu:,.0f} per CPU-second, {per_event:.1f} µs CPU/event) (goal >= 50,000; ratio "
          f"{rate / 50_000:.2f})")
    print(f"reference computation (json.loads + the same writes appended to per-key lists, no checks): "
          f"{ref:.1f} µs CPU/event; ratio replay/reference {per_event / ref:.2f}")
    print(f"the same replay with the Python handlers the finance projections replaced (tests/data/python_handlers): "
          f"{twin_cpu / len(raw) * 1e6:.1f} µs CPU/event; ratio declarative/Python {cpu / twin_cpu:.2f}")
    print(f"through the CLI, `keel digest --events` (process start included): {cli:.2f}s = "
          f"{len(raw) / cli:,.0f} events/s")
    # The replay runs without automatic garbage collection (keel.embedded.bulk_allocation); show what one full
    # collection over the graph it built costs, so that skipped work is visible rather than hidden.
    t0 = time.perf_counter()
    gc.collect()
    collect = time.perf_counter() - t0
    print(f"  a full collection after the replay (not in the figure above): {collect:.2f}s "
          f"= {collect / len(raw) * 1e6:.1f} us per event")
    del projector
    gc.collect()

    # Both graphs stay alive and their calls are measured in alternating rounds, so that both sizes meet the
    # same machine noise; each figure is the median over the rounds of that round's p50 and p99.
    graphs = {}
    for versions in (1_000, 100_000):
        tenant = f"deep-{versions}"
        store = MemoryStore()
        p = Projector(cartridge, store)
        entity = deep_entity(p, tenant, versions)
        tools = Tools(cartridge, store, tenant, log=FileLog(p, None))
        graphs[versions] = (tools, entity, f"{1000 + versions // 24:04d}-06-15")
    gc.collect()
    gc.freeze()     # long-lived graphs: keep the collector from rescanning them (as `keel serve` does)
    rounds: dict[int, dict[str, list[tuple[float, float]]]] = {v: {} for v in graphs}
    for _ in range(ROUNDS):
        for versions, (tools, entity, mid) in graphs.items():
            calls = {
                "context now": (partial(tools.context, entity), args.repeat),
                "context at": (partial(tools.context, entity, at=mid), args.repeat),
                "context known_at": (partial(tools.context, entity, at=mid, known_at=mid), 4),
                "history 1 predicate": (partial(tools.history, entity, "balance_cop"), 3),
                "search": (partial(tools.search, "visa banco"), args.repeat),
            }
            for name, (fn, repeat) in calls.items():
                rounds[versions].setdefault(name, []).append(percentiles(fn, repeat))
    figures = {versions: {name: (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs))
                          for name, rs in by_name.items()} for versions, by_name in rounds.items()}
    for versions, fig in figures.items():
        for name, (p50, p99) in fig.items():
            print(f"{versions:>7,} versions  {name:<20} p50 {p50:8.3f} ms  p99 {p99:8.3f} ms")
    print("ratios 100,000 vs 1,000 versions (goal for as-of lookups <= 2.0):")
    for name in figures[1_000]:
        r = figures[100_000][name][1] / figures[1_000][name][1]
        note = "" if name.startswith(("context now", "context at")) else \
            "  (returns or scans every version: linear by definition)"
        print(f"  {name:<20} p99 ratio {r:6.2f}{note}")
    p99 = figures[1_000]["context now"][1]
    print(f"context p99 {p99:.3f} ms (goal <= 1 ms; ratio {p99 / 1.0:.2f} of the ceiling)")


if __name__ == "__main__":
    main()
