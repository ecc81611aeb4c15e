"""The five tools' latency: in-process (keel.Tools) and over MCP streamable HTTP (tools_server), on the
memory store and on Redis.

    .venv/bin/python bench/tools.py [--entities 10000] [--versions 100] [--calls 400] [--http-calls 150] [--rounds 5]
                                    [--redis URL] [--no-memory] [--no-http]

Graph: N debts, each with two labels, a relation to one of N/100 households, one rate fact and a balance
fact with V monthly versions (N x (V + 4) writes), written with the store write primitives
(`apply_writes`; `commit_batch` on Redis). Calls pick random debts and random world times.
Goals (issue 4): context p99 <= 2 ms in-process on Redis, <= 10 ms over MCP HTTP. The cost of rule verdicts
(issue 15): in-process context with the cartridge's rules evaluated vs the same rules without `when:`, in
interleaved rounds; the ratio of their p99s is printed.
Without --redis (or KEEL_REDIS_URL) the Redis rows are skipped. annotate is measured where a log exists:
the memory store's in-process log; on Redis it needs Kafka and a worker and is left out.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import random
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Self

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from keel import MemoryStore, Projector, Tools, load_cartridge
from keel.eventlog import FileLog
from keel.store.base import Store, Write, fact_write, label_writes, relation_write
from keel.times import parse_time

TENANT = "bench"
CREDITORS = ("Banco Andino", "Cooperativa Progreso", "Banco del Valle", "Financiera Sol")
PRODUCTS = ("Visa", "Mastercard", "Libranza", "Hipoteca", "Vehiculo", "Libre inversion")
START = parse_time("2000-01-01")
MONTH = 30 * 86400 * 1_000_000
GOALS = {("redis", "in-process", "context"): 2.0, ("redis", "mcp-http", "context"): 10.0}
Row = tuple[str, str, str, float, float, list[float]]


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
                    skip: Iterable[str], validate: bool) -> list[tuple[str, float, float]]:
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client
    out = []
    async with (httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as client,
                streamable_http_client(url, http_client=client) as (read, write),
                ClientSession(read, write) as session):
        await session.initialize()
        await session.list_tools()
        if not validate:        # the SDK client's jsonschema check of each result is a client cost
            async def no_check(name: str, result: Any) -> None:
                return None
            session.validate_tool_result = no_check  # type: ignore[method-assign]
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


class HttpChild:
    """`bench/tools.py --serve PORT`: tools_server's HTTP app in its own process, as `keel serve` runs it
    (a thread of this process would share the GIL with the client and add its switch interval)."""

    def __init__(self, args: argparse.Namespace, store: str, namespace: str | None) -> None:
        self.token = secrets.token_urlsafe(32)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.cmd = [sys.executable, __file__, "--serve", str(self.port), "--store", store,
                    "--entities", str(args.entities), "--versions", str(args.versions)]
        if namespace:
            self.cmd += ["--redis", args.redis, "--namespace", namespace]
        if args.sse:
            self.cmd.append("--sse")
        self.err = Path(tempfile.mkdtemp(prefix="keel-bench-")) / "serve.err"

    def __enter__(self) -> Self:
        import httpx2
        env = {**os.environ, "KEEL_BENCH_TOKEN": self.token}
        with self.err.open("wb") as err:
            self.proc = subprocess.Popen(self.cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=err)
        deadline = time.monotonic() + 900
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"the server process exited:\n{self.err.read_text(errors='replace')}")
            try:
                if httpx2.get(f"http://127.0.0.1:{self.port}/metrics", timeout=2).status_code == 200:
                    return self
            except httpx2.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the server process did not start")
            time.sleep(0.2)

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.err.parent, ignore_errors=True)


def serve(args: argparse.Namespace) -> None:
    """The --serve child: the same graph (memory: rebuilt; Redis: the parent's namespace) over HTTP."""
    from functools import partial

    from tools_server.backend import Backend
    from tools_server.config import Identity, ServerConfig
    from tools_server.http import run_server, serve_http
    from tools_server.server import build_server
    from tools_server.tokens import TokenTable, hash_token
    cartridge = load_cartridge(ROOT / "cartridges" / "finance")
    store: Store
    if args.store == "memory":
        store = MemoryStore()
        fill(store, args.entities, args.versions)
        backend = Backend(cartridge, store, FileLog(Projector(cartridge, store), None), blocking=False)
    else:
        from keel.store.redis import RedisStore
        store = RedisStore.from_url(args.redis, namespace=args.namespace)
        backend = Backend(cartridge, store, None, blocking=True)
    tokens = TokenTable({hash_token(os.environ["KEEL_BENCH_TOKEN"]): Identity(TENANT, "bench")})
    config = ServerConfig(backend, tokens=tokens, port=args.serve)
    run_server(partial(serve_http, build_server(config), config, json_response=not args.sse))


# ---- main ------------------------------------------------------------------------------------

def run_backend(label: str, store: Store, args: argparse.Namespace, rows: list[Row],
                namespace: str | None = None) -> None:
    cartridge = load_cartridge(ROOT / "cartridges" / "finance")
    ids = fill(store, args.entities, args.versions)
    if namespace is not None:
        waited = settle_redis(store.client)     # type: ignore[attr-defined]
        print(f"  Redis: append-only file rewritten after the fill, {waited:.1f}s (no background rewrite, "
              f"a fork busy for seconds, during the measurements)", file=sys.stderr)
    log = FileLog(Projector(cartridge, store), None) if label == "memory" else None
    skip = () if log is not None else ("annotate",)
    tools = Tools(cartridge, store, TENANT, agent="bench", log=log)
    gens = calls(ids, args.versions, random.Random(7))
    rows += by_rounds(label, "in-process", [in_process(tools, gens, args.calls, skip) for _ in range(args.rounds)])
    plain = Tools(without_conditions(cartridge), store, TENANT, agent="bench", log=log)
    both = {"context": gens["context"]}
    pairs = [(in_process(tools, both, args.calls, ()), in_process(plain, both, args.calls, ()))
             for _ in range(args.rounds)]
    rows += by_rounds(label, "verdicts", [p[0] for p in pairs])
    rows += [(s, "no-verdict", *rest) for s, _, *rest in by_rounds(label, "", [p[1] for p in pairs])]
    if args.http:
        with HttpChild(args, label, namespace) as server:
            got = [asyncio.run(over_http(server.url, server.token, gens, args.http_calls, skip, args.validate))
                   for _ in range(args.rounds)]
        rows += by_rounds(label, "mcp-http", got)


def without_conditions(cartridge: Any) -> Any:
    """The cartridge with its rules' `when:` removed: context then shows definitions and parameters only."""
    plain = load_cartridge(cartridge.path)
    plain.rules = {name: dataclasses.replace(r, when=None, program=None, names=None)
                   for name, r in plain.rules.items()}
    return plain


def by_rounds(store: str, path: str, rounds: list[list[tuple[str, float, float]]]) -> list[Row]:
    """One row per tool: the medians over the rounds of each round's p50 and p99, and every round's p99 (a round
    that met a burst of noise on the shared machine shows, without deciding the figure)."""
    rows = []
    for i, (tool, _, _) in enumerate(rounds[0]):
        p50s, p99s = [r[i][1] for r in rounds], [r[i][2] for r in rounds]
        rows.append((store, path, tool, statistics.median(p50s), statistics.median(p99s), p99s))
    return rows


def settle_redis(client: Any) -> float:
    """Rewrite Redis's append-only file now, and wait until no rewrite or snapshot runs: the fill grows the file
    enough to trigger an automatic rewrite, which would otherwise run during the measurements."""
    start = time.monotonic()
    info = client.info("persistence")
    if info.get("aof_enabled") and not info.get("aof_rewrite_in_progress"):
        client.bgrewriteaof()
    while True:
        info = client.info("persistence")
        if not (info.get("aof_rewrite_in_progress") or info.get("aof_rewrite_scheduled")
                or info.get("rdb_bgsave_in_progress")):
            return time.monotonic() - start
        time.sleep(0.1)


def report(rows: list[Row], args: argparse.Namespace) -> None:
    print(f"\n{args.entities:,} entities x {args.versions} versions; {args.rounds} rounds of {args.calls} calls per "
          f"tool in-process and {args.http_calls} over MCP HTTP; p50 and p99 are medians over the rounds (loopback, server in its own process, "
          f"{'SSE' if args.sse else 'JSON'} responses, client-side output validation "
          f"{'on' if args.validate else 'off'})\n")
    print(f"{'store':<7} {'path':<11} {'tool':<11} {'p50 ms':>8} {'p99 ms':>8}   goal")
    for store, path, tool, p50, p99, round_p99s in rows:
        goal = GOALS.get((store, path, tool))
        verdict = "" if goal is None else (f"p99 <= {goal:g} ms: {'met' if p99 <= goal else 'MISSED'} (rounds: "
                                           f"{' '.join(f'{x:.2f}' for x in round_p99s)})")
        print(f"{store:<7} {path:<11} {tool:<11} {p50:>8.3f} {p99:>8.3f}   {verdict}")
    ctx = {(r[0], r[1]): r for r in rows if r[2] == "context" and r[1] in ("verdicts", "no-verdict")}
    for store in sorted({k[0] for k in ctx}):
        on, off = ctx[(store, "verdicts")], ctx[(store, "no-verdict")]
        print(f"{store:<7} context with rule verdicts / without: p50 {on[3] / off[3]:.2f}, p99 {on[4] / off[4]:.2f}")
    for (store, path, tool), goal in GOALS.items():
        if not any(r[:3] == (store, path, tool) for r in rows):
            print(f"{store:<7} {path:<11} {tool:<11} {'-':>8} {'-':>8}   p99 <= {goal:g} ms: not run")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--entities", type=int, default=10_000)
    ap.add_argument("--versions", type=int, default=100)
    ap.add_argument("--calls", type=int, default=400, help="calls per tool and round in-process")
    ap.add_argument("--http-calls", type=int, default=150, help="calls per tool and round over MCP HTTP")
    ap.add_argument("--rounds", type=int, default=5, help="rounds; each figure is the median over them")
    ap.add_argument("--redis", default=os.environ.get("KEEL_REDIS_URL"), help="Redis URL (env KEEL_REDIS_URL)")
    ap.add_argument("--no-memory", dest="memory", action="store_false", help="skip the memory store")
    ap.add_argument("--no-http", dest="http", action="store_false", help="skip the MCP HTTP rows")
    ap.add_argument("--sse", action="store_true", help="HTTP: SSE responses instead of JSON bodies")
    ap.add_argument("--validate", action="store_true",
                    help="HTTP: let the SDK client validate each result against the output schema (client cost)")
    ap.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    ap.add_argument("--store", choices=("memory", "redis"), help=argparse.SUPPRESS)
    ap.add_argument("--namespace", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args)
        return
    rows: list[Row] = []
    if args.memory:
        run_backend("memory", MemoryStore(), args, rows)
    if args.redis:
        from keel.store.redis import RedisStore
        namespace = f"keelbench{secrets.token_hex(3)}"
        store = RedisStore.from_url(args.redis, namespace=namespace)
        try:
            print(f"Redis: namespace {namespace}")
            run_backend("redis", store, args, rows, namespace)
        finally:
            store.drop_namespace()          # its tenant and registry: no graph left behind
            store.close()
    else:
        print("  no --redis URL (or KEEL_REDIS_URL): Redis rows skipped", file=sys.stderr)
    report(rows, args)


if __name__ == "__main__":
    main()
