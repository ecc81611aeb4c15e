"""Typed decoding benchmark: envelope parsing with the msgspec fast path against pydantic alone, side by side.

    .venv/bin/python bench/decode.py [--events 200000] [--tenants 100] [--rounds 5]

Both paths run in the same process on the same lines, in alternating rounds, and each figure is the median of
its rounds (CPU time, `process_time`, the collector off as in the replay):
- parse: `Catalog.parse` of every line (full checks: envelope, times, payload), pydantic-only
  (`Catalog(cartridge, typed_decoding=False)`) against the default (msgspec first, pydantic on refusal);
- embedded replay: `replay_file` of the same lines into the memory store with either catalog.
Both paths must build the same events: every line's canonical envelope and content hash are compared first.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from common import finance_events, lines
from embedded import cpu_of

from keel import MemoryStore, Projector, load_cartridge
from keel.embedded import replay_file
from keel.envelope import Catalog


def parse_all(catalog: Catalog, raw: list[bytes]) -> None:
    parse = catalog.parse
    for line in raw:
        parse(line, default_recorded_at=0)


def replay(cartridge, path: Path, *, typed: bool) -> Projector:
    projector = Projector(cartridge, MemoryStore())
    projector.catalog = Catalog(cartridge, typed_decoding=typed)
    report = replay_file(projector, path)
    assert not report.rejected, report.rejected[:3]
    return projector


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--tenants", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    cartridge = load_cartridge(ROOT / "cartridges" / "finance")
    raw = lines(finance_events(args.events, args.tenants))
    n = len(raw)
    paths = {"pydantic only": False, "msgspec fast path": True}
    catalogs = {name: Catalog(cartridge, typed_decoding=typed) for name, typed in paths.items()}
    parse: dict[str, list[float]] = {name: [] for name in paths}
    replays: dict[str, list[float]] = {name: [] for name in paths}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "events.jsonl"
        path.write_bytes(b"\n".join(raw) + b"\n")
        seen = [[(e.to_envelope(), e.content_hash()) for e in map(partial(c.parse, default_recorded_at=0), raw)]
                for c in catalogs.values()]
        assert seen[0] == seen[1], "the two paths parsed some line differently"
        del seen
        for _ in range(args.rounds):
            for name, typed in paths.items():
                parse[name].append(cpu_of(lambda c=catalogs[name]: parse_all(c, raw)) / n * 1e6)
                replays[name].append(cpu_of(lambda t=typed: replay(cartridge, path, typed=t)) / n * 1e6)
    fig = {name: (statistics.median(parse[name]), statistics.median(replays[name])) for name in paths}
    (p0, r0), (p1, r1) = fig["pydantic only"], fig["msgspec fast path"]
    print(f"{n:,} finance events over {args.tenants} tenants, median of {args.rounds} alternating rounds, "
          f"µs of CPU per event")
    for name, (p, r) in fig.items():
        print(f"  {name:<18} parse {p:5.2f}   embedded replay {r:5.2f}")
    print(f"ratio msgspec/pydantic: parse {p1 / p0:.2f}, embedded replay {r1 / r0:.2f} "
          f"(saves {p0 - p1:.2f} µs/event of parsing, {r0 - r1:.2f} µs/event of replay)")


if __name__ == "__main__":
    main()
