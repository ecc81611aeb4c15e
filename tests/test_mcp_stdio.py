"""`keel serve --transport stdio` as a subprocess, driven by a real MCP client."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.mcp_sessions import (
    FINANCE,
    TENANT_A,
    canonical_tools,
    copy_finance,
    finance_story,
    golden_text,
    ok,
    refused,
    sorted_json,
    stdio_session,
)

from keel.cli import main


@pytest.fixture
def finance_events(tmp_path: Path) -> Path:
    return copy_finance(tmp_path)


def test_stdio_story_and_surface(finance_events: Path, tmp_path: Path) -> None:
    errlog = tmp_path / "serve.err"

    async def go() -> None:
        with errlog.open("w") as err:
            async with stdio_session(str(FINANCE), "--tenant", TENANT_A, "--events", str(finance_events),
                                     "--agent", "debts", "--task", "visa-plan", "--log-format", "json",
                                     stderr=err) as s:
                tools = (await s.list_tools()).tools
                assert [t.name for t in tools] == ["context", "history", "search", "annotate", "related"]
                assert sorted_json(canonical_tools(tools)) == sorted_json(golden_text())
                await finance_story(s, finance_events)
                assert "<entity type>:<id>" in await refused(s, "context", {"entity": "debt:*"})
                assert "x" * 100 not in await refused(s, "search", {"query": "x" * 1_000_000})
                assert (await ok(s, "context", {"entity": "debt:visa"}))["entity"] == "debt:visa"
    anyio.run(go)
    lines = [json.loads(line) for line in errlog.read_text().splitlines() if line.startswith("{")]
    calls = [c for c in lines if c["message"] == "tool_call"]
    assert len(calls) == 11
    assert {c["tool"] for c in calls} == {"context", "history", "search", "annotate", "related"}
    assert all(c["tenant"] == TENANT_A and c["agent"] == "debts" and c["task"] == "visa-plan" for c in calls)


def test_stdio_defaults_to_the_only_tenant(finance_events: Path) -> None:
    async def go() -> None:
        async with stdio_session(str(FINANCE), "--events", str(finance_events), "--no-call-log") as s:
            got: dict[str, Any] = await ok(s, "context", {"entity": "due:visa-2026-11"})
            assert got["entity"] == "due:visa-2026-11"
    anyio.run(go)


def test_stdio_takes_the_events_file_as_an_argument_too(finance_events: Path) -> None:
    """Issue 21: every command that reads an events file takes it as an argument or as --events."""
    async def go() -> None:
        async with stdio_session(str(FINANCE), str(finance_events), "--no-call-log") as s:
            got: dict[str, Any] = await ok(s, "context", {"entity": "debt:visa"})
            assert got["entity"] == "debt:visa"
    anyio.run(go)


def serve_fails(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["serve", str(FINANCE), *args]) == 2
    return capsys.readouterr().err


def test_serve_usage_errors(finance_events: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                            capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("KEEL_REDIS_URL", raising=False)
    monkeypatch.delenv("KEEL_TOKENS_FILE", raising=False)
    events = str(finance_events)
    assert "--events FILE" in serve_fails(capsys)
    assert "not found" in serve_fails(capsys, "--events", str(tmp_path / "missing.jsonl"))
    assert "give one of an events file" in serve_fails(capsys, "--events", events, "--redis", "redis://127.0.0.1:1")
    assert "two events files" in serve_fails(capsys, events, "--events", str(tmp_path / "other.jsonl"))
    assert "--tokens and --issuer are for --transport http" in serve_fails(capsys, "--events", events, "--tokens", "x")
    assert "bearer token" in serve_fails(capsys, "--events", events, "--transport", "http")
    assert "agent and task come from each token" in serve_fails(
        capsys, "--events", events, "--transport", "http", "--tokens", "x", "--agent", "a")
    bad = tmp_path / "tokens.jsonl"
    bad.write_text('{"token_sha256": "plaintext-token", "tenant": "hogar-demo"}\n')
    assert "64 lowercase hex" in serve_fails(capsys, "--events", events, "--transport", "http", "--tokens", str(bad))
