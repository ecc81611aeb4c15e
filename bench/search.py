"""Search quality and speed, the search before issue 13 (bench/search_legacy.py) next to today's.

    .venv/bin/python bench/search.py [--repeat 200] [--members 5000]

Rows:
* corpus: tests/corpus/directory (Spanish accents, Chinese and Japanese names, a rename, an entity valid only
  from next year, notes in tenant, agent and task scope), its queries.json: each query with the caller, `at`
  and `known_at`, and the entity expected first, or none expected (a former name today, a note another caller
  may not see). A hit: the expected entity ranked first, or nothing returned when none is expected.
* <cartridge>: each shipped cartridge's sample; every string label value of every entity is a query, a hit when
  that entity is among the first 3 (several entities may share a value).
* synthetic: --members members named from Spanish, Chinese and Japanese name pools plus a number; queries
  are given and family name (many members share them): the row measures speed, its hit rate says little.
Latency: p50/p99 in ms of one query on a built index, both searches alike (index builds reported apart; the
hit rates go through Tools.search, the whole path), in-process, memory store.
Goal (issue 13): hit rate 100% on the corpus; latency of the same order as before.
"""
from __future__ import annotations

import argparse
import json
import random
import time
from functools import partial
from pathlib import Path
from typing import Any

from common import percentiles
from search_legacy import LegacyIndex, documents

from keel import MemoryStore, Tools, load_cartridge
from keel.embedded import build_embedded
from keel.notes import NotePolicy
from keel.search import SearchIndex
from keel.times import parse_time

ROOT = Path(__file__).resolve().parents[1]
NOW = parse_time("2026-11-30T12:00:00Z")
Query = dict[str, Any]


def run(tools_for: Any, legacy: LegacyIndex, index: SearchIndex, queries: list[Query], repeat: int,
        top: int) -> dict[str, Any]:
    """Hit rates (through Tools.search, the whole path) and latencies of one index query (both searches alike,
    pooled over `repeat` calls cycling through the queries ({query, expect, agent?, task?, at?, known_at?})."""
    out: dict[str, Any] = {"queries": len(queries)}
    for name in ("old", "new"):
        calls, hits = [], 0
        for q in queries:
            if name == "old":
                found = [r["entity"] for r in legacy.search(q["query"], limit=10)]
                calls.append(partial(legacy.search, q["query"], limit=10))
            else:
                tools = tools_for(q.get("agent"), q.get("task"))
                results = tools.search(q["query"], at=q.get("at"), known_at=q.get("known_at"))["results"]
                found = [r["entity"] for r in results]
                calls.append(partial(index.search, q["query"], at=parse_time(q.get("at") or NOW),
                                     known_at=parse_time(q["known_at"]) if q.get("known_at") else None,
                                     scopes=NotePolicy.visible_scopes(task=q.get("task"), agent=q.get("agent"))))
            hits += (not found) if q["expect"] is None else q["expect"] in found[:top]
        p50, p99 = percentiles(cycle(calls), repeat)
        out[name] = {"hit_rate": hits / len(queries), "p50_ms": p50, "p99_ms": p99}
    return out


def cycle(calls: list[Any]) -> Any:
    """One function calling each of `calls` in turn."""
    turn = iter(range(1 << 62))
    return lambda: calls[next(turn) % len(calls)]()


def tools_factory(cartridge: Any, store: Any, tenant: str) -> Any:
    cache: dict[tuple[str | None, str | None], Tools] = {}

    def tools_for(agent: str | None, task: str | None) -> Tools:
        if (agent, task) not in cache:
            cache[agent, task] = Tools(cartridge, store, tenant, agent=agent, task=task, clock=lambda: NOW)
        return cache[agent, task]
    return tools_for


def timed_builds(store: Any, tenant: str) -> tuple[float, float, LegacyIndex, SearchIndex]:
    t0 = time.perf_counter()
    legacy = LegacyIndex(documents(store, tenant))
    t1 = time.perf_counter()
    index = SearchIndex(store.search_entities(tenant))
    t2 = time.perf_counter()
    return (t1 - t0) * 1000, (t2 - t1) * 1000, legacy, index


def sample_rows(folder: Path, events: Path, queries: list[Query] | None, repeat: int) -> dict[str, Any]:
    cartridge = load_cartridge(folder)
    projector, report = build_embedded(cartridge, events)
    tenant = min(report.tenants)
    tools_for = tools_factory(cartridge, projector.store, tenant)
    old_ms, new_ms, legacy, index = timed_builds(projector.store, tenant)
    top = 1
    if queries is None:
        top = 3
        queries = [{"query": value, "expect": entity}
                   for entity, _, labels in documents(projector.store, tenant)
                   for value in labels.values() if isinstance(value, str) and value.strip()]
    row = run(tools_for, legacy, index, queries, repeat, top)
    row["build_ms"] = {"old": round(old_ms, 2), "new": round(new_ms, 2)}
    return row


def synthetic(members: int, repeat: int) -> dict[str, Any]:
    rng = random.Random(13)
    given = ["José", "María", "Ángela", "Iñigo", "Nuño", "李", "王", "张", "さくら", "ハルト", "陽翔", "Zoë"]
    family = ["Núñez", "Pérez", "Gómez", "Peña", "小龙", "小明", "伟", "田中", "山本", "ヤマダ", "Müller", "Søren"]
    store, names = MemoryStore(), []
    for i in range(members):
        name = f"{rng.choice(given)} {rng.choice(family)}"
        names.append((name, f"member:m{i}"))
        name += f" {i}"
        store.upsert_entity("t", "member", f"m{i}", name=name, valid_from=NOW - 10**9, recorded_at=NOW - 10**9)
    cartridge = load_cartridge(ROOT / "tests" / "corpus" / "directory")
    tools_for = tools_factory(cartridge, store, "t")
    old_ms, new_ms, legacy, index = timed_builds(store, "t")
    queries = [{"query": name, "expect": entity} for name, entity in rng.sample(names, min(200, members))]
    row = run(tools_for, legacy, index, queries, repeat, 10)
    row["build_ms"] = {"old": round(old_ms, 2), "new": round(new_ms, 2)}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=2000, help="query calls per row and search (spread)")
    parser.add_argument("--members", type=int, default=5000)
    args = parser.parse_args()
    corpus = ROOT / "tests" / "corpus" / "directory"
    rows = {"corpus": sample_rows(corpus, corpus / "events.jsonl",
                                  json.loads((corpus / "queries.json").read_text(encoding="utf-8")), args.repeat)}
    for folder in sorted(p.parent for p in (ROOT / "cartridges").glob("*/cartridge.yaml")):
        rows[folder.name] = sample_rows(folder, folder / "events.jsonl", None, args.repeat)
    rows["synthetic"] = synthetic(args.members, args.repeat)
    print(f"{'row':<12}{'queries':>8}  {'hit old':>8} {'hit new':>8}  {'p50 old':>8} {'p50 new':>8}  "
          f"{'p99 old':>8} {'p99 new':>8}  {'build old':>9} {'build new':>9}   (ms)")
    for name, r in rows.items():
        o, n = r["old"], r["new"]
        print(f"{name:<12}{r['queries']:>8}  {o['hit_rate']:>8.0%} {n['hit_rate']:>8.0%}  {o['p50_ms']:>8.3f} "
              f"{n['p50_ms']:>8.3f}  {o['p99_ms']:>8.3f} {n['p99_ms']:>8.3f}  {r['build_ms']['old']:>9.1f} "
              f"{r['build_ms']['new']:>9.1f}")


if __name__ == "__main__":
    main()
