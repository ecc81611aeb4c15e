"""`keel serve --transport http` on loopback: bearer tokens, tenancy, Host/Origin checks, /metrics."""
from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import httpx2
import pytest
from mcp import MCPError
from prometheus_client.parser import text_string_to_metric_families
from support.mcp_sessions import (
    FINANCE,
    MCP_HEADERS,
    TENANT_A,
    TENANT_B,
    TENANT_B_EVENTS,
    HttpServer,
    fact,
    finance_story,
    http_server,
    http_session,
    make_token,
    ok,
    raw_initialize,
    refused,
)


class Setup(NamedTuple):
    server: HttpServer
    events: Path
    tokens: Path
    a: str          # tenant A, agent a1, task t1
    a2: str         # tenant A, agent a2
    b: str          # tenant B


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("http")
    events = tmp / "events.jsonl"
    shutil.copyfile(FINANCE / "events.jsonl", events)
    with events.open("a", encoding="utf-8") as f:
        f.writelines(json.dumps(e) + "\n" for e in TENANT_B_EVENTS)
    tokens = tmp / "tokens.jsonl"
    a, a2, b = (make_token(tokens, TENANT_A, "a1", "t1"), make_token(tokens, TENANT_A, "a2"),
                make_token(tokens, TENANT_B, "b1"))
    assert a not in tokens.read_text() and len(tokens.read_text().splitlines()) == 3
    with http_server(tmp, str(FINANCE), "--events", str(events), "--tokens", str(tokens),
                     "--log-format", "json") as server:
        yield Setup(server, events, tokens, a, a2, b)


def session_run(setup: Setup, token: str, body: Any, **headers: str) -> None:
    async def go() -> None:
        async with http_session(setup.server.url, token, **headers) as s:
            await body(s)
    anyio.run(go)


def test_finance_story_over_http(setup: Setup) -> None:
    session_run(setup, setup.a, lambda s: finance_story(s, setup.events))
    assert setup.server.alive()


def test_missing_or_wrong_token_is_401(setup: Setup) -> None:
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": f"Bearer {setup.a}x"},
                    {"authorization": setup.a}, {"authorization": "Basic " + setup.a}):
        r = raw_initialize(setup.server.url, **headers)
        assert r.status_code == 401, (headers, r.status_code)
        assert r.headers["www-authenticate"].startswith("Bearer")
    with pytest.raises(ExceptionGroup) as caught:       # the client fails at initialize
        session_run(setup, "not-a-token", lambda s: ok(s, "context", {"entity": "debt:visa"}))
    assert caught.value.subgroup(lambda e: isinstance(e, MCPError)) is not None
    assert raw_initialize(setup.server.url, authorization=f"Bearer {setup.a}").status_code == 200


def test_a_token_never_reaches_another_tenant(setup: Setup) -> None:
    async def as_a(s: Any) -> None:
        assert fact(await ok(s, "context", {"entity": "debt:visa"}), "balance_cop")["value"] == 3870000
        for entity in ("debt:mastercard", f"household:{TENANT_B}"):
            text = await refused(s, "context", {"entity": entity})
            assert "unknown entity" in text and TENANT_B not in text.replace(entity, "")
            await refused(s, "history", {"entity": entity})
            await refused(s, "related", {"entity": entity})
            await refused(s, "annotate", {"entity": entity, "predicate": "n", "value": 1, "scope": "agent"})
        assert (await ok(s, "search", {"query": "Mastercard"}))["results"] == []
        hits = (await ok(s, "search", {"query": "Mastercard Banco Sur"}))["results"]
        assert hits and all(h["labels"].get("creditor") != "Banco Sur" for h in hits)
        assert "unknown entity" in await refused(s, "context", {"entity": "debt:mastercard", "tenant": TENANT_B})

    async def as_b(s: Any) -> None:
        assert fact(await ok(s, "context", {"entity": "debt:visa"}), "balance_cop")["value"] == 111000
        assert fact(await ok(s, "context", {"entity": "debt:mastercard"}), "balance_cop")["value"] == 777000
        await refused(s, "context", {"entity": "due:visa-2026-11"})
        hits = await ok(s, "search", {"query": "Banco Andino"})
        assert all(h["entity"] in ("debt:visa", "debt:mastercard", f"household:{TENANT_B}") for h in hits["results"])
    session_run(setup, setup.a, as_a)
    session_run(setup, setup.b, as_b)


def test_agent_notes_stay_with_the_token(setup: Setup) -> None:
    async def write(s: Any) -> None:
        await ok(s, "annotate", {"entity": "debt:libranza", "predicate": "private", "value": "a1 only",
                                 "scope": "agent"})

    async def read_a2(s: Any) -> None:
        assert fact(await ok(s, "context", {"entity": "debt:libranza"}), "private", scope="agent") is None

    async def read_a1(s: Any) -> None:
        note = fact(await ok(s, "context", {"entity": "debt:libranza"}), "private", scope="agent")
        assert note["value"] == "a1 only" and note["by"] == "agent:a1"
    session_run(setup, setup.a, write)
    session_run(setup, setup.a2, read_a2)
    session_run(setup, setup.a, read_a1)


def test_a_session_stays_with_the_token_that_opened_it(setup: Setup) -> None:
    opened = raw_initialize(setup.server.url, authorization=f"Bearer {setup.a}")
    sid = opened.headers["mcp-session-id"]
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "context", "arguments": {"entity": "debt:visa"}}}
    r = httpx2.post(setup.server.url, json=call, timeout=10,
                    headers={**MCP_HEADERS, "authorization": f"Bearer {setup.b}", "mcp-session-id": sid,
                             "mcp-protocol-version": "2025-06-18"})
    assert r.status_code == 404 and "3870000" not in r.text


def test_host_and_origin_are_checked(setup: Setup) -> None:
    auth = {"authorization": f"Bearer {setup.a}"}
    assert raw_initialize(setup.server.url, host="evil.example", **auth).status_code == 421
    assert raw_initialize(setup.server.url, host=f"evil.example:{setup.server.port}", **auth).status_code == 421
    assert raw_initialize(setup.server.url, origin="http://evil.example", **auth).status_code == 403
    assert raw_initialize(setup.server.url, origin="http://127.0.0.1.evil.example", **auth).status_code == 403
    assert raw_initialize(setup.server.url, origin=f"http://localhost:{setup.server.port}", **auth).status_code == 200
    assert httpx2.get(f"{setup.server.base}/metrics", headers={"host": "evil.example"}, timeout=10).status_code == 421
    assert httpx2.get(f"{setup.server.base}/metrics", headers={"origin": "http://evil.example"},
                      timeout=10).status_code == 403


def test_allow_host_for_a_proxy(tmp_path: Path, setup: Setup) -> None:
    with http_server(tmp_path, str(FINANCE), "--events", str(setup.events), "--tokens", str(setup.tokens),
                     "--allow-host", "keel.example", "--allow-host", "https://agents.example") as server:
        auth = {"authorization": f"Bearer {setup.a}"}
        assert raw_initialize(server.url, host="keel.example", **auth).status_code == 200
        assert raw_initialize(server.url, host="keel.example", origin="https://keel.example", **auth).status_code == 200
        assert raw_initialize(server.url, origin="https://agents.example", **auth).status_code == 200
        assert raw_initialize(server.url, host="evil.example", **auth).status_code == 421


def test_serve_one_tenant_only(tmp_path: Path, setup: Setup) -> None:
    with http_server(tmp_path, str(FINANCE), "--events", str(setup.events), "--tokens", str(setup.tokens),
                     "--tenant", TENANT_A) as server:
        assert raw_initialize(server.url, authorization=f"Bearer {setup.b}").status_code == 401
        assert raw_initialize(server.url, authorization=f"Bearer {setup.a}").status_code == 200


def test_hostile_requests_leave_the_server_up(setup: Setup) -> None:
    async def body(s: Any) -> None:
        for entity in ("x" * 1_000_000, "debt:*", "{hogar-demo}:debt", "debt:visa}*{"):
            assert len(await refused(s, "context", {"entity": entity})) < 1000
        assert len(await refused(s, "search", {"query": "y" * 1_000_000})) < 1000
        assert fact(await ok(s, "context", {"entity": "debt:visa"}), "balance_cop")["value"] == 3870000
    session_run(setup, setup.a, body)
    huge = httpx2.post(setup.server.url, content=b"{" + b" " * (5 * 1024 * 1024) + b"}", timeout=30,
                       headers={**MCP_HEADERS, "authorization": f"Bearer {setup.a}"})
    assert huge.status_code == 413
    garbage = httpx2.post(setup.server.url, content=b"{not json", timeout=10,
                          headers={**MCP_HEADERS, "authorization": f"Bearer {setup.a}"})
    assert garbage.status_code in (400, 404)
    assert setup.server.alive()
    session_run(setup, setup.a, lambda s: ok(s, "search", {"query": "visa"}))


def test_metrics_and_call_log(setup: Setup) -> None:
    async def body(s: Any) -> None:
        await ok(s, "search", {"query": "qqqzzznothing"})
        await refused(s, "context", {"entity": "debt:nothing"})
        await ok(s, "related", {"entity": "debt:visa"})
    session_run(setup, setup.b, body)
    r = httpx2.get(f"{setup.server.base}/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = r.text
    samples = {(x.name, tuple(sorted(x.labels.items()))): x.value
               for family in text_string_to_metric_families(text) for x in family.samples}
    assert samples[("keel_tool_calls_total", (("outcome", "miss"), ("tool", "search")))] >= 1
    assert samples[("keel_retrieval_failures_total", (("tool", "search"),))] >= 1
    assert samples[("keel_retrieval_failures_total", (("tool", "context"),))] >= 1
    assert samples[("keel_tool_latency_seconds_bucket", (("le", "+Inf"), ("tool", "related")))] >= 1
    assert "# TYPE keel_tool_latency_seconds histogram" in text
    assert TENANT_A not in text and TENANT_B not in text
    lines = [json.loads(x) for x in setup.server.stderr().splitlines() if x.startswith("{")]
    calls = [x for x in lines if x["logger"] == "keel.tools_server.calls"]
    assert calls and all({"ts", "level", "logger", "message"} <= set(x) for x in lines)
    mine = [x for x in calls if x["tenant"] == TENANT_B and x["agent"] == "b1"]
    assert {(x["tool"], x["miss"]) for x in mine} >= {("search", True), ("context", True), ("related", False)}


def test_health_and_readiness(setup: Setup) -> None:
    """/healthz and /readyz answer without a token (probes reach them by address); the embedded store is ready."""
    for path in ("/healthz", "/readyz"):
        r = httpx2.get(f"{setup.server.base}{path}", timeout=10)
        assert r.status_code == 200, r.text
        assert r.json()["status"] in ("ok", "ready")


def test_sse_responses(tmp_path: Path, setup: Setup) -> None:
    with http_server(tmp_path, str(FINANCE), "--events", str(setup.events), "--tokens", str(setup.tokens),
                     "--sse") as server:
        r = raw_initialize(server.url, authorization=f"Bearer {setup.a}")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")

        async def go() -> None:
            async with http_session(server.url, setup.a) as s:
                assert fact(await ok(s, "context", {"entity": "debt:visa"}), "balance_cop")["value"] == 3870000
        anyio.run(go)
    assert raw_initialize(setup.server.url, authorization=f"Bearer {setup.a}").headers["content-type"] \
        .startswith("application/json")


def test_sighup_reloads_the_tokens_file_without_a_restart(tmp_path: Path, setup: Setup) -> None:
    """Issue 10: tokens reloaded only by a restart, which dropped in-flight HTTP calls. SIGHUP now re-reads
    the file: a new token works, a removed one is refused, a broken file keeps the previous tokens."""
    import signal
    import time
    tokens = tmp_path / "tokens.jsonl"
    old = make_token(tokens, TENANT_A, "a1")
    with http_server(tmp_path, str(FINANCE), "--events", str(setup.events), "--tokens", str(tokens)) as server:
        def reloaded(times: int) -> None:
            server.process.send_signal(signal.SIGHUP)
            deadline = time.monotonic() + 30
            while server.stderr().count("tokens file") < times and time.monotonic() < deadline:
                time.sleep(0.05)
        new = make_token(tokens, TENANT_A, "a2")
        assert raw_initialize(server.url, authorization=f"Bearer {new}").status_code == 401
        reloaded(1)
        assert "tokens file reloaded (2 token(s))" in server.stderr()
        assert raw_initialize(server.url, authorization=f"Bearer {new}").status_code == 200
        tokens.write_text(tokens.read_text().splitlines()[1] + "\n")         # the old token revoked
        reloaded(2)
        assert raw_initialize(server.url, authorization=f"Bearer {old}").status_code == 401
        tokens.write_text("not json\n")
        reloaded(3)
        assert "NOT reloaded" in server.stderr() and server.alive()
        assert raw_initialize(server.url, authorization=f"Bearer {new}").status_code == 200
