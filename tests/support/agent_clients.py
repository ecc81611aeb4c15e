"""Shared helpers of tests/test_agent_clients.py and tests/test_tool_conformance.py (no tests here): where each real
client's environment lives (scripts/ensure-clients builds them), the calls every client makes on the finance
sample, the embedded answers they are compared with, and the argument sets a strict-mode model sends."""
from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import keel
from support.mcp_sessions import FINANCE, ROOT, TENANT_A, HttpServer, copy_finance, http_server, make_token

CLIENTS = ROOT / "tests" / "clients"
NODE_DIR = CLIENTS / "node"
AGENT, TASK = "debts", "visa-plan"
STAMP = ".keel-clients-installed"        # scripts/ensure-clients writes the sha256 of what it installed from

# Each environment: the directory holding its stamp, and the files whose digest the stamp must equal.
ENVIRONMENTS: dict[str, tuple[Path, tuple[Path, ...]]] = {
    "main": (ROOT / ".venv", (CLIENTS / "requirements-main.txt",)),
    "adk": (ROOT / ".cache" / "clients" / "adk", (CLIENTS / "requirements-adk.txt",)),
    "langchain": (ROOT / ".cache" / "clients" / "langchain", (CLIENTS / "requirements-langchain.txt",)),
    "node": (NODE_DIR / "node_modules", (NODE_DIR / "package.json", NODE_DIR / "package-lock.json")),
}


def _digest(files: tuple[Path, ...]) -> str:
    """The stamp's value: scripts/ensure-clients' `sha256sum FILES | sha256sum` (paths relative to the root)."""
    listing = "".join(f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.relative_to(ROOT)}\n" for f in files)
    return hashlib.sha256(listing.encode()).hexdigest()


def require_env(name: str) -> Path:
    """The directory of a client environment installed from the current pinned files; when it is missing or was
    installed from other versions, fail under KEEL_REQUIRE_SERVICES=1 (`make test`) and skip otherwise."""
    where, files = ENVIRONMENTS[name]
    stamp = where / STAMP
    if stamp.is_file() and stamp.read_text().strip() == _digest(files):
        return where
    state = "stale (installed from other pinned versions)" if stamp.is_file() else "missing"
    reason = f"client environment {name!r} ({where.relative_to(ROOT)}) is {state}: run scripts/ensure-clients"
    if os.environ.get("KEEL_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason} (KEEL_REQUIRE_SERVICES=1)")
    pytest.skip(reason)


def venv_python(name: str) -> str:
    return str(require_env(name) / "bin" / "python")


# ---- the calls and their embedded answers --------------------------------------------------------------

# Every client makes these calls, in this order: each tool at least once, one refused call, and last a note written
# and withdrawn (nothing read after it, so that the reads never depend on when the note was written).
CALLS: list[tuple[str, dict[str, Any]]] = [
    ("search", {"query": "visa", "type": "debt"}),
    ("context", {"entity": "debt:visa"}),
    ("context", {"entity": "debt:visa", "at": "2026-09-15"}),
    ("history", {"entity": "debt:visa", "predicate": "balance_cop"}),
    ("history", {"since": "2026-10-03", "type": "debt", "limit": 6}),
    ("related", {"entity": "debt:visa", "relation": "for_debt"}),
    ("context", {"entity": "debt:nope"}),
    ("annotate", {"entity": "debt:visa", "predicate": "next_step", "value": "prepay", "scope": "agent"}),
    ("annotate", {"entity": "debt:visa", "predicate": "next_step", "scope": "agent", "withdraw": True,
                  "reason": "done"}),
]
TOOL_NAMES = ["context", "history", "search", "annotate", "related"]

# What a note's result holds that depends on the moment it was written: compared by presence, not value.
VOLATILE = {"valid_from", "valid_to", "recorded_at", "expires_at", "evidence", "event_id", "known_through",
            "at", "applied_through"}


def stable(value: Any) -> Any:
    """A note's result with its moment-dependent values replaced by a marker (None stays None)."""
    if isinstance(value, dict):
        return {k: ("<moment>" if v is not None else None) if k in VOLATILE else stable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [stable(v) for v in value]
    return value


def comparable(tool: str, answer: dict[str, Any]) -> dict[str, Any]:
    """An answer as compared between clients: a note's result without its moment."""
    return stable(answer) if tool == "annotate" else answer


def embedded_answers(tmp_path: Path, calls: list[tuple[str, dict[str, Any]]] = CALLS) -> list[dict[str, Any]]:
    """The answers of `calls` from the Python API over a fresh copy of the finance sample, as the same caller
    (tenant, agent, task): {"ok": True, "value": result} or {"ok": False, "error": the tool error's text}."""
    place = tmp_path / "embedded"
    place.mkdir(exist_ok=True)
    events = copy_finance(place)
    answers: list[dict[str, Any]] = []
    with keel.open(FINANCE, events=events) as graph:
        tools = graph.tools(tenant=TENANT_A, agent=AGENT, task=TASK)
        for tool, arguments in calls:
            try:
                value = json.loads(json.dumps(getattr(tools, tool)(**arguments)))
                answers.append({"ok": True, "value": comparable(tool, value)})
            except keel.KeelError as e:
                answers.append({"ok": False, "error": str(e)})
    return answers


def assert_same_answers(got: list[dict[str, Any]], expected: list[dict[str, Any]], client: str,
                        calls: list[tuple[str, dict[str, Any]]] = CALLS) -> None:
    """Each call's answer equals the embedded one: the same result object, or a tool error whose text contains the
    embedded error's (clients add their own prefix)."""
    assert len(got) == len(expected), (client, got)
    for (tool, arguments), g, e in zip(calls, got, expected, strict=True):
        where = f"{client}: {tool}({json.dumps(arguments)})"
        assert g["ok"] == e["ok"], f"{where}: got {g}, expected {e}"
        if e["ok"]:
            assert comparable(tool, g["value"]) == e["value"], where
        else:
            assert e["error"] in g["error"], f"{where}: {g['error']!r} does not carry {e['error']!r}"
            assert "Traceback" not in g["error"], where


# ---- the argument sets a strict-mode model sends ------------------------------------------------------

def resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """A property schema with a local `$ref` (`#/$defs/...`) followed."""
    while "$ref" in schema:
        target: Any = root
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        schema = {**{k: v for k, v in schema.items() if k != "$ref"}, **target}
    return schema


def types_of(schema: dict[str, Any], root: dict[str, Any]) -> set[str]:
    """The JSON types a property schema allows (its `type`, a `type` array, or its `anyOf` branches)."""
    schema = resolve(schema, root)
    if "anyOf" in schema:
        return set().union(*(types_of(branch, root) for branch in schema["anyOf"]))
    typ = schema.get("type")
    if typ is None:
        return {"any"}
    return set(typ) if isinstance(typ, list) else {typ}


def empty_value(schema: dict[str, Any], root: dict[str, Any]) -> Any:
    """The value a strict-mode model fills an unused property with when it does not send null: the empty value of
    its type where that value means nothing (`""`, `false`), the schema's default for a number, else null."""
    resolved = resolve(schema, root)
    kinds = types_of(schema, root) - {"null"}
    if "default" in resolved:
        return resolved["default"]
    if "enum" in resolved:
        return None
    if kinds == {"string"}:
        return ""
    if kinds == {"boolean"}:
        return False
    return None


def strict_sets(input_schema: dict[str, Any], arguments: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The argument sets a strict-mode caller sends for a call: every property present, each unused one as null,
    as its type's empty value, or as the schema's default. Each must answer as the minimal call does."""
    properties = input_schema.get("properties", {})
    unused = [name for name in properties if name not in arguments]
    return {
        "nulls": {**arguments, **{name: None for name in unused}},
        "empties": {**arguments, **{name: empty_value(properties[name], input_schema) for name in unused}},
    }


def strict_converted(input_schema: dict[str, Any]) -> dict[str, Any]:
    """The input schema as OpenAI Agents' strict converter makes it for an MCP tool (raises when it cannot, with
    its reason). As its MCP path (`MCPUtil.to_function_tool`) does, an object that permits undeclared properties
    is refused: strict mode cannot express it without changing what it accepts."""
    from agents.strict_schema import ensure_strict_json_schema
    return ensure_strict_json_schema(copy.deepcopy(input_schema), _reject_open_objects=bool(input_schema))


# ---- servers and drivers --------------------------------------------------------------------------------

def stdio_command(events: Path) -> list[str]:
    """`keel serve` over stdio as the caller of the embedded answers: the command a client starts."""
    return [sys.executable, "-m", "keel.cli", "serve", str(FINANCE), "--events", str(events), "--tenant", TENANT_A,
            "--agent", AGENT, "--task", TASK, "--no-call-log"]


@contextmanager
def finance_http(tmp_path: Path) -> Iterator[tuple[HttpServer, str]]:
    """`keel serve --transport http` over a fresh copy of the sample, and a bearer token for the same caller."""
    tokens = tmp_path / "tokens.jsonl"
    token = make_token(tokens, TENANT_A, AGENT, TASK)
    events = copy_finance(tmp_path)
    with http_server(tmp_path, str(FINANCE), "--events", str(events), "--tokens", str(tokens),
                     "--no-call-log") as server:
        yield server, token


def plan(transport: str, tmp_path: Path, *, server: HttpServer | None = None, token: str | None = None,
         calls: list[tuple[str, dict[str, Any]]] = CALLS) -> dict[str, Any]:
    """What a driver script reads on stdin: how to reach the server, and the calls to make."""
    out: dict[str, Any] = {"transport": transport,
                           "calls": [{"tool": tool, "arguments": arguments} for tool, arguments in calls]}
    if transport == "stdio":
        command = stdio_command(copy_finance(tmp_path))
        out.update(command=command[0], args=command[1:], cwd=str(ROOT))
    else:
        assert server is not None and token is not None
        out.update(url=server.url, token=token)
    return out


def run_driver(command: list[str], the_plan: dict[str, Any], *, cwd: Path = CLIENTS,
               timeout: float = 180) -> dict[str, Any]:
    """Run a client's driver script with the plan on stdin; its one JSON document on stdout."""
    proc = subprocess.run(command, input=json.dumps(the_plan), capture_output=True, text=True, cwd=str(cwd),
                          timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"}, check=False)
    assert proc.returncode == 0, f"{command[:2]} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"{command[:2]} printed no JSON:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
