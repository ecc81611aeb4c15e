"""`keel serve --transport http` under load: calls/s, p50/p99 and the server's CPU per call at N clients, and
the memory of abandoned sessions before and after they expire.

    .venv/bin/python bench/serve_load.py [--clients 50] [--seconds 15] [--warmup 3] [--rounds 2]
                                         [--modes sessions,stateless] [--baseline REV] [--redis URL | --embedded]
    .venv/bin/python bench/serve_load.py --sessions 3000 [--idle-timeout 20]

Each mode is one `keel serve` process (a subprocess, as deployed) started with that mode's flags; the clients
run in another process (aiohttp, one connection per client, each client sends its next call when the last one
answered): `tools/call context` on the finance sample's entities, one token per client. Modes:
  sessions   today's default: a session per client (initialize once), JSON bodies
  sse        the same with --sse (each answer an SSE stream)
  stateless  --stateless: no session, every POST stands alone (what a load balancer needs)
  before     `keel serve` in its default mode, from the commit given by --baseline REV (extracted with git
             archive into a temporary folder), so the code before a change runs beside it in the same run
  before-stateless   the same commit with --stateless (and the limits raised, as for this code's modes)
Rounds alternate the modes. Printed per mode: calls/s, p50 and p99 latency seen by the clients, the server's
CPU (utime + stime of its pid from /proc) per call, and calls per second of server CPU (calls per core). The
client and the server share the machine's cores, so calls/s is bound by both; calls per core is the server's.

--sessions N: opens N sessions (initialize, never closed) against a server with --session-idle-timeout
--idle-timeout, and prints the server's RSS before, after opening them and after they expired, and
keel_mcp_sessions from /metrics at each step.

Data: the finance sample moved to a private tenant; on Redis (--redis or KEEL_REDIS_URL) it is written to the
cartridge's namespace and the tenant is dropped at the end; --embedded (or no Redis URL) serves an events file.
"""
from __future__ import annotations

import argparse
import asyncio
import json
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
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FINANCE = ROOT / "cartridges" / "finance"
PROTOCOL = "2025-06-18"
MODERN = "2026-07-28"       # the SDK's single-exchange protocol: no session, no initialize, _meta per request
ENTITIES = ("debt:visa", "debt:libranza", "due:visa-2026-09", "due:visa-2026-10", "due:visa-2026-11",
            "due:libranza-2026-09", "household:{tenant}")
MODES: dict[str, list[str]] = {"sessions": [], "sse": ["--sse"], "stateless": ["--stateless"], "before": [],
                                "before-stateless": ["--stateless"], "modern": []}
CLIENTS = {"sessions": "sessions", "sse": "sessions", "before": "sessions", "stateless": "stateless",
           "before-stateless": "stateless", "modern": "modern"}
BEFORE = ("before", "before-stateless")      # modes run from the --baseline commit
CLOCK = os.sysconf("SC_CLK_TCK")


# ---- the client process -----------------------------------------------------------------------------

def _headers(token: str, session: str | None = None, protocol: str = PROTOCOL) -> dict[str, str]:
    h = {"content-type": "application/json", "accept": "application/json, text/event-stream",
         "authorization": f"Bearer {token}", "mcp-protocol-version": protocol}
    if session:
        h["mcp-session-id"] = session
    return h


def _answer(text: str) -> dict[str, Any]:
    """The JSON-RPC message of a JSON body or of an SSE stream's data line."""
    if text.startswith("{"):
        return json.loads(text)
    for line in text.splitlines():
        if line.startswith("data:") and line[5:].strip():
            return json.loads(line[5:])
    raise ValueError("no JSON-RPC message in the answer")


async def _open_session(http: Any, url: str, token: str) -> str:
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "load", "version": "1"}}}
    async with http.post(url, json=init, headers=_headers(token)) as r:
        body = await r.text()
        if r.status != 200:
            raise RuntimeError(f"initialize answered {r.status}: {body[:200]}")
        session = r.headers["mcp-session-id"]
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    async with http.post(url, json=note, headers=_headers(token, session)) as r:
        await r.read()
    return session


async def _load(url: str, tokens: list[str], tenant: str, seconds: float, warmup: float, kind: str) -> dict:
    import aiohttp
    entities = [e.format(tenant=tenant) for e in ENTITIES]
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    errors: list[str] = []
    state = {"measure": False, "stop": False}

    async def client(i: int, http: Any) -> None:
        token = tokens[i]
        session = await _open_session(http, url, token) if kind == "sessions" else None
        headers = _headers(token, session, MODERN if kind == "modern" else PROTOCOL)
        params: dict[str, Any] = {"name": "context"}
        if kind == "modern":
            headers.update({"mcp-method": "tools/call", "mcp-name": "context"})
            params["_meta"] = {"io.modelcontextprotocol/protocolVersion": MODERN,
                               "io.modelcontextprotocol/clientCapabilities": {}}
        rng = random.Random(i)
        n = 0
        while not state["stop"]:
            n += 1
            call = {"jsonrpc": "2.0", "id": n, "method": "tools/call",
                    "params": {**params, "arguments": {"entity": rng.choice(entities)}}}
            start = time.perf_counter()
            async with http.post(url, json=call, headers=headers) as r:
                text = await r.text()
                status = r.status
            took = time.perf_counter() - start
            if not state["measure"]:
                continue
            statuses[str(status)] = statuses.get(str(status), 0) + 1
            latencies.append(took)
            if status != 200:
                errors.append(f"{status}: {text[:120]}")
                continue
            message = _answer(text)
            if "error" in message or message["result"].get("isError"):
                errors.append(text[:200])

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as http:
        tasks = [asyncio.create_task(client(i, http)) for i in range(len(tokens))]
        await asyncio.sleep(warmup)
        for t in tasks:
            if t.done():
                t.result()          # a client that failed to start raises here
        print("GO", flush=True)       # the parent reads the server's CPU now
        state["measure"] = True
        start = time.perf_counter()
        await asyncio.sleep(seconds)
        state["measure"] = False
        elapsed = time.perf_counter() - start
        print("STOP", flush=True)
        state["stop"] = True
        await asyncio.gather(*tasks)
    latencies.sort()
    return {"calls": len(latencies), "elapsed": elapsed, "statuses": statuses, "errors": len(errors),
            "error_sample": errors[:3],
            "p50_ms": 1000 * latencies[len(latencies) // 2] if latencies else None,
            "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] if latencies else None}


def client_main(args: argparse.Namespace) -> None:
    tokens = Path(args.client_tokens).read_text().split()
    result = asyncio.run(_load(args.client, tokens[:args.clients], args.tenant, args.seconds, args.warmup,
                               args.client_kind))
    print(json.dumps(result), flush=True)


# ---- the server process -----------------------------------------------------------------------------

def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`keel serve --transport http` in its own process (from `root`: this checkout or a baseline's)."""

    def __init__(self, setup: Setup, flags: list[str], root: Path = ROOT) -> None:
        import httpx2
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.url = f"{self.base}/mcp"
        self.err = setup.tmp / f"serve-{self.port}.err"
        env = {**os.environ, "PYTHONPATH": str(root)}
        cmd = [sys.executable, "-m", "keel.cli", "serve", str(FINANCE), *setup.source, "--tokens",
               str(setup.tokens), "--transport", "http", "--port", str(self.port), "--no-call-log", *flags]
        with self.err.open("wb") as err:
            self.proc = subprocess.Popen(cmd, cwd=str(root), env=env, stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                raise SystemExit(f"keel serve exited {self.proc.returncode}:\n{self.err.read_text(errors='replace')}")
            try:
                if httpx2.get(f"{self.base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx2.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("keel serve did not start in 120 s")
            time.sleep(0.2)

    def metric(self, name: str) -> float | None:
        import httpx2
        for line in httpx2.get(f"{self.base}/metrics", timeout=10).text.splitlines():
            if line.startswith((name + " ", name + "{")):
                return float(line.rsplit(" ", 1)[1])
        return None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Setup:
    """The tenant's data (Redis or an events file) and one token per client."""

    def __init__(self, args: argparse.Namespace) -> None:
        from tools_server.config import Identity
        from tools_server.tokens import new_token, token_entry
        self.tmp = Path(tempfile.mkdtemp(prefix="keel-serve-load-"))
        self.tenant = f"load-{secrets.token_hex(4)}"
        self.redis = None if args.embedded else (args.redis or os.environ.get("KEEL_REDIS_URL"))
        events = self.tmp / "events.jsonl"
        with events.open("w", encoding="utf-8") as f:
            for line in (FINANCE / "events.jsonl").read_text(encoding="utf-8").splitlines():
                event = json.loads(line)
                event["tenant"] = self.tenant
                f.write(json.dumps(event) + "\n")
        self.store = None
        if self.redis:
            from keel.cartridge import load_cartridge
            from keel.embedded import replay_file
            from keel.projector import Projector
            from keel.store.redis import RedisStore
            cartridge = load_cartridge(FINANCE)
            self.store = RedisStore.from_url(self.redis, namespace=cartridge.name)
            replay_file(Projector(cartridge, self.store), events)
            self.source = ["--redis", self.redis]
        else:
            self.source = ["--events", str(events)]
        self.tokens = self.tmp / "tokens.jsonl"
        self.client_tokens = self.tmp / "client-tokens.txt"
        plain = [new_token() for _ in range(max(args.clients, 1))]
        self.tokens.write_text("".join(json.dumps(token_entry(t, Identity(self.tenant, f"agent{i}"))) + "\n"
                                       for i, t in enumerate(plain)))
        self.client_tokens.write_text("\n".join(plain) + "\n")

    def close(self) -> None:
        if self.store is not None:
            self.store.drop_tenant(self.tenant)
            self.store.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


PACKAGES = ("keel", "tools_server", "workers", "inspector")     # the installed `keel.commands` plug-ins' packages


def baseline_root(rev: str, into: Path) -> Path:
    """The Python packages of commit `rev`, extracted (git archive) into a folder of their own. A plug-in package
    the commit does not have yet gets a `cli.register` that adds nothing, so the installed entry point (which
    names today's package) does not load today's code against the old `keel`."""
    root = into / f"baseline-{rev.replace('/', '_')}"
    root.mkdir()
    present = subprocess.run(["git", "ls-tree", "--name-only", rev], cwd=str(ROOT), check=True,
                             capture_output=True, text=True).stdout.split()
    archive = subprocess.run(["git", "archive", rev, *(p for p in PACKAGES if p in present)], cwd=str(ROOT),
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    for missing in (p for p in PACKAGES if p not in present):
        (root / missing).mkdir()
        (root / missing / "__init__.py").write_text("")
        (root / missing / "cli.py").write_text("def register(sub):\n    return None\n")
    return root


RECLAIM_WAIT_S = 12
LIMITS = ["--calls-per-second", "1000000", "--calls-in-flight", "1000"]   # this bench measures capacity, not limits


def run_mode(setup: Setup, args: argparse.Namespace, mode: str, roots: dict[str, Path]) -> dict:
    server = Server(setup, MODES[mode] + ([] if mode == "before" else LIMITS), roots.get(mode, ROOT))
    try:
        cmd = [sys.executable, __file__, "--client", server.url, "--client-tokens", str(setup.client_tokens),
               "--tenant", setup.tenant, "--clients", str(args.clients), "--seconds", str(args.seconds),
               "--warmup", str(args.warmup), "--client-kind", CLIENTS[mode]]
        client = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        assert client.stdout is not None
        cpu0 = cpu1 = 0.0
        result: dict = {}
        for line in client.stdout:
            if line.startswith("GO"):
                cpu0 = cpu_seconds(server.proc.pid)
            elif line.startswith("STOP"):
                cpu1 = cpu_seconds(server.proc.pid)
            elif line.startswith("{"):
                result = json.loads(line)
        if client.wait() != 0 or not result:
            raise SystemExit(f"the client process failed (mode {mode}); server log:\n"
                             f"{server.err.read_text(errors='replace')[-2000:]}")
        result["server_cpu_s"] = cpu1 - cpu0
        result["rss_mb"] = rss_mb(server.proc.pid)
        return result
    finally:
        server.stop()


def load_main(args: argparse.Namespace) -> None:
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise SystemExit(f"unknown mode(s) {unknown}; choose from {', '.join(MODES)}")
    if args.baseline and not any(m in BEFORE for m in modes):
        modes.insert(0, "before")
    if any(m in BEFORE for m in modes) and not args.baseline:
        raise SystemExit("modes 'before' and 'before-stateless' need --baseline REV")
    setup = Setup(args)
    try:
        root = baseline_root(args.baseline, setup.tmp) if args.baseline else None
        roots = {m: root for m in BEFORE if root is not None}
        print(f"keel serve under load: {args.clients} clients, {args.seconds:g} s per round after {args.warmup:g} s "
              f"warm-up, {args.rounds} round(s), store {'redis' if setup.redis else 'embedded'}, "
              f"load average {os.getloadavg()[0]:.1f}" + (f", before = {args.baseline}" if args.baseline else ""),
              flush=True)
        results: dict[str, list[dict]] = {m: [] for m in modes}
        for r in range(args.rounds):
            for mode in modes:
                res = run_mode(setup, args, mode, roots)
                results[mode].append(res)
                print(f"  round {r + 1} {mode:16} {line(res)}", flush=True)
        print(f"\nmedians over rounds (load average now {os.getloadavg()[0]:.1f}):")
        print(f"{'mode':16} {'calls/s':>8} {'p50 ms':>7} {'p99 ms':>7} {'CPU ms/call':>11} {'calls/core-s':>12} "
              f"{'errors':>6} {'RSS MB':>6}")
        for mode in modes:
            rs = results[mode]
            med = {k: statistics.median(x[k] for x in rs) for k in ("p50_ms", "p99_ms", "rss_mb")}
            rate = statistics.median(x["calls"] / x["elapsed"] for x in rs)
            cpu = statistics.median(x["server_cpu_s"] / x["calls"] for x in rs)
            print(f"{mode:16} {rate:8.0f} {med['p50_ms']:7.1f} {med['p99_ms']:7.1f} {1000 * cpu:11.3f} "
                  f"{1 / cpu:12.0f} {sum(x['errors'] for x in rs):6d} {med['rss_mb']:6.0f}")
        for before in (m for m in BEFORE if m in modes):
            base = statistics.median(x["calls"] / x["server_cpu_s"] for x in results[before])
            for mode in modes:
                if mode not in BEFORE:
                    per_core = statistics.median(x["calls"] / x["server_cpu_s"] for x in results[mode])
                    print(f"calls per core, {mode} / {before}: {per_core / base:.2f}")
    finally:
        setup.close()


def line(res: dict) -> str:
    rate = res["calls"] / res["elapsed"]
    cpu = res["server_cpu_s"] / res["calls"] if res["calls"] else float("nan")
    sample = f" e.g. {res['error_sample'][0]}" if res["errors"] else ""
    return (f"{rate:7.0f} calls/s  p50 {res['p50_ms']:6.1f} ms  p99 {res['p99_ms']:6.1f} ms  "
            f"server CPU {1000 * cpu:.3f} ms/call ({1 / cpu:.0f} calls/core-s)  statuses {res['statuses']}  "
            f"errors {res['errors']}{sample}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--seconds", type=float, default=15.0, help="measured seconds per round")
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--modes", default="sessions,stateless", help=f"comma-separated, of {', '.join(MODES)}")
    p.add_argument("--baseline", metavar="REV", help="also run mode 'before': keel serve from this commit")
    p.add_argument("--redis", metavar="URL", help="serve the Redis graph (default KEEL_REDIS_URL)")
    p.add_argument("--embedded", action="store_true", help="serve an events file even if KEEL_REDIS_URL is set")
    p.add_argument("--sessions", type=int, help="measure the memory of this many abandoned sessions instead")
    p.add_argument("--idle-timeout", type=float, default=20.0, help="with --sessions: the server's session expiry")
    p.add_argument("--waves", type=int, default=2, help="with --sessions: open and abandon them this many times")
    # the client process (internal)
    p.add_argument("--client", help=argparse.SUPPRESS)
    p.add_argument("--client-tokens", help=argparse.SUPPRESS)
    p.add_argument("--tenant", help=argparse.SUPPRESS)
    p.add_argument("--client-kind", choices=("sessions", "stateless", "modern"), default="sessions",
                   help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.client:
        client_main(args)
    elif args.sessions:
        sessions_main(args)
    else:
        load_main(args)


async def _abandon(url: str, tokens: list[str], n: int) -> list[int]:
    """Open n sessions (initialize, never closed), 50 at a time; the statuses."""
    import aiohttp
    statuses: list[int] = []
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": PROTOCOL, "capabilities": {}, "clientInfo": {"name": "load", "version": "1"}}}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=50)) as http:
        async def one(i: int) -> None:
            async with http.post(url, json=init, headers=_headers(tokens[i % len(tokens)])) as r:
                await r.read()
                statuses.append(r.status)
        for start in range(0, n, 50):
            await asyncio.gather(*(one(i) for i in range(start, min(n, start + 50))))
    return statuses


def sessions_main(args: argparse.Namespace) -> None:
    """RSS of a server before N sessions, with them open, and after they expired (or, for 'before', after the
    same wait: its sessions live 30 minutes)."""
    setup = Setup(args)
    tokens = setup.client_tokens.read_text().split()
    try:
        roots = {"before": baseline_root(args.baseline, setup.tmp)} if args.baseline else {}
        print(f"{args.sessions} sessions opened and abandoned; store {'redis' if setup.redis else 'embedded'}; "
              f"expiry {args.idle_timeout:g} s" + (f"; before = {args.baseline}" if args.baseline else ""), flush=True)
        for mode in (["before"] if args.baseline else []) + ["sessions"]:
            flags = [] if mode == "before" else ["--session-idle-timeout", f"{args.idle_timeout:g}", "--max-sessions",
                                                  str(args.sessions + 100), *LIMITS]
            server = Server(setup, flags, roots.get(mode, ROOT))
            try:
                asyncio.run(_abandon(server.url, tokens, 50))       # warm: modules loaded, first sessions made
                start = rss_mb(server.proc.pid)
                for wave in range(1, args.waves + 1):
                    statuses = asyncio.run(_abandon(server.url, tokens, args.sessions))
                    opened = rss_mb(server.proc.pid)
                    count = server.metric("keel_mcp_sessions")
                    waited = time.monotonic()
                    while time.monotonic() - waited < args.idle_timeout + 120:
                        left = server.metric("keel_mcp_sessions")
                        if left == 0 or (left is None and time.monotonic() - waited > args.idle_timeout + 2):
                            break
                        time.sleep(1)
                    time.sleep(RECLAIM_WAIT_S)           # keel serve reclaims ended sessions' memory every 10 s
                    after = rss_mb(server.proc.pid)
                    print(f"  {mode:9} wave {wave}: RSS {start:.0f} MB -> {opened:.0f} MB with {args.sessions} sessions "
                          f"({1024 * (opened - start) / args.sessions:.0f} KB each over the start; statuses "
                          f"{dict(Counter(statuses))}; keel_mcp_sessions {count}) -> {after:.0f} MB "
                          f"{'after expiry' if mode != 'before' else f'{time.monotonic() - waited:.0f} s later'} "
                          f"(keel_mcp_sessions {server.metric('keel_mcp_sessions')})", flush=True)
            finally:
                server.stop()
    finally:
        setup.close()


if __name__ == "__main__":
    main()
