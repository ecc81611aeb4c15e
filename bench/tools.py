"""The five tools' latency: in-process (keel.Tools) and over MCP streamable HTTP (tools_server), on the
memory store and on Redis.

    .venv/bin/python bench/tools.py [--entities 10000] [--versions 100] [--calls 1000] [--http-calls 300]
                                    [--redis URL] [--no-memory] [--no-http]

Graph: N debts, each with two labels, a relation to one of N/100 households, one rate fact and a balance
fact with V monthly versions (N x (V + 4) writes), written with the store write primitives
(`apply_writes`; `commit_batch` on Redis). Calls pick random debts and random world times.
Goals (issue 4): context p99 <= 2 ms in-process on Redis, <= 10 ms over MCP HTTP.
Without --redis (or KEEL_REDIS_URL) the Redis rows are skipped. annotate is measured where a log exists:
the memory store's in-process log; on Redis it needs Kafka and a worker and is left out.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import secrets
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from keel import MemoryStore, Projector, Tools, load_cartridge  # noqa: E402
from keel.eventlog import FileLog  # noqa: E402
from keel.store.base import Store, Write, fact_write, label_writes, relation_write  # noqa: E402
from keel.times import parse_time  # noqa: E402

TENANT = "bench"
CREDITORS = ("Banco Andino", "Cooperativa Progreso", "Banco del Valle", "Financiera Sol")
PRODUCTS = ("Visa", "Mastercard", "Libranza", "Hipoteca", "Vehiculo", "Libre inversion")
START = parse_time("2000-01-01")
MONTH = 30 * 86400 * 1_000_000
GOALS = {("redis", "in-process", "context"): 2.0, ("redis", "mcp-http", "context"): 10.0}
Row = tuple[str, str, str, float, float]


# ---- the graph -------------------------------------------------------------------------------

def entity_writes(i: int, versions: int, households: int) -> tuple[str, list[Write]]:
    entity = f"debt:d{i:05d}"
    prov: dict[str, Any] = {"source": "bench", "evidence": f"bench-{i}", "recorded_at": None, "by": None}
    writes = label_writes(entity, f"debts#d{i:05d}", {"creditor": CREDITORS[i % 4], "product": PRODUCTS[i % 6]},
                          valid_from=START, **prov)
    writes.append(relation_write(entity, "owed_by", f"household:h{i % households:04d}", START, False, **prov))
    writes.append(fact_write(entity, "rate_ea_pct", 10 + i % 25, START, False, **prov))
    writes += [fact_write(entity, "balance_cop", 1_000_000 + 1000 * v + i, START + v * MONTH, False, **prov)
               for v in range(versions)]
    return entity, writes


def fill(store: Store, entities: int, versions: int) -> list[str]:
    """Write the graph; prints the time taken. Returns the debt ids."""
    households = max(1, entities // 100)
    ids: list[str] = []
    commit = getattr(store, "commit_batch", None)
    pending: list[tuple[list[Write], str]] = []
    t0 = time.perf_counter()
    for i in range(entities):
        entity, writes = entity_writes(i, versions, households)
        ids.append(entity)
        if commit is None:
            store.apply_writes(TENANT, writes, f"bench-{i}")
            continue
        pending.append((writes, f"bench-{i}"))
        if len(pending) >= 20:
            commit(TENANT, pending, None)
            pending = []
    if pending and commit is not None:
        commit(TENANT, pending, None)
    took = time.perf_counter() - t0
    total = entities * (versions + 4)
    print(f"  filled {type(store).__name__}: {entities} entities x {versions} versions = {total:,} writes "
          f"in {took:.1f} s ({total / took:,.0f} writes/s)", file=sys.stderr)
    return ids


# ---- the calls -------------------------------------------------------------------------------

def calls(ids: list[str], versions: int, rng: random.Random) -> dict[str, Callable[[], tuple[str, dict[str, Any]]]]:
    """Per tool, a generator of (tool, arguments) with random debts and times."""
    def at() -> str:
        t = START + rng.randrange(versions) * MONTH + 86400_000_000
        return time.strftime("%Y-%m-%d", time.gmtime(t / 1e6))
    words = [f"{p} {c.split()[-1]}" for p in PRODUCTS for c in CREDITORS]
    notes = iter(range(10**9))
    return {
        "context": lambda: ("context", {"entity": rng.choice(ids)}),
        "context@at": lambda: ("context", {"entity": rng.choice(ids), "at": at()}),
        "history": lambda: ("history", {"entity": rng.choice(ids), "predicate": "balance_cop"}),
        "search": lambda: ("search", {"query": rng.choice(words), "limit": 10}),
        "related": lambda: ("related", {"entity": rng.choice(ids)}),
        "annotate": lambda: ("annotate", {"entity": rng.choice(ids), "predicate": "bench_note",
                                          "value": f"note {next(notes)}", "scope": "agent"}),
    }


def invoke(tools: Tools, tool: str, args: dict[str, Any]) -> Any:
    if tool == "related":
        return tools.related(args["entity"], relation=args.get("relation"), at=args.get("at"))
    if tool == "annotate":
        return tools.annotate(args["entity"], args["predicate"], args["value"], args["scope"])
    return getattr(tools, tool)(**args)


def pcts(samples: list[float]) -> tuple[float, float]:
    samples.sort()
    return samples[len(samples) // 2], samples[min(len(samples) - 1, int(len(samples) * 0.99))]


def in_process(tools: Tools, gens: dict[str, Callable[[], tuple[str, dict[str, Any]]]], n: int,
               skip: Iterable[str]) -> list[tuple[str, float, float]]:
    out = []
    for name, gen in gens.items():
        if name in skip:
            continue
        for _ in range(min(50, n)):             # warm-up (builds the search index once)
            invoke(tools, *gen())
        samples = []
        for _ in range(n):
            tool, args = gen()
            t0 = time.perf_counter()
            invoke(tools, tool, args)
            samples.append((time.perf_counter() - t0) * 1000)
        out.append((name, *pcts(samples)))
    return out


async def over_http(url: str, token: str, gens: dict[str, Callable[[], tuple[str, dict[str, Any]]]], n: int,
                    skip: Iterable[str]) -> list[tuple[str, float, float]]:
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    out = []
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as client:
        async with streamable_http_client(url, http_client=client) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                await session.list_tools()
                for name, gen in gens.items():
                    if name in skip:
                        continue
                    for _ in range(min(20, n)):
                        await session.call_tool(*gen())
                    samples = []
                    for _ in range(n):
                        tool, args = gen()
                        t0 = time.perf_counter()
                        result = await session.call_tool(tool, args)
                        samples.append((time.perf_counter() - t0) * 1000)
                        if result.is_error:
                            raise SystemExit(f"{tool} failed over HTTP: {result.content[0].text}")
                    out.append((name, *pcts(samples)))
    return out


class HttpThread:
    """tools_server's HTTP app on a loopback port, in a thread of this process (it shares the store)."""

    def __init__(self, backend: Any, tenant: str) -> None:
        import uvicorn

        from tools_server.auth import TokenTable, hash_token
        from tools_server.config import Identity, ServerConfig
        from tools_server.http import http_app
        from tools_server.server import build_server
        self.token = secrets.token_urlsafe(32)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        config = ServerConfig(backend, tokens=TokenTable({hash_token(self.token): Identity(tenant, "bench")}),
                              port=port)
        app = http_app(build_server(config), config)
        self.url = f"http://127.0.0.1:{port}/mcp"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                                    access_log=False, lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> HttpThread:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline:
                raise SystemExit("the HTTP server did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


# ---- main ------------------------------------------------------------------------------------

def run_backend(label: str, store: Store, args: argparse.Namespace, rows: list[Row]) -> None:
    from tools_server.backend import Backend
    cartridge = load_cartridge(ROOT / "cartridges" / "finance")
    ids = fill(store, args.entities, args.versions)
    log = FileLog(Projector(cartridge, store), None) if label == "memory" else None
    skip = () if log is not None else ("annotate",)
    tools = Tools(cartridge, store, TENANT, agent="bench", log=log)
    gens = calls(ids, args.versions, random.Random(7))
    rows += [(label, "in-process", *r) for r in in_process(tools, gens, args.calls, skip)]
    if args.http:
        backend = Backend(cartridge, store, log, blocking=label != "memory")
        with HttpThread(backend, TENANT) as server:
            got = asyncio.run(over_http(server.url, server.token, gens, args.http_calls, skip))
        rows += [(label, "mcp-http", *r) for r in got]


def report(rows: list[Row], args: argparse.Namespace) -> None:
    print(f"\n{args.entities:,} entities x {args.versions} versions; {args.calls} calls per tool in-process, "
          f"{args.http_calls} over MCP HTTP (streamable HTTP, SSE responses, loopback, server in-process)\n")
    print(f"{'store':<7} {'path':<11} {'tool':<11} {'p50 ms':>8} {'p99 ms':>8}   goal")
    for store, path, tool, p50, p99 in rows:
        goal = GOALS.get((store, path, tool))
        verdict = "" if goal is None else f"p99 <= {goal:g} ms: {'met' if p99 <= goal else 'MISSED'}"
        print(f"{store:<7} {path:<11} {tool:<11} {p50:>8.3f} {p99:>8.3f}   {verdict}")
    for (store, path, tool), goal in GOALS.items():
        if not any(r[:3] == (store, path, tool) for r in rows):
            print(f"{store:<7} {path:<11} {tool:<11} {'-':>8} {'-':>8}   p99 <= {goal:g} ms: not run")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entities", type=int, default=10_000)
    ap.add_argument("--versions", type=int, default=100)
    ap.add_argument("--calls", type=int, default=1000, help="calls per tool in-process")
    ap.add_argument("--http-calls", type=int, default=300, help="calls per tool over MCP HTTP")
    ap.add_argument("--redis", default=os.environ.get("KEEL_REDIS_URL"), help="Redis URL (env KEEL_REDIS_URL)")
    ap.add_argument("--no-memory", dest="memory", action="store_false", help="skip the memory store")
    ap.add_argument("--no-http", dest="http", action="store_false", help="skip the MCP HTTP rows")
    args = ap.parse_args()
    rows: list[Row] = []
    if args.memory:
        run_backend("memory", MemoryStore(), args, rows)
    if args.redis:
        from keel.store.redis import RedisStore
        store = RedisStore.from_url(args.redis, namespace=f"keelbench{secrets.token_hex(3)}")
        try:
            run_backend("redis", store, args, rows)
        finally:
            store.drop_tenant(TENANT)
            store.close()
    else:
        print("  no --redis URL (or KEEL_REDIS_URL): Redis rows skipped", file=sys.stderr)
    report(rows, args)


if __name__ == "__main__":
    main()
