"""The five tools through a real MCP client over the SDK's in-memory transport (embedded store)."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.mcp_sessions import (
    FINANCE,
    TENANT_A,
    TENANT_B,
    add_tenant_b,
    copy_finance,
    fact,
    finance_story,
    memory_session,
    ok,
    refused,
)

from keel.cartridge import load_cartridge
from keel.logs import JsonFormatter
from keel.tools import Tools
from tools_server.backend import Backend
from tools_server.config import Identity, ServerConfig
from tools_server.server import build_server

MB = "x" * 1_000_000

@pytest.fixture
def finance_events(tmp_path: Path) -> Path:
    return copy_finance(tmp_path)


@pytest.fixture
def two_tenant_events(tmp_path: Path) -> Path:
    return add_tenant_b(copy_finance(tmp_path))


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(JsonFormatter().format(record)))     # what --log-format json writes


def serve(events: Path, identity: Identity, *, log: logging.Logger | None = None,
          backend: Backend | None = None) -> Any:
    backend = backend or Backend.embedded(load_cartridge(FINANCE), events)
    return build_server(ServerConfig(backend, identity=identity, call_log=log))


def run(server: Any, body: Any, *, modern: bool = False) -> None:
    async def go() -> None:
        async with memory_session(server, modern=modern) as session:
            await body(session)
    anyio.run(go)


def test_finance_story(finance_events: Path) -> None:
    run(serve(finance_events, Identity(TENANT_A, "debts", "visa-plan")),
        lambda s: finance_story(s, finance_events))


def test_finance_story_on_the_2026_protocol(finance_events: Path) -> None:
    run(serve(finance_events, Identity(TENANT_A, "debts")), lambda s: finance_story(s, finance_events), modern=True)


def test_mcp_result_is_the_cli_json(finance_events: Path) -> None:
    import subprocess
    import sys
    cli = subprocess.run([sys.executable, "-m", "keel.cli", "context", str(FINANCE), str(finance_events),
                          "debt:visa", "--at", "2026-09-15", "--json"], capture_output=True, text=True, check=True)

    async def body(s: Any) -> None:
        assert await ok(s, "context", {"entity": "debt:visa", "at": "2026-09-15"}) == json.loads(cli.stdout)
    run(serve(finance_events, Identity(TENANT_A)), body)


def test_task_and_agent_notes_follow_the_bound_identity(finance_events: Path) -> None:
    backend = Backend.embedded(load_cartridge(FINANCE), finance_events)

    async def write(s: Any) -> None:
        await ok(s, "annotate", {"entity": "debt:visa", "predicate": "mine", "value": 1, "scope": "agent"})
        await ok(s, "annotate", {"entity": "debt:visa", "predicate": "plan", "value": 2, "scope": "task"})
        got = await ok(s, "context", {"entity": "debt:visa"})
        assert fact(got, "mine", scope="agent")["by"] == "agent:a1"
        assert fact(got, "plan", scope="task")["value"] == 2

    async def other(s: Any) -> None:
        got = await ok(s, "context", {"entity": "debt:visa"})
        assert fact(got, "mine", scope="agent") is None and fact(got, "plan", scope="task") is None

    run(serve(finance_events, Identity(TENANT_A, "a1", "t1"), backend=backend), write)
    run(serve(finance_events, Identity(TENANT_A, "a2", "t2"), backend=backend), other)


def test_errors_an_agent_can_act_on(finance_events: Path) -> None:
    size = finance_events.stat().st_size

    async def body(s: Any) -> None:
        text = await refused(s, "context", {"entity": "debt:nope"})
        assert "unknown entity 'debt:nope'" in text and TENANT_A in text and "search" in text
        assert "requires evidence" in await refused(s, "annotate", {"entity": "debt:visa", "predicate": "n",
                                                                    "value": "v", "scope": "tenant"})
        assert "not an event of this tenant" in await refused(
            s, "annotate", {"entity": "debt:visa", "predicate": "n", "value": "v", "scope": "tenant",
                            "evidence": "no-such-event"})
        assert "global notes are disabled" in await refused(
            s, "annotate", {"entity": "type:debt", "predicate": "n", "value": "v", "scope": "global",
                            "evidence": "snap-visa-2026-10"})
        assert "unknown scope" in await refused(s, "annotate", {"entity": "debt:visa", "predicate": "n",
                                                                "value": "v", "scope": "world"})
        assert "value: required" in await refused(s, "annotate", {"entity": "debt:visa", "predicate": "n",
                                                                  "scope": "agent"})
        assert "predicate" in await refused(s, "annotate", {"entity": "debt:visa", "predicate": "bad name!",
                                                            "value": 1, "scope": "agent"})
        assert "RFC 3339" in await refused(s, "context", {"entity": "debt:visa", "at": "yesterday"})
        assert "known_at" in await refused(s, "history", {"entity": "debt:visa", "known_at": "2026-13-45"})
        assert "limit" in await refused(s, "search", {"query": "visa", "limit": 0})
        assert "limit" in await refused(s, "search", {"query": "visa", "limit": "many"})
        assert "not an entity type" in await refused(s, "search", {"query": "visa", "type": "planet"})
        assert "query" in await refused(s, "search", {})
        assert "entity" in await refused(s, "related", {})
    run(serve(finance_events, Identity(TENANT_A, "a1")), body)
    assert finance_events.stat().st_size == size        # refused notes wrote nothing


@pytest.mark.parametrize("entity", [
    "debt:*", "*", "debt:visa*", "debt:{visa}", "{hogar-demo}:debt:visa", "debt:visa:balance_cop", "debt:",
    ":visa", "debt:visa\n", "debt:visa\x00", "../debt:visa", "debt:vi sa", "DEBT:visa", "debt:visa}", "k{t}:x",
    MB, "debt:" + MB])
def test_hostile_entity_ids_are_tool_errors(finance_events: Path, entity: str) -> None:
    async def body(s: Any) -> None:
        for tool, extra in (("context", {}), ("history", {}), ("related", {}),
                            ("annotate", {"predicate": "n", "value": 1, "scope": "agent"})):
            text = await refused(s, tool, {"entity": entity, **extra})
            assert len(text) < 1000
        assert fact(await ok(s, "context", {"entity": "debt:visa"}), "balance_cop")["value"] == 3870000
    run(serve(finance_events, Identity(TENANT_A, "a1")), body)


def test_huge_and_odd_arguments_are_tool_errors(finance_events: Path) -> None:
    size = finance_events.stat().st_size
    deep: Any = "x"
    for _ in range(150):
        deep = [deep]

    async def body(s: Any) -> None:
        cases = [("search", {"query": MB}), ("search", {"query": "visa", "type": MB}),
                 ("search", {"query": ["visa"]}), ("search", {"query": "visa", "limit": 10**30}),
                 ("context", {"entity": "debt:visa", "at": MB}), ("context", {"entity": "debt:visa", "known_at": MB}),
                 ("context", {"entity": ["debt:visa"] * 10000}), ("context", {"entity": {"a": MB}}),
                 ("context", {"entity": 12}), ("history", {"entity": "debt:visa", "predicate": MB}),
                 ("related", {"entity": "debt:visa", "relation": MB}), ("related", {"entity": "debt:visa", "at": MB}),
                 ("annotate", {"entity": "debt:visa", "predicate": MB, "value": 1, "scope": "agent"}),
                 ("annotate", {"entity": "debt:visa", "predicate": "n", "value": MB, "scope": "agent"}),
                 ("annotate", {"entity": "debt:visa", "predicate": "n", "value": {"k": MB}, "scope": "agent"}),
                 ("annotate", {"entity": "debt:visa", "predicate": "n", "value": 1, "scope": "agent",
                               "evidence": MB}),
                 ("annotate", {"entity": "debt:visa", "predicate": "n", "value": 1, "scope": "task", "task": MB}),
                 ("annotate", {"entity": "debt:visa", "predicate": "n", "value": 1, "scope": MB})]
        for tool, args in cases:
            text = await refused(s, tool, args)
            assert len(text) < 1000, (tool, len(text))
        assert (await s.call_tool("annotate", {"entity": "debt:visa", "predicate": "n", "value": deep,
                                               "scope": "agent"})) is not None
        assert fact(await ok(s, "context", {"entity": "debt:visa"}), "balance_cop")["value"] == 3870000
    run(serve(finance_events, Identity(TENANT_A, "a1")), body)
    lines = finance_events.read_text(encoding="utf-8").splitlines()
    assert finance_events.stat().st_size - size < 5000 and all(len(line) < 5000 for line in lines)


def test_tenant_is_never_an_argument(two_tenant_events: Path) -> None:
    async def body(s: Any) -> None:
        text = await refused(s, "context", {"entity": "debt:mastercard", "tenant": TENANT_B})
        assert "unknown entity" in text and TENANT_B not in text
        visa = await ok(s, "context", {"entity": "debt:visa", "tenant": TENANT_B})
        assert fact(visa, "balance_cop")["value"] == 3870000
        assert (await ok(s, "search", {"query": "Mastercard", "tenant": TENANT_B}))["results"] == []
    run(serve(two_tenant_events, Identity(TENANT_A)), body)

    async def as_b(s: Any) -> None:
        assert fact(await ok(s, "context", {"entity": "debt:visa"}), "balance_cop")["value"] == 111000
        await refused(s, "context", {"entity": "due:visa-2026-11"})
    run(serve(two_tenant_events, Identity(TENANT_B)), as_b)


def test_one_log_line_per_call(finance_events: Path) -> None:
    handler = Lines()
    log = logging.getLogger("test.keel.calls")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False

    async def body(s: Any) -> None:
        await ok(s, "context", {"entity": "debt:visa"})
        await refused(s, "context", {"entity": "debt:nope"})
        await ok(s, "search", {"query": "zzzqqq"})
        await refused(s, "search", {"query": "visa", "limit": 0})
        await ok(s, "related", {"entity": "debt:visa"})
    try:
        run(serve(finance_events, Identity(TENANT_A, "a1", "t1"), log=log), body)
    finally:
        log.removeHandler(handler)
    got = [(ln["tool"], ln["outcome"], ln["miss"]) for ln in handler.lines]
    assert got == [("context", "ok", False), ("context", "miss", True), ("search", "miss", True),
                   ("search", "error", False), ("related", "ok", False)]
    for line in handler.lines:
        assert line["tenant"] == TENANT_A and line["agent"] == "a1" and line["task"] == "t1"
        assert isinstance(line["latency_ms"], float) and line["latency_ms"] >= 0
    assert handler.lines[0]["result_bytes"] > 500 and handler.lines[1]["error"] == "UnknownEntity"


def test_a_crash_is_a_generic_tool_error(finance_events: Path, monkeypatch: pytest.MonkeyPatch,
                                         caplog: pytest.LogCaptureFixture) -> None:
    def boom(self: Tools, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("secret internals /etc/keel")
    monkeypatch.setattr(Tools, "history", boom)

    async def body(s: Any) -> None:
        text = await refused(s, "history", {"entity": "debt:visa"})
        assert "internal error in history (ref " in text and "secret" not in text
        assert fact(await ok(s, "context", {"entity": "debt:visa"}), "balance_cop")["value"] == 3870000
    with caplog.at_level(logging.ERROR, logger="keel.tools_server"):
        run(serve(finance_events, Identity(TENANT_A)), body)
    assert any("secret internals" in (r.exc_text or "") or r.exc_info for r in caplog.records)
