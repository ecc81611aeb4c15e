"""Shared helpers of the tests/test_mcp_*.py files (no tests here): the finance story, MCP client sessions
over the three transports, and a `keel serve --transport http` subprocess."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx2
from mcp import ClientSession, StdioServerParameters
from mcp.client import Client
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from .output_schemas import check_result

ROOT = Path(__file__).resolve().parents[2]
FINANCE = ROOT / "cartridges" / "finance"
GOLDEN = ROOT / "tests" / "golden" / "tools_list.json"
KEEL = [sys.executable, "-m", "keel.cli"]
TENANT_A = "hogar-demo"
TENANT_B = "otro-hogar"

# A second household in the same file: its own debt:visa (another balance) and a debt only it has.
TENANT_B_EVENTS = [
    {"id": "b-snap-visa", "tenant": TENANT_B, "type": "debt.snapshot", "subject": "debt:visa",
     "occurred_at": "2026-10-01", "payload": {"creditor": "Banco Sur", "product": "Visa", "balance_cop": 111000,
                                              "rate_ea_pct": 18.0, "installment_cop": 50000, "month": "2026-10"}},
    {"id": "b-snap-mc", "tenant": TENANT_B, "type": "debt.snapshot", "subject": "debt:mastercard",
     "occurred_at": "2026-10-01", "payload": {"creditor": "Banco Sur", "product": "Mastercard",
                                              "balance_cop": 777000, "rate_ea_pct": 31.0,
                                              "installment_cop": 90000, "month": "2026-10"}},
]


def copy_finance(tmp_path: Path) -> Path:
    """A scratch copy of the finance sample stream (annotate appends to it)."""
    path = tmp_path / "events.jsonl"
    shutil.copyfile(FINANCE / "events.jsonl", path)
    return path


def add_tenant_b(events: Path) -> Path:
    """The stream plus a second tenant's events."""
    with events.open("a", encoding="utf-8") as f:
        f.writelines(json.dumps(event) + "\n" for event in TENANT_B_EVENTS)
    return events


def fact(result: dict[str, Any], predicate: str, *, scope: str | None = None) -> dict[str, Any] | None:
    """The first fact of a context result with this predicate (domain facts by default)."""
    return next((f for f in result["facts"] if f["predicate"] == predicate and f["scope"] == scope), None)


def canonical_tools(tools: list[Any]) -> str:
    """The golden file's form of a client-side tools list."""
    data = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools]
    return json.dumps(data, indent=2, ensure_ascii=False)


def golden_text() -> str:
    return GOLDEN.read_text(encoding="utf-8").rstrip("\n")


def sorted_json(text: str) -> str:
    """Key order aside: the handshake-era wire re-emits top-level schema keys in its own model's order."""
    return json.dumps(json.loads(text), sort_keys=True)


# ---- sessions ---------------------------------------------------------------------------------------

@asynccontextmanager
async def memory_session(server: Any, *, modern: bool = False) -> AsyncIterator[ClientSession]:
    """The session of the SDK's public `Client` connected to an in-process server. Default: the initialize
    handshake over in-memory JSON-RPC streams (protocol ≤ 2025-11-25); modern=True: `auto` mode, which
    probes server/discover (2026-07-28) and talks to the server directly."""
    async with Client(server, mode="auto" if modern else "legacy") as client:
        yield client.session


@asynccontextmanager
async def stdio_session(*args: str, stderr: Any = None) -> AsyncIterator[ClientSession]:
    """`keel serve ... --transport stdio` as a subprocess, with a ClientSession on its stdio."""
    params = StdioServerParameters(command=sys.executable, args=["-m", "keel.cli", "serve", *args],
                                   cwd=str(ROOT), env={**os.environ, "PYTHONUNBUFFERED": "1"})
    kwargs = {} if stderr is None else {"errlog": stderr}
    async with stdio_client(params, **kwargs) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


@asynccontextmanager
async def http_session(url: str, token: str | None, **headers: str) -> AsyncIterator[ClientSession]:
    """A ClientSession over streamable HTTP with a bearer token."""
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    async with (httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=60.0)) as client,
                streamable_http_client(url, http_client=client) as (read, write),
                ClientSession(read, write) as session):
        await session.initialize()
        yield session


# ---- an HTTP server subprocess ----------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class HttpServer:
    def __init__(self, process: subprocess.Popen[bytes], port: int, stderr_path: Path) -> None:
        self.process = process
        self.port = port
        self.stderr_path = stderr_path
        self.base = f"http://127.0.0.1:{port}"
        self.url = f"{self.base}/mcp"

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def alive(self) -> bool:
        return self.process.poll() is None


@contextmanager
def http_server(tmp_path: Path, *args: str) -> Iterator[HttpServer]:
    """`keel serve --transport http` on a free loopback port, stopped (by its pid) at exit."""
    port = free_port()
    err = tmp_path / f"serve-{port}.err"
    with err.open("wb") as stderr:
        proc = subprocess.Popen([*KEEL, "serve", *args, "--transport", "http", "--port", str(port)],
                                cwd=str(ROOT), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
    server = HttpServer(proc, port, err)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"keel serve exited {proc.returncode}:\n{server.stderr()}")
            try:
                if httpx2.get(f"{server.base}/metrics", timeout=1).status_code == 200:
                    break
            except httpx2.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"keel serve did not start:\n{server.stderr()}")
            time.sleep(0.1)
        yield server
    finally:
        stop_process(proc, 15)


def stop_process(proc: subprocess.Popen, timeout: float) -> None:
    """SIGTERM, then SIGKILL after `timeout` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def make_token(tokens: Path, tenant: str, agent: str | None = None, task: str | None = None) -> str:
    """`keel token` appends the hash to the tokens file and prints the token."""
    cmd = [*KEEL, "token", "--tenant", tenant, "--tokens", str(tokens)]
    if agent:
        cmd += ["--agent", agent]
    if task:
        cmd += ["--task", task]
    out = subprocess.run(cmd, cwd=str(ROOT), capture_output=True, text=True, check=True)
    return out.stdout.strip()


INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
MCP_HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


def raw_initialize(url: str, **headers: str) -> httpx2.Response:
    """One bare initialize POST, to check status codes (401, 421, 403) without a client in between."""
    return httpx2.post(url, json=INIT, headers={**MCP_HEADERS, **headers}, timeout=10)


# ---- the finance story, over any transport --------------------------------------------------------

async def ok(session: ClientSession, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """Call a tool that must succeed; its result is checked against the output schema, closed (every key
    declared: support/output_schemas.py), whichever process served it."""
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, result.content[0].text if result.content else result
    assert result.structured_content is not None
    assert json.loads(result.content[0].text) == result.structured_content
    check_result(tool, result.structured_content)
    return result.structured_content


async def refused(session: ClientSession, tool: str, arguments: dict[str, Any]) -> str:
    """Call a tool that must fail with a tool error; its message (never a traceback)."""
    result = await session.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    text = result.content[0].text
    assert "Traceback" not in text and 'File "' not in text
    return text


async def finance_story(session: ClientSession, events: Path | None = None) -> None:
    """The six calls of the story, the rule, the pending due, and a note read back at once."""
    hits = await ok(session, "search", {"query": "Visa", "type": "debt"})
    assert hits["results"][0]["entity"] == "debt:visa"

    now = await ok(session, "context", {"entity": "debt:visa"})
    assert fact(now, "balance_cop")["value"] == 3870000
    assert now["rules"]["debt_expensive"]["rate_ea_pct"] == 25
    assert fact(now, "rate_ea_pct")["value"] > now["rules"]["debt_expensive"]["rate_ea_pct"]
    then = await ok(session, "context", {"entity": "debt:visa", "at": "2026-09-15"})
    assert fact(then, "balance_cop")["value"] == 4200000
    assert then["at"] == "2026-09-15T00:00:00Z"

    history = await ok(session, "history", {"entity": "debt:visa", "predicate": "balance_cop"})
    assert [(v["value"], v["valid_to"]) for v in history["versions"]] == \
        [(4200000, "2026-10-01T00:00:00Z"), (3870000, None)]

    related = await ok(session, "related", {"entity": "debt:visa", "relation": "for_debt"})
    assert related["entity"] == "debt:visa"
    dues = [r["subject"] for r in related["relations"]]
    assert dues == ["due:visa-2026-09", "due:visa-2026-10", "due:visa-2026-11"]
    due = await ok(session, "context", {"entity": "due:visa-2026-11"})
    assert fact(due, "status")["value"] == "pending"

    before = events.read_text(encoding="utf-8").count("\n") if events else 0
    note = (await ok(session, "annotate", {"entity": "debt:visa", "predicate": "next_step",
                                           "value": "pay due:visa-2026-11 first", "scope": "tenant",
                                           "evidence": fact(now, "rate_ea_pct")["evidence"]}))["fact"]
    assert note["value"] == "pay due:visa-2026-11 first" and note["scope"] == "tenant"
    seen = await ok(session, "context", {"entity": "debt:visa"})
    assert fact(seen, "next_step", scope="tenant")["value"] == "pay due:visa-2026-11 first"   # read-your-writes
    if events is not None:
        lines = events.read_text(encoding="utf-8").splitlines()
        assert len(lines) == before + 1
        written = json.loads(lines[-1])
        assert written["type"] == "keel.annotated" and written["subject"] == "debt:visa"
        assert written["payload"]["value"] == "pay due:visa-2026-11 first"
