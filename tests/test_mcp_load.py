"""`keel serve --transport http` under load (issue 22): idle sessions expire, silent connections are closed,
per-token limits answer 429 with Retry-After, a stateless mode answers the same as the SDK's sessions and
lets calls spread over two servers on the Redis graph, and the series the alerts read.

Speed is measured in bench/serve_load.py, never asserted here; the waits below are deadlines, not thresholds.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import socket
import time
from collections import Counter
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.mcp_sessions import (
    FINANCE,
    INIT,
    MCP_HEADERS,
    TENANT_A,
    HttpServer,
    fact,
    http_server,
    http_session,
    make_token,
    ok,
    raw_initialize,
)

from keel.errors import UsageError
from tools_server.config import HttpOptions, http_options
from tools_server.throttle import TokenBuckets

PROTOCOL = "2025-06-18"


def metrics(server: HttpServer) -> dict[tuple[str, tuple], float]:
    text = httpx2.get(f"{server.base}/metrics", timeout=10).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def wait_for(what: str, check: Any, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {seconds:g} s"
        time.sleep(0.1)


def post(server: HttpServer, token: str, body: Any, *, session: str | None = None,
         version: str | None = PROTOCOL) -> httpx2.Response:
    headers = {**MCP_HEADERS, "authorization": f"Bearer {token}"}
    if version:
        headers["mcp-protocol-version"] = version
    if session:
        headers["mcp-session-id"] = session
    return httpx2.post(server.url, json=body, headers=headers, timeout=30)


def tool_call(name: str, arguments: Any, request_id: int | str = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {"name": name, "arguments": arguments}}


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("load") / "events.jsonl"
    shutil.copyfile(FINANCE / "events.jsonl", path)
    return path


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    path = tmp_path_factory.mktemp("tokens") / "tokens.jsonl"
    return path, make_token(path, TENANT_A, "a1"), make_token(path, TENANT_A, "a2")


def serve(tmp_path: Path, events: Path, tokens: tuple[Path, str, str], *flags: str):
    return http_server(tmp_path, str(FINANCE), "--events", str(events), "--tokens", str(tokens[0]), *flags)


# ---- options -----------------------------------------------------------------------------------------

def test_options_come_from_flags_then_environment_then_defaults() -> None:
    assert http_options({}, {}) == HttpOptions()
    env = {"KEEL_MCP_STATELESS": "true", "KEEL_MCP_SESSION_IDLE_TIMEOUT": "30", "KEEL_MCP_CALLS_PER_SECOND": "7"}
    got = http_options({"calls_per_second": 9, "max_sessions": None}, env)
    assert (got.stateless, got.session_idle_timeout, got.calls_per_second, got.max_sessions) == \
        (True, 30.0, 9, HttpOptions().max_sessions)
    for flags, env, named in (({}, {"KEEL_MCP_MAX_SESSIONS": "many"}, "KEEL_MCP_MAX_SESSIONS"),
                              ({"header_timeout": 0.0}, {}, "--header-timeout"),
                              ({}, {"KEEL_MCP_SESSION_IDLE_TIMEOUT": "inf"}, "KEEL_MCP_SESSION_IDLE_TIMEOUT"),
                              ({}, {"KEEL_MCP_STATELESS": "maybe"}, "KEEL_MCP_STATELESS"),
                              ({"calls_in_flight": -1}, {}, "--calls-in-flight")):
        with pytest.raises(UsageError, match=named):
            http_options(flags, env)


def test_a_bad_option_is_one_line_and_exit_2(tmp_path: Path, events: Path, tokens: tuple[Path, str, str]) -> None:
    import subprocess

    from support.mcp_sessions import KEEL, ROOT
    out = subprocess.run([*KEEL, "serve", str(FINANCE), "--events", str(events), "--tokens", str(tokens[0]),
                          "--transport", "http", "--max-sessions", "0"], cwd=str(ROOT), capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 2 and "--max-sessions" in out.stderr and "Traceback" not in out.stderr


def test_token_bucket_refills_and_says_when() -> None:
    now = [100.0]
    buckets = TokenBuckets(2, clock=lambda: now[0])
    assert [buckets.take("a"), buckets.take("a")] == [0.0, 0.0]
    assert buckets.take("a") == pytest.approx(0.5)       # empty: one call back in half a second
    assert buckets.take("b") == 0.0                       # another token has its own bucket
    now[0] += 0.5
    assert buckets.take("a") == 0.0
    now[0] += 60
    assert [buckets.take("a"), buckets.take("a"), buckets.take("a") > 0] == [0.0, 0.0, True]   # bursts stay at 2


# ---- sessions ----------------------------------------------------------------------------------------

def test_idle_sessions_expire_and_the_limit_holds(tmp_path: Path, events: Path, tokens: tuple[Path, str, str]) -> None:
    _, a, _ = tokens
    with serve(tmp_path, events, tokens, "--session-idle-timeout", "2", "--max-sessions", "5") as server:
        assert metrics(server)[("keel_mcp_sessions_limit", ())] == 5
        opened = [raw_initialize(server.url, authorization=f"Bearer {a}") for _ in range(5)]
        assert all(r.status_code == 200 for r in opened)
        assert metrics(server)[("keel_mcp_sessions", ())] == 5
        refused = raw_initialize(server.url, authorization=f"Bearer {a}")
        assert refused.status_code == 503                 # the SDK's answer at the limit
        wait_for("sessions closed after 2 s idle", lambda: metrics(server)[("keel_mcp_sessions", ())] == 0)
        gone = post(server, a, tool_call("context", {"entity": "debt:visa"}),
                    session=opened[0].headers["mcp-session-id"])
        assert gone.status_code == 404 and "Session not found" in gone.text   # the client initialises again
        assert raw_initialize(server.url, authorization=f"Bearer {a}").status_code == 200
        counted = metrics(server)
        assert counted[("keel_mcp_http_responses_total", (("status", "503"),))] == 1
        assert counted[("keel_mcp_http_responses_total", (("status", "404"),))] == 1
        assert counted[("keel_mcp_http_responses_total", (("status", "200"),))] >= 6


def test_a_session_in_use_does_not_expire(tmp_path: Path, events: Path, tokens: tuple[Path, str, str]) -> None:
    _, a, _ = tokens
    with serve(tmp_path, events, tokens, "--session-idle-timeout", "3") as server:
        async def go() -> None:
            async with http_session(server.url, a) as s:
                for _ in range(8):                       # 4 s of calls, each gap under the idle time
                    assert fact(await ok(s, "context", {"entity": "debt:visa"}), "balance_cop")["value"] == 3870000
                    await asyncio.sleep(0.5)
        anyio.run(go)


# ---- connections -------------------------------------------------------------------------------------

def closed_by_server(sock: socket.socket) -> bool:
    """True when the server closes the connection (EOF or reset) before the socket's own timeout."""
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_connections_that_send_nothing_are_closed(tmp_path: Path, events: Path, tokens: tuple[Path, str, str]) -> None:
    """Issue 22: 200 connections that never sent a request stayed open with no timeout."""
    _, a, _ = tokens
    with serve(tmp_path, events, tokens, "--header-timeout", "1") as server:
        silent = [socket.create_connection(("127.0.0.1", server.port), timeout=60) for _ in range(20)]
        trickle = socket.create_connection(("127.0.0.1", server.port), timeout=60)
        trickle.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")      # a head never finished
        try:
            assert all(closed_by_server(s) for s in silent)
            assert closed_by_server(trickle)
        finally:
            for s in [*silent, trickle]:
                s.close()
        assert raw_initialize(server.url, authorization=f"Bearer {a}").status_code == 200
        with socket.create_connection(("127.0.0.1", server.port), timeout=60) as s:   # a request in time is served
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert s.recv(1024).startswith(b"HTTP/1.1 200")


# ---- per-token limits --------------------------------------------------------------------------------

def test_calls_per_second_over_the_limit_get_429(tmp_path: Path, events: Path, tokens: tuple[Path, str, str]) -> None:
    _, a, a2 = tokens
    with serve(tmp_path, events, tokens, "--stateless", "--calls-per-second", "2") as server:
        async def burst() -> list[httpx2.Response]:
            headers = {**MCP_HEADERS, "authorization": f"Bearer {a}", "mcp-protocol-version": PROTOCOL}
            async with httpx2.AsyncClient(headers=headers, timeout=30) as client:
                return await asyncio.gather(*(client.post(server.url, json=tool_call("context", {"entity": "debt:visa"}, i))
                                              for i in range(20)))
        answers = anyio.run(burst)
        statuses = Counter(r.status_code for r in answers)
        assert set(statuses) == {200, 429} and statuses[200] >= 2, statuses
        for r in answers:
            if r.status_code == 429:
                assert int(r.headers["retry-after"]) >= 1
                assert "calls in a second" in r.json()["error"]["message"] and a not in r.text
        other = post(server, a2, tool_call("context", {"entity": "debt:visa"}))   # another token is not held back
        assert other.status_code == 200 and "3870000" in other.text
        assert metrics(server)[("keel_mcp_http_responses_total", (("status", "429"),))] == statuses[429]


def test_calls_in_flight_over_the_limit_get_429(tmp_path: Path, events: Path, tokens: tuple[Path, str, str]) -> None:
    """A POST whose body is still arriving is in flight (the app has its head); the token's next one is refused."""
    _, a, a2 = tokens
    with serve(tmp_path, events, tokens, "--calls-in-flight", "1", "--header-timeout", "60") as server:
        body = json.dumps(INIT).encode()
        with socket.create_connection(("127.0.0.1", server.port), timeout=60) as held:
            held.sendall(f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nAuthorization: Bearer {a}\r\n"
                         f"Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
                         f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:10])

            def refused() -> bool:
                return raw_initialize(server.url, authorization=f"Bearer {a}").status_code == 429
            wait_for("the second call refused while the first is in flight", refused)
            r = raw_initialize(server.url, authorization=f"Bearer {a}")
            assert r.status_code == 429 and r.headers["retry-after"] == "1" and "in flight" in r.text
            assert raw_initialize(server.url, authorization=f"Bearer {a2}").status_code == 200
            held.sendall(body[10:])                               # the first call completes
            assert held.recv(65536).startswith(b"HTTP/1.1 200")
        wait_for("the token may call again", lambda: raw_initialize(server.url, authorization=f"Bearer {a}")
                 .status_code == 200)


def test_unauthenticated_requests_are_401_not_limited(tmp_path: Path, events: Path,
                                                      tokens: tuple[Path, str, str]) -> None:
    with serve(tmp_path, events, tokens, "--calls-per-second", "1") as server:
        assert {raw_initialize(server.url, authorization="Bearer nope").status_code for _ in range(5)} == {401}
        assert metrics(server)[("keel_mcp_http_responses_total", (("status", "401"),))] == 5


# ---- stateless ---------------------------------------------------------------------------------------

CALLS: list[dict[str, Any]] = [
    tool_call("context", {"entity": "debt:visa"}, 1),
    tool_call("context", {"entity": "debt:visa", "at": "2026-09-15"}, "two"),
    tool_call("context", {"entity": "debt:nothing"}, 3),
    tool_call("context", {"entity": "debt:visa", "bogus": 1}, 4),
    tool_call("context", {}, 5),
    tool_call("context", {"entity": '"debt:visa"'}, 6),       # a JSON string inside a string: the SDK parses it
    tool_call("search", {"query": "Visa", "type": "debt"}, 7),
    tool_call("search", {"query": "Visa", "limit": "2"}, 8),
    tool_call("history", {"entity": "debt:visa", "predicate": "balance_cop"}, 9),
    tool_call("related", {"entity": "debt:visa", "relation": "for_debt"}, 10),
    tool_call("annotate", {"entity": "debt:visa", "predicate": "n", "value": 1, "scope": "nowhere"}, 11),
    tool_call("nope", {}, 12),
    tool_call("context", "not an object", 13),
    {"jsonrpc": "2.0", "id": 14, "method": "tools/call", "params": {"name": "context"}},
    {"jsonrpc": "2.0", "id": 15, "method": "tools/call", "params": {"name": "context", "arguments": {"entity": "debt:visa"},
                                                                     "_meta": {"progressToken": "p"}}},
    {"jsonrpc": "2.0", "id": 16, "method": "tools/list"},
    {"jsonrpc": "2.0", "id": 17, "method": "ping"},
    [tool_call("context", {"entity": "debt:visa"}, 18)],
]


def test_stateless_answers_as_the_sdk_sessions_do(tmp_path: Path, events: Path, tokens: tuple[Path, str, str]) -> None:
    """Stateless tools/call POSTs skip the SDK's per-request transport (tools_server/fastpath.py); every answer
    equals the one a session of the SDK's stateful transport gets, in each protocol version."""
    _, a, _ = tokens
    with serve(tmp_path, events, tokens, "--stateless") as fast, serve(tmp_path, events, tokens) as sdk:
        for version in ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05", None):
            opened = post(sdk, a, {**INIT, "params": {**INIT["params"], "protocolVersion": version or "2025-03-26"}},
                          version=None)
            session = opened.headers["mcp-session-id"]
            post(sdk, a, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session=session, version=version)
            for body in CALLS:
                mine, theirs = post(fast, a, body, version=version), post(sdk, a, body, session=session, version=version)
                assert mine.status_code == theirs.status_code, (version, body, mine.text, theirs.text)
                if body == CALLS[0] and version in ("2025-06-18", "2025-11-25"):
                    assert "structuredContent" in mine.json()["result"]
                assert mine.json() == theirs.json(), (version, body)
        assert "mcp-session-id" not in post(fast, a, INIT, version=None).headers
        m = metrics(fast)
        assert m[("keel_mcp_sessions", ())] == 0 and m[("keel_mcp_sessions_limit", ())] == 0
        assert m[("keel_tool_calls_total", (("outcome", "ok"), ("tool", "context")))] >= 5


def test_stateless_refuses_as_the_sdk_does(tmp_path: Path, events: Path, tokens: tuple[Path, str, str]) -> None:
    _, a, _ = tokens
    with serve(tmp_path, events, tokens, "--stateless") as server:
        call = tool_call("context", {"entity": "debt:visa"})
        headers = {**MCP_HEADERS, "authorization": f"Bearer {a}"}
        assert httpx2.post(server.url, json=call, headers={**headers, "host": "evil.example"}).status_code == 421
        assert httpx2.post(server.url, json=call, headers={**headers, "origin": "http://evil.example"}).status_code == 403
        assert httpx2.post(server.url, json=call, headers={**headers, "accept": "text/event-stream"}).status_code == 406
        assert httpx2.post(server.url, content=json.dumps(call), headers={**headers, "content-type": "text/plain"}) \
            .status_code == 400
        assert httpx2.post(server.url, json=call, headers={"accept": headers["accept"]}).status_code == 401
        huge = httpx2.post(server.url, content=b'{"jsonrpc":"2.0","id":1,' + b" " * (5 * 1024 * 1024) + b"}",
                           headers=headers, timeout=60)
        assert huge.status_code == 413
        assert server.alive() and post(server, a, call).status_code == 200


class RoundRobin(httpx2.AsyncBaseTransport):
    """Sends each request to the next of `ports` on loopback, as a load balancer would."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = itertools.cycle(ports)
        self.inner = httpx2.AsyncHTTPTransport()
        self.sent: Counter[int] = Counter()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        port = next(self.ports)
        request.url = request.url.copy_with(port=port)
        request.headers["host"] = f"127.0.0.1:{port}"
        self.sent[port] += 1
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.mark.services
def test_calls_spread_over_two_stateless_servers_on_redis(tmp_path: Path, redis_url: str, private_finance: Path,
                                                          tokens: tuple[Path, str, str]) -> None:
    """Two `keel serve --stateless` processes on one Redis graph behind a round-robin balancer: an SDK client
    session's calls alternate between them and every answer is right; with sessions the second server does
    not know the first one's session (404), which is why a balanced deployment runs --stateless."""
    import secrets

    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    from keel.cartridge import load_cartridge
    from keel.embedded import replay_file
    from keel.projector import Projector
    from keel.store.redis import RedisStore
    tenant = f"load-{secrets.token_hex(4)}"
    moved = tmp_path / "events.jsonl"
    moved.write_text("".join(json.dumps({**json.loads(line), "tenant": tenant}) + "\n"
                             for line in (FINANCE / "events.jsonl").read_text().splitlines()))
    token_file = tmp_path / "tokens.jsonl"
    token = make_token(token_file, tenant, "lb")
    cartridge = load_cartridge(private_finance)
    store = RedisStore.from_url(redis_url, namespace=cartridge.name)
    try:
        assert replay_file(Projector(cartridge, store), moved).applied == 17
        args = (str(private_finance), "--redis", redis_url, "--tokens", str(token_file))
        with http_server(tmp_path, *args, "--stateless") as one, http_server(tmp_path, *args, "--stateless") as two:
            balancer = RoundRobin([one.port, two.port])

            async def go() -> None:
                async with (httpx2.AsyncClient(transport=balancer, headers={"Authorization": f"Bearer {token}"},
                                               timeout=httpx2.Timeout(30.0, read=60.0)) as client,
                            streamable_http_client(one.url, http_client=client) as (read, write),
                            ClientSession(read, write) as s):
                    await s.initialize()
                    for _ in range(6):
                        assert fact(await ok(s, "context", {"entity": "debt:visa"}), "balance_cop")["value"] == 3870000
                        hits = await ok(s, "search", {"query": "Visa", "type": "debt"})
                        assert hits["results"][0]["entity"] == "debt:visa"
            anyio.run(go)
            assert balancer.sent[one.port] >= 6 and balancer.sent[two.port] >= 6
            for server in (one, two):       # each answered some of the twelve calls
                m = metrics(server)
                assert sum(v for (name, _), v in m.items() if name == "keel_tool_calls_total") >= 3
                assert m[("keel_mcp_sessions", ())] == 0
        with http_server(tmp_path, *args) as one, http_server(tmp_path, *args) as two:
            session = raw_initialize(one.url, authorization=f"Bearer {token}").headers["mcp-session-id"]
            call = tool_call("context", {"entity": "debt:visa"})
            assert post(one, token, call, session=session).status_code == 200
            assert post(two, token, call, session=session).status_code == 404
    finally:
        store.drop_namespace()
        store.close()


def test_memory_of_ended_sessions_is_reclaimed(caplog: pytest.LogCaptureFixture) -> None:
    """Once enough sessions have closed, garbage is collected and the heap trimmed (bench/serve_load.py
    --sessions measures the memory; here: that it runs, and only after the sessions ended)."""
    from tools_server.http import reclaim_session_memory
    counts = iter([150, 150, 120, 0])

    async def go() -> None:
        with anyio.move_on_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: reclaim_session_memory(lambda: next(counts, 0), every_s=0.01, after=100))
                while not any("sessions closed" in r.getMessage() for r in caplog.records):
                    await anyio.sleep(0.01)
                tg.cancel_scope.cancel()
    with caplog.at_level("INFO", logger="keel.serve"):
        anyio.run(go)
    lines = [r.getMessage() for r in caplog.records if "sessions closed" in r.getMessage()]
    assert lines and lines[0].startswith("150 sessions closed since the last reclaim")
