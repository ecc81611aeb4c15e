"""Search quality and cost, lexical only (BM25) next to hybrid (BM25 fused with the semantic signal), one run.

    .venv/bin/python bench/search_quality.py [--entities 10000] [--repeat 400] [--no-redis]

Quality: the labelled queries of QUERIES over the shipped sample cartridges (finance, appointments, fleet,
salon): Spanish and English words for what the labels say in the other language or in other words (synonyms),
words of an entity type's description, misspellings, and exact names as a control. Each query lists the
entities it is about; recall@5 is the share of them in the first five hits (of at most five of them: a query
about eight fill-ups is answered in full by five), MRR the mean of 1 / the rank of the first one (0 when none
is in the first ten). The `synonyms` row asks the same queries of cartridges given the SYNONYMS lists
(`search.synonyms` of cartridge.yaml), lexical only: what a cartridge's own list buys without the model.

Cost: `search` on one tenant of --entities entities (finance-like debts with creditor and product labels, a
third of them with a tenant note), queries cycling through words that hit a few, many and no entities;
CPU µs per call of this process (time.process_time, pooled over --repeat calls; p50 and p99), in-process
(memory store) and over Redis (KEEL_REDIS_URL; the Redis store's search_entities on every index build, the
query itself in-process either way). Semantic vectors live only in the reading process: Redis bytes per
entity are those of the graph, the same with and without them; the process memory the vectors take is
printed per entity.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from common import p50_p99

from keel import MemoryStore, Tools, load_cartridge
from keel.embedded import build_embedded
from keel.search import SearchIndex, SearchOptions
from keel.store.writes import fact_write, label_writes
from keel.times import parse_time

ROOT = Path(__file__).resolve().parents[1]
NOW = parse_time("2026-11-30T12:00:00Z")
TOP, DEPTH = 5, 10

# (cartridge, kind, query, entities it is about)
QUERIES: list[tuple[str, str, str, list[str]]] = [
    ("finance", "exact", "Banco Andino", ["debt:visa"]),
    ("finance", "exact", "Cooperativa Progreso", ["debt:libranza"]),
    ("finance", "synonym", "credit card", ["debt:visa"]),
    ("finance", "spanish", "tarjeta de crédito", ["debt:visa"]),
    ("finance", "synonym", "savings account", ["account:ahorros"]),
    ("finance", "spanish", "cuenta de ahorros", ["account:ahorros"]),
    ("finance", "synonym", "payroll account", ["account:nomina"]),
    ("finance", "synonym", "payroll loan", ["debt:libranza"]),
    ("finance", "synonym", "loans", ["debt:libranza", "debt:visa"]),
    ("finance", "description", "bank account", ["account:ahorros", "account:nomina"]),
    ("finance", "description", "scheduled instalment", ["due:visa-2026-09", "due:visa-2026-10", "due:visa-2026-11",
                                                        "due:libranza-2026-09", "due:libranza-2026-10"]),
    ("finance", "synonym", "installments", ["due:visa-2026-09", "due:visa-2026-10", "due:visa-2026-11",
                                            "due:libranza-2026-09", "due:libranza-2026-10"]),
    ("finance", "spanish", "hogar", ["household:hogar-demo"]),
    ("finance", "synonym", "our home", ["household:hogar-demo"]),
    ("finance", "misspelling", "vissa", ["debt:visa"]),
    ("finance", "misspelling", "libransa", ["debt:libranza"]),
    ("appointments", "exact", "Dentist check-up", ["appointment:dentist-1"]),
    ("appointments", "spanish", "dentista", ["appointment:dentist-1"]),
    ("appointments", "synonym", "dental visit", ["appointment:dentist-1"]),
    ("appointments", "spanish", "refinanciar la tarjeta", ["appointment:bank-1"]),
    ("appointments", "synonym", "doctor", ["provider:dr-rojas"]),
    ("appointments", "misspelling", "dentst", ["appointment:dentist-1"]),
    ("fleet", "exact", "Toyota Hilux", ["vehicle:KXTP-21"]),
    ("fleet", "spanish", "camión", ["vehicle:FDSW-73"]),
    ("fleet", "synonym", "lorry", ["vehicle:FDSW-73"]),
    ("fleet", "spanish", "furgoneta", ["vehicle:HJRL-58"]),
    ("fleet", "synonym", "pickup truck", ["vehicle:GZBY-64", "vehicle:KXTP-21"]),
    ("fleet", "synonym", "petrol station", [f"fuel_fill:F-200{i}" for i in range(1, 9)]),
    ("fleet", "spanish", "gasolinera", [f"fuel_fill:F-200{i}" for i in range(1, 9)]),
    ("fleet", "description", "fuel card", [f"fuel_fill:F-200{i}" for i in range(1, 9)]),
    ("fleet", "description", "workshop order", ["service:S-3001", "service:S-3002", "service:S-3003"]),
    ("fleet", "synonym", "maintenance", ["service:S-3001", "service:S-3002", "service:S-3003"]),
    ("fleet", "spanish", "conductor", [f"driver:D-10{i}" for i in range(1, 6)]),
    ("fleet", "description", "telematics", [f"trip:T-10{i:02d}" for i in range(1, 27)]),
    ("fleet", "misspelling", "Toyta Hilux", ["vehicle:KXTP-21"]),
    ("fleet", "misspelling", "Mercedez Sprinter", ["vehicle:HJRL-58"]),
    ("salon", "exact", "Inés Robles", ["stylist:ines-robles"]),
    ("salon", "synonym", "haircut", ["stylist:lucia-ferrer", "appointment:A-0004", "visit:V-0003"]),
    ("salon", "synonym", "hair dye", ["appointment:A-0012", "stylist:diego-navarro", "appointment:A-0002",
                                      "appointment:A-0008", "visit:V-0002", "visit:V-0011"]),
    ("salon", "synonym", "bridal hairstyle", ["stylist:ines-robles"]),
    ("salon", "synonym", "keratin", ["appointment:A-0007", "visit:V-0009"]),
    ("salon", "synonym", "highlights", ["appointment:A-0006", "visit:V-0004"]),
    ("salon", "synonym", "men's haircut", ["visit:V-0005", "visit:V-0007", "visit:V-0010", "visit:V-0012"]),
    ("salon", "description", "till ticket", [f"visit:V-00{i:02d}" for i in range(1, 16)]),
    ("salon", "misspelling", "Lucia Ferer", ["stylist:lucia-ferrer"]),
    ("salon", "misspelling", "keratna", ["appointment:A-0007", "visit:V-0009"]),
]

# What a cartridge could list in `search.synonyms` for the queries above (the `synonyms` row).
SYNONYMS: dict[str, list[list[str]]] = {
    "finance": [["credit card", "tarjeta de crédito", "visa"], ["savings", "ahorros"], ["payroll", "nomina",
                "libranza"], ["home", "hogar", "household"], ["instalment", "installments", "cuota", "due"],
                ["loans", "debt"]],
    "appointments": [["dentist", "dentista", "dental"], ["refinance", "refinanciar"], ["doctor", "dr"]],
    "fleet": [["truck", "camión", "lorry"], ["van", "furgoneta"], ["petrol station", "gasolinera", "station"],
              ["maintenance", "service"], ["driver", "conductor"]],
    "salon": [["haircut", "corte"], ["hair dye", "tinte", "color"], ["bridal", "novias"],
              ["keratin", "keratina"], ["highlights", "mechas"], ["men's haircut", "corte caballero"]],
}


def index_of(folder: Path, options: Callable[[Tools], SearchOptions]) -> tuple[SearchIndex, str]:
    """A built index over the sample cartridge's tenant with the options `options` makes of its Tools."""
    cartridge = load_cartridge(folder)
    projector, report = build_embedded(cartridge, folder / "events.jsonl")
    tenant = min(report.tenants)
    tools = Tools(cartridge, projector.store, tenant, clock=lambda: NOW)
    return SearchIndex(projector.store.search_entities(tenant), options(tools)), tenant


def quality() -> dict[str, dict[str, tuple[float, float]]]:
    """Per kind of query and in all: (recall@5, MRR) of lexical, hybrid, and lexical with SYNONYMS."""
    variants: dict[str, Callable[[Tools], SearchOptions]] = {
        "lexical": lambda t: t.search_options()._replace(semantic=False),
        "hybrid": lambda t: t.search_options(),
        "synonyms": lambda t: t.search_options()._replace(
            semantic=False, synonyms=tuple(tuple(g) for g in SYNONYMS[t.cartridge.name])),
    }
    indexes = {(name, v): index_of(ROOT / "cartridges" / name, make)[0]
               for name in SYNONYMS for v, make in variants.items()}
    sums: dict[str, dict[str, list[float]]] = {}
    for cartridge, kind, query, wanted in QUERIES:
        for v in variants:
            hits = [h["entity"] for h in indexes[cartridge, v].search(query, at=NOW, known_at=None, scopes=(),
                                                                       limit=DEPTH)]
            recall = len(set(hits[:TOP]) & set(wanted)) / min(len(wanted), TOP)
            rank = next((i for i, h in enumerate(hits, 1) if h in wanted), None)
            for group in (kind, "all"):
                row = sums.setdefault(group, {}).setdefault(v, [0.0, 0.0, 0.0])
                row[0] += recall
                row[1] += 1 / rank if rank else 0.0
                row[2] += 1
    return {g: {v: (r[0] / r[2], r[1] / r[2]) for v, r in row.items()} for g, row in sums.items()}


SYLLABLES = ["ka", "lu", "mo", "te", "sa", "ri", "po", "ne", "vi", "da", "gu", "ze", "ro", "mi", "ta", "bo"]


def tenant_events(store: Any, entities: int, seed: int = 46) -> None:
    """A finance-like tenant: debts labelled creditor, product and the holder's name, a third with a tenant
    note; every holder's name is a made-up word of its own (the worst case of the semantic side: one vector, one
    matrix row, per entity)."""
    rng = random.Random(seed)
    creditors = ["Banco Andino", "Cooperativa Progreso", "Banco del Sur", "Caja Rural", "Financiera Sol",
                 "Banco Pacífico", "Crédito Fácil", "Mutual Norte"]
    products = ["Visa", "Mastercard", "Libranza", "Crédito hipotecario", "Crédito de vehículo", "Préstamo personal",
                "Tarjeta de crédito", "Leasing", "Microcrédito", "Cuenta corriente"]
    notes = ["call the bank before the due date", "refinance when the rate drops", "pay in full this month",
             "negotiate a lower rate", "ask for the payoff letter"]
    t0 = NOW - 10**12
    batch: list[Any] = []
    for i in range(entities):
        holder = "".join(SYLLABLES[(i >> (4 * k)) % 16] for k in range(4)).capitalize() + " " + rng.choice(
            ["Quispe", "Rojas", "Mamani", "Soto", "Huanca", "Gil", "Ortiz", "Vidal"])
        batch += label_writes(f"debt:d{i}", None, {"creditor": rng.choice(creditors), "holder": holder,
                              "product": f"{rng.choice(products)} {i}"}, valid_from=t0, source=None,
                              evidence=None, recorded_at=t0 + i, by=None)
        if i % 3 == 0:
            batch.append(fact_write(f"debt:d{i}", "next_step", rng.choice(notes), t0, False, source=None,
                                    evidence=None, recorded_at=t0 + i, by=None, scope="tenant"))
        if len(batch) >= 2000 or i == entities - 1:
            store.apply_writes("t", batch)
            batch = []


QUERIES_COST = ["visa", "banco andino", "credit card", "refinance", "hipoteca", "zebra unicorn", "Crédito Fácil 42",
                "mortgage", "tarjeta", "d17"]


def cpu_us(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """(p50, p99) CPU µs of this process per call of `fn`."""
    samples = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        samples.append((time.process_time() - t0) * 1e6)
    return p50_p99(samples)


def finance_variant(semantic: bool) -> Path:
    """The finance cartridge, or a copy of it with `search: {semantic: false}` (lexical only)."""
    if semantic:
        return ROOT / "cartridges" / "finance"
    folder = Path(tempfile.mkdtemp(prefix="bench-search-")) / "finance"
    shutil.copytree(ROOT / "cartridges" / "finance", folder)
    doc = yaml.safe_load((folder / "cartridge.yaml").read_text(encoding="utf-8"))
    doc["search"] = {"semantic": False}
    (folder / "cartridge.yaml").write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
    return folder


def cost(store: Any, label: str, repeat: int) -> dict[str, Any]:
    """Index build and `Tools.search` CPU (the whole path: the store's search_version, the index, the result)
    of lexical and hybrid over `store`'s tenant `t`, the queries of the two cycled in the same order."""
    out: dict[str, Any] = {"store": label}
    for v, semantic in (("lexical", False), ("hybrid", True)):
        tools = Tools(load_cartridge(finance_variant(semantic)), store, "t", clock=lambda: NOW)
        t0 = time.process_time()
        tools.search("warm")                                      # builds the index (and loads the model)
        build = time.process_time() - t0
        index = tools._search_index()
        t0 = time.process_time()
        SearchIndex(store.search_entities("t"), tools.search_options(), previous=index)   # a rebuild
        rebuild = time.process_time() - t0
        turn = iter(range(1 << 62))
        p50, p99 = cpu_us(partial(lambda t, n: t.search(QUERIES_COST[next(n) % len(QUERIES_COST)]), tools, turn),
                          repeat)
        vectors = 0 if index.matrix is None else (index.matrix.nbytes + index.row_text.nbytes
                                                  + index.row_description.nbytes + index.row_scale.nbytes)
        out[v] = {"build_s": build, "rebuild_s": rebuild, "p50_us": p50, "p99_us": p99,
                  "vector_bytes_per_entity": vectors / len(index.names),
                  "texts": 0 if index.matrix is None else len(index.matrix)}
    return out


def redis_store(entities: int) -> tuple[Any, Any] | None:
    url = os.environ.get("KEEL_REDIS_URL")
    if not url:
        return None
    from keel.store.redis import RedisStore
    store = RedisStore.from_url(url, namespace=f"bsq{os.getpid()}")
    tenant_events(store, entities)
    return store, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entities", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=400)
    parser.add_argument("--no-redis", action="store_true")
    args = parser.parse_args()
    q = quality()
    print(f"{'queries':<12}{'n':>4}  {'recall@5 lexical':>16} {'hybrid':>7} {'synonyms':>9}   "
          f"{'MRR lexical':>11} {'hybrid':>7} {'synonyms':>9}")
    counts: dict[str, int] = {}
    for _, kind, _, _ in QUERIES:
        counts[kind] = counts.get(kind, 0) + 1
    counts["all"] = len(QUERIES)
    for group in [*sorted(k for k in q if k != "all"), "all"]:
        r = q[group]
        print(f"{group:<12}{counts[group]:>4}  {r['lexical'][0]:>16.2f} {r['hybrid'][0]:>7.2f} "
              f"{r['synonyms'][0]:>9.2f}   {r['lexical'][1]:>11.2f} {r['hybrid'][1]:>7.2f} {r['synonyms'][1]:>9.2f}")
    memory = MemoryStore()
    tenant_events(memory, args.entities)
    rows = [cost(memory, "memory", args.repeat)]
    if not args.no_redis:
        found = redis_store(args.entities)
        if found is None:
            print("KEEL_REDIS_URL is not set: no Redis row (--no-redis to leave it out on purpose)", file=sys.stderr)
        else:
            try:
                rows.append(cost(found[0], "redis", args.repeat))
            finally:
                found[0].drop_namespace()
    print(f"\nsearch on {args.entities:,} entities, CPU µs per call ({args.repeat} calls), index builds in CPU s")
    print(f"{'store':<8}{'p50 lexical':>12} {'hybrid':>8}  {'p99 lexical':>12} {'hybrid':>8} {'ratio':>6}  "
          f"{'build lex':>10} {'hybrid':>7} {'rebuild':>8}  {'vector B/entity':>16}")
    for r in rows:
        lx, hy = r["lexical"], r["hybrid"]
        print(f"{r['store']:<8}{lx['p50_us']:>12.0f} {hy['p50_us']:>8.0f}  {lx['p99_us']:>12.0f} "
              f"{hy['p99_us']:>8.0f} {hy['p99_us'] / lx['p99_us']:>5.2f}x  {lx['build_s']:>10.2f} "
              f"{hy['build_s']:>7.2f} {hy['rebuild_s']:>8.2f}  {hy['vector_bytes_per_entity']:>16.0f}")
    print(f"distinct texts embedded: {rows[0]['hybrid']['texts']:,}; Redis bytes per entity for the vectors: 0 "
          "(they live only in the reading process)")


if __name__ == "__main__":
    main()
