"""One argument rule for every tool, over stdio and HTTP: an argument that is absent, null, or the empty value of
its type where that value means nothing ("" for a name, text or time; false for a flag; a number equal to the
schema's default) counts as absent. So the argument sets real callers produce must answer as the minimal call
does: a strict-mode model's (every property present, the unused ones null, empty or the default; OpenAI's strict
mode, tests/test_agent_clients.py), pydantic-ai's TestModel's (it fills what the schema requires), and a plain
client's. The plain client is the MCP Python SDK 2.x; the answers are compared with the embedded ones."""
from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession
from support.agent_clients import (
    CALLS,
    TOOL_NAMES,
    assert_same_answers,
    embedded_answers,
    finance_http,
    plan,
    require_env,
    strict_sets,
)
from support.mcp_sessions import http_session, stdio_session

TRANSPORTS = ("stdio", "http")
READS = [(tool, arguments) for tool, arguments in CALLS if tool != "annotate"]

# The brief's own examples of what strict-mode models send, each with the minimal call it must equal.
SENT_BY_MODELS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("history", {"entity": "debt:visa"},
     {"entity": "debt:visa", "limit": 100, "since": "", "type": "", "cursor": ""}),
    ("history", {"entity": "debt:visa", "predicate": "balance_cop"},
     {"entity": "debt:visa", "predicate": "balance_cop", "known_at": None, "since": None, "type": None,
      "cursor": None, "limit": None}),
    ("history", {"since": "2026-10-03", "type": "debt", "limit": 6},
     {"entity": "", "predicate": "", "known_at": "", "since": "2026-10-03", "type": "debt", "cursor": "", "limit": 6}),
    ("search", {"query": "visa"}, {"query": "visa", "type": "", "limit": None}),
    ("search", {"query": "visa"}, {"query": "visa", "type": None, "limit": 10, "at": "", "known_at": ""}),
    ("context", {"entity": "debt:visa"}, {"entity": "debt:visa", "at": "", "known_at": None}),
    ("related", {"entity": "debt:visa"}, {"entity": "debt:visa", "relation": "", "at": None, "known_at": ""}),
]


@asynccontextmanager
async def plain_session(transport: str, tmp_path: Path) -> AsyncIterator[tuple[ClientSession, dict[str, Any]]]:
    """The plain client on a fresh server over the transport, as the caller of the embedded answers, and how
    another client reaches a server in the same state (over HTTP the same server; over stdio its own process)."""
    if transport == "stdio":
        async with stdio_session(*plan("stdio", tmp_path)["args"][3:]) as session:
            (tmp_path / "other").mkdir()
            yield session, plan("stdio", tmp_path / "other")
        return
    with finance_http(tmp_path) as (server, token):
        async with http_session(server.url, token) as session:
            yield session, plan("http", tmp_path, server=server, token=token)


async def answer(session: ClientSession, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    text = result.content[0].text if result.content else ""
    if result.is_error:
        return {"ok": False, "error": text}
    assert json.loads(text) == result.structured_content
    return {"ok": True, "value": result.structured_content}


def note_cycle(label: str, sent: dict[str, dict[str, Any]] | None = None) -> list[tuple[str, dict[str, Any],
                                                                                        dict[str, Any]]]:
    """A note written and withdrawn: (tool, minimal arguments, arguments sent). Each cycle writes its own value,
    so that no cycle's note is an earlier one's."""
    write = {"entity": "debt:visa", "predicate": "next_step", "value": f"prepay ({label})", "scope": "agent"}
    withdraw = {"entity": "debt:visa", "predicate": "next_step", "scope": "agent", "withdraw": True,
                "reason": f"done ({label})"}
    sent = sent or {}
    return [("annotate", write, {**write, **sent.get("write", {})}),
            ("annotate", withdraw, {**withdraw, **sent.get("withdraw", {})})]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_strict_mode_argument_sets(transport: str, tmp_path: Path) -> None:
    """Every call of CALLS as a strict-mode model sends it (every property, unused ones null; or their empty value
    or the schema's default), the brief's examples, and notes written and withdrawn with every property present:
    each answers as its minimal call does in the embedded graph."""
    async def go() -> None:
        async with plain_session(transport, tmp_path) as (session, _):
            schemas = {t.name: t.input_schema for t in (await session.list_tools()).tools}
            assert list(schemas) == TOOL_NAMES
            cases: list[tuple[str, dict[str, Any], dict[str, Any]]] = [(t, a, a) for t, a in READS]
            for tool, arguments in READS:
                for sent in strict_sets(schemas[tool], arguments).values():
                    cases.append((tool, arguments, sent))
            cases += SENT_BY_MODELS
            cases += note_cycle("minimal")
            for label in ("nulls", "empties"):
                write, withdraw = note_cycle(label)
                cases += note_cycle(label, {"write": strict_sets(schemas["annotate"], write[1])[label],
                                            "withdraw": strict_sets(schemas["annotate"], withdraw[1])[label]})
            cases += note_cycle("brief", {"write": {"withdraw": False, "reason": ""},
                                          "withdraw": {"value": None, "evidence": ""}})
            expected = embedded_answers(tmp_path, [(tool, minimal) for tool, minimal, _ in cases])
            got = [await answer(session, tool, sent) for tool, _, sent in cases]
            assert_same_answers(got, expected, f"plain client over {transport}",
                                [(tool, sent) for tool, _, sent in cases])
    anyio.run(go)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_pydantic_ai_test_model_argument_sets(transport: str, tmp_path: Path) -> None:
    """pydantic-ai's TestModel calls every tool with the arguments it makes from each input schema (what the
    schema requires, filled in); each answer equals the plain client's for the same arguments, and every refusal
    is a tool error with a reason (never a crash or a validation failure of the client's own)."""
    require_env("main")
    from pydantic_ai import Agent
    from pydantic_ai.mcp import MCPToolset, StdioTransport, StreamableHttpTransport
    from pydantic_ai.messages import ToolCallPart, ToolReturnPart
    from pydantic_ai.models.test import TestModel

    async def go() -> None:
        async with plain_session(transport, tmp_path) as (session, target):
            if target["transport"] == "stdio":
                client: Any = StdioTransport(command=target["command"], args=target["args"], cwd=target["cwd"])
            else:
                client = StreamableHttpTransport(target["url"], headers={"Authorization": f"Bearer {target['token']}"})
            agent = Agent(TestModel(call_tools="all"), toolsets=[MCPToolset(client, tool_error_behavior="failed")])
            async with agent:
                messages = (await agent.run("go")).all_messages()
            calls = {p.tool_call_id: p for m in messages for p in m.parts if isinstance(p, ToolCallPart)}
            returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
            assert sorted({r.tool_name for r in returns}) == sorted(TOOL_NAMES)
            for r in returns:
                arguments = calls[r.tool_call_id].args_as_dict()
                plain = await answer(session, r.tool_name, arguments)
                if plain["ok"]:
                    assert r.content == plain["value"], (r.tool_name, arguments)
                else:
                    assert isinstance(r.content, str) and plain["error"] in r.content, (r.tool_name, arguments)
                    assert "Traceback" not in plain["error"] and "validation error" not in plain["error"]
    anyio.run(go)
