"""Real agent clients that nobody here wrote, connected to `keel serve` over stdio and HTTP: each lists the five
tools, makes the same calls on the finance sample (tests/support/agent_clients.py, CALLS) and must get the embedded
answer of every one, key for key. The clients that share Keel's resolution run here, in the main venv (MCP Python
SDK 2.x, FastMCP, pydantic-ai, OpenAI Agents); the others run as a driver script in their own environment
(tests/clients/: Google ADK, langchain-mcp-adapters and the MCP Python SDK 1.x, the TypeScript SDK, the MCP
Inspector's CLI), all built by scripts/ensure-clients. docs/agents.md shows each setup."""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import jsonschema
import pytest
from support.agent_clients import (
    CALLS,
    NODE_DIR,
    TOOL_NAMES,
    assert_same_answers,
    embedded_answers,
    finance_http,
    plan,
    require_env,
    run_driver,
    strict_converted,
    strict_sets,
    venv_python,
)
from support.mcp_sessions import http_session, stdio_session

TRANSPORTS = ("stdio", "http")


@pytest.fixture(scope="module")
def expected(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """The embedded answers of CALLS (the Python API over a fresh copy of the sample), computed once."""
    return embedded_answers(tmp_path_factory.mktemp("embedded"))


@pytest.fixture(params=TRANSPORTS)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """How a client reaches a fresh server: the stdio command it starts, or an HTTP server's URL and token. Each
    test has its own copy of the sample: the calls end with a note, which changes what later answers say."""
    if request.param == "stdio":
        yield plan("stdio", tmp_path)
    else:
        with finance_http(tmp_path) as (server, token):
            yield plan("http", tmp_path, server=server, token=token)


def call_list(target: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(c["tool"], c["arguments"]) for c in target["calls"]]


# ---- the main venv's clients -------------------------------------------------------------------------------

def test_mcp_python_sdk_2(target: dict[str, Any], expected: list[dict[str, Any]]) -> None:
    """The MCP Python SDK 2.x ClientSession, the plain client the others are measured against."""
    async def go() -> list[dict[str, Any]]:
        if target["transport"] == "stdio":
            session_cm = stdio_session(*target["args"][3:])        # after `-m keel.cli serve`
        else:
            session_cm = http_session(target["url"], target["token"])
        async with session_cm as session:
            assert [t.name for t in (await session.list_tools()).tools] == TOOL_NAMES
            answers = []
            for tool, arguments in call_list(target):
                result = await session.call_tool(tool, arguments)
                if result.is_error:
                    answers.append({"ok": False, "error": result.content[0].text})
                else:
                    assert json.loads(result.content[0].text) == result.structured_content
                    answers.append({"ok": True, "value": result.structured_content})
            return answers
    assert_same_answers(anyio.run(go), expected, "mcp 2.x")


def typed_as_plain(typed: Any, plain: Any, where: str) -> None:
    """FastMCP's typed `.data` holds every key and value of the structured result (a key its output schema left
    out is silently dropped from `.data`); keys it adds for optional fields the result leaves out are None."""
    if dataclasses.is_dataclass(typed):
        typed = {f.name: getattr(typed, f.name) for f in dataclasses.fields(typed)}
    if isinstance(plain, dict):
        assert isinstance(typed, dict), f"{where}: {typed!r}"
        missing = sorted(set(plain) - set(typed))
        assert not missing, f"{where}: .data dropped {missing}"
        for key, value in plain.items():
            typed_as_plain(typed[key], value, f"{where}.{key}")
        assert all(typed[k] is None for k in set(typed) - set(plain)), where
    elif isinstance(plain, list):
        assert isinstance(typed, list) and len(typed) == len(plain), where
        for n, (t, p) in enumerate(zip(typed, plain, strict=True)):
            typed_as_plain(t, p, f"{where}[{n}]")
    else:
        assert typed == plain, f"{where}: {typed!r} != {plain!r}"


def test_fastmcp_client(target: dict[str, Any], expected: list[dict[str, Any]]) -> None:
    """FastMCP 4's Client; its `.data` is typed from the output schema and must keep every key."""
    require_env("main")
    from fastmcp import Client
    from fastmcp.client.transports import StdioTransport, StreamableHttpTransport

    if target["transport"] == "stdio":
        transport: Any = StdioTransport(command=target["command"], args=target["args"], cwd=target["cwd"])
    else:
        transport = StreamableHttpTransport(target["url"], headers={"Authorization": f"Bearer {target['token']}"})

    async def go() -> list[dict[str, Any]]:
        async with Client(transport) as client:
            assert [t.name for t in await client.list_tools()] == TOOL_NAMES
            answers = []
            for tool, arguments in call_list(target):
                result = await client.call_tool(tool, arguments, raise_on_error=False)
                if result.is_error:
                    answers.append({"ok": False, "error": result.content[0].text})
                else:
                    typed_as_plain(result.data, result.structured_content, f"{tool}.data")
                    answers.append({"ok": True, "value": result.structured_content})
            return answers
    assert_same_answers(anyio.run(go), expected, "fastmcp")


def pydantic_ai_toolset(target: dict[str, Any]) -> Any:
    from pydantic_ai.mcp import MCPToolset, StdioTransport, StreamableHttpTransport
    if target["transport"] == "stdio":
        client: Any = StdioTransport(command=target["command"], args=target["args"], cwd=target["cwd"])
    else:
        client = StreamableHttpTransport(target["url"], headers={"Authorization": f"Bearer {target['token']}"})
    return MCPToolset(client, tool_error_behavior="failed")     # a refused call comes back as the tool's answer


def tool_exchanges(messages: list[Any]) -> list[tuple[str, dict[str, Any], Any]]:
    """(tool, arguments, returned content) of each tool call of a pydantic-ai run, in call order."""
    from pydantic_ai.messages import ToolCallPart, ToolReturnPart
    calls = {p.tool_call_id: p for m in messages for p in m.parts if isinstance(p, ToolCallPart)}
    returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
    return [(r.tool_name, calls[r.tool_call_id].args_as_dict(), r.content) for r in returns]


def test_pydantic_ai_scripted_model(target: dict[str, Any], expected: list[dict[str, Any]]) -> None:
    """pydantic-ai's agent loop with a FunctionModel that asks for CALLS one per turn: what the model gets back
    from each tool is the embedded answer (a structured result whole; a refusal's text)."""
    require_env("main")
    from pydantic_ai import Agent
    from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import AgentInfo, FunctionModel

    calls = call_list(target)

    def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        assert sorted(t.name for t in info.function_tools) == sorted(TOOL_NAMES)
        done = sum(isinstance(p, ToolReturnPart) for m in messages for p in m.parts)
        if done < len(calls):
            tool, arguments = calls[done]
            return ModelResponse(parts=[ToolCallPart(tool, arguments, tool_call_id=f"call-{done}")])
        return ModelResponse(parts=[TextPart("done")])

    async def go() -> list[Any]:
        agent = Agent(FunctionModel(script), toolsets=[pydantic_ai_toolset(target)])
        async with agent:
            return (await agent.run("go")).all_messages()
    exchanges = tool_exchanges(anyio.run(go))
    assert [(t, a) for t, a, _ in exchanges] == calls
    answers = [{"ok": True, "value": c} if isinstance(c, dict) else {"ok": False, "error": str(c)}
               for _, _, c in exchanges]
    assert_same_answers(answers, expected, "pydantic-ai")


def openai_server(target: dict[str, Any]) -> Any:
    from agents.mcp import MCPServerStdio, MCPServerStreamableHttp
    if target["transport"] == "stdio":
        return MCPServerStdio({"command": target["command"], "args": target["args"], "cwd": target["cwd"]},
                              use_structured_content=True, client_session_timeout_seconds=60)
    return MCPServerStreamableHttp({"url": target["url"], "headers": {"Authorization": f"Bearer {target['token']}"},
                                    "timeout": 60}, use_structured_content=True, client_session_timeout_seconds=60)


def test_openai_agents_strict_mode(target: dict[str, Any], expected: list[dict[str, Any]]) -> None:
    """OpenAI Agents with strict schemas: its MCP server wrapper's tool list, each input schema converted by its
    strict converter (it must convert: a schema that does not is sent non-strict, or the tool is uncallable), and
    every call made as a strict-mode model makes it, through the function tool the agent runner invokes: EVERY
    property present, the unused ones null. The arguments must validate against the strict schema, and the
    answers must be the embedded ones."""
    require_env("main")
    from agents.mcp import MCPUtil
    from agents.tool_context import ToolContext

    async def go() -> list[dict[str, Any]]:
        server = openai_server(target)
        async with server:
            tools = {t.name: t for t in await server.list_tools()}
            assert list(tools) == TOOL_NAMES
            function_tools = {}
            for name, tool in tools.items():
                strict = strict_converted(tool.input_schema)
                assert strict["required"] == list(strict["properties"]), name
                function_tool = MCPUtil.to_function_tool(tool, server, convert_schemas_to_strict=True)
                assert function_tool.strict_json_schema, f"{name}: the strict converter refused its schema"
                function_tools[name] = (function_tool, strict)
            answers = []
            for n, (tool, arguments) in enumerate(call_list(target)):
                function_tool, strict = function_tools[tool]
                every = strict_sets(tools[tool].input_schema, arguments)["nulls"]
                assert set(every) == set(strict["properties"])
                jsonschema.validate(every, strict)       # what a strict-mode model is allowed to send
                text = json.dumps(every)
                context = ToolContext(context=None, tool_name=tool, tool_call_id=f"call-{n}", tool_arguments=text)
                output = await function_tool.on_invoke_tool(context, text)
                try:
                    answers.append({"ok": True, "value": json.loads(output)})
                except (TypeError, json.JSONDecodeError):
                    answers.append({"ok": False, "error": str(output)})
            return answers
    assert_same_answers(anyio.run(go), expected, "openai-agents (strict)")


# ---- clients in their own environments (driver scripts under tests/clients/) ------------------------------

def test_google_adk(target: dict[str, Any], expected: list[dict[str, Any]]) -> None:
    """Google ADK's McpToolset (google-adk[mcp]): every tool becomes a Gemini function declaration, and an LlmAgent
    with a scripted model makes the calls through ADK's runner."""
    out = run_driver([venv_python("adk"), "drive_adk.py"], target)
    assert sorted(t["name"] for t in out["tools"]) == sorted(TOOL_NAMES)
    for name, declaration in out["declarations"].items():
        assert declaration["name"] == name and declaration.get("parameters_json_schema") or \
            declaration.get("parameters"), declaration
    assert_same_answers(out["answers"], expected, out["client"])


def test_langchain_mcp_adapters(target: dict[str, Any], expected: list[dict[str, Any]]) -> None:
    """langchain-mcp-adapters 0.3 (mcp<2, its own venv): LangChain tools run by LangGraph's ToolNode."""
    out = run_driver([venv_python("langchain"), "drive_langchain.py"], target)
    assert [t["name"] for t in out["tools"]] == TOOL_NAMES
    assert_same_answers(out["answers"], expected, out["client"])


def test_mcp_python_sdk_1(target: dict[str, Any], expected: list[dict[str, Any]]) -> None:
    """The MCP Python SDK 1.30 (the langchain venv's mcp<2): its client validates results against outputSchema."""
    out = run_driver([venv_python("langchain"), "drive_mcp1.py"], target)
    assert out["client"].startswith("mcp 1.")
    assert [t["name"] for t in out["tools"]] == TOOL_NAMES
    assert_same_answers(out["answers"], expected, out["client"])


def test_typescript_sdk(target: dict[str, Any], expected: list[dict[str, Any]]) -> None:
    """The TypeScript SDK's Client, which fails a call whose structured result does not match its outputSchema."""
    require_env("node")
    out = run_driver(["node", "drive_sdk.mjs"], target, cwd=NODE_DIR)
    assert out["client"].startswith("@modelcontextprotocol/sdk 1.32.")
    assert [t["name"] for t in out["tools"]] == TOOL_NAMES
    assert_same_answers(out["answers"], expected, out["client"])


# ---- the MCP Inspector's CLI ---------------------------------------------------------------------------------

def inspector(target: dict[str, Any], tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """`mcp-inspector --cli` (the pinned 2.12) against the target; the server as a config entry (stdio) or the
    URL with the bearer token as a header (HTTP)."""
    require_env("node")
    binary = str(NODE_DIR / "node_modules" / ".bin" / "mcp-inspector")
    if target["transport"] == "stdio":
        config = tmp_path / "inspector.json"
        config.write_text(json.dumps({"mcpServers": {"keel": {"command": target["command"], "args": target["args"],
                                                              "cwd": target["cwd"]}}}))
        reach = ["--config", str(config), "--server", "keel"]      # read-only: no catalog is written
        env = {**os.environ, "MCP_INSPECTOR_SECRET_STORE": "memory"}
    else:
        reach = [target["url"], "--transport", "http", "--header", f"Authorization: Bearer {target['token']}"]
        env = {**os.environ, "MCP_INSPECTOR_SECRET_STORE": "memory",
               "MCP_CATALOG_PATH": str(tmp_path / "catalog.json")}
    return subprocess.run([binary, "--cli", *reach, *options], capture_output=True, text=True, cwd=str(NODE_DIR),
                          env=env, timeout=120, check=False)


def portability_problems(stderr: str) -> list[str]:
    """The Inspector's schema portability findings: with --strict each is a block opening `Warning: tool ...` or
    `Error: tool ...`; without, one count line `Schema portability: N errors, M warnings ...`."""
    return [line for line in stderr.splitlines()
            if line.startswith(("Warning: tool", "Error: tool")) or "Schema portability:" in line]


def test_inspector_cli(target: dict[str, Any], tmp_path: Path, expected: list[dict[str, Any]]) -> None:
    """The MCP Inspector 2.12 `--cli`: tools/list shows the five tools with no schema portability finding (its
    --strict check, the one that flags `type` arrays and schemas that constrain nothing), and tools/call of the
    second call returns its embedded answer."""
    listed = inspector(target, tmp_path, "--method", "tools/list", "--strict")
    assert listed.returncode == 0, listed.stderr
    assert [t["name"] for t in json.loads(listed.stdout)["tools"]] == TOOL_NAMES
    assert portability_problems(listed.stderr) == [], listed.stderr

    tool, arguments = CALLS[2]                      # context of debt:visa at 2026-09-15
    pairs = [f"{k}={v}" for k, v in arguments.items()]
    called = inspector(target, tmp_path, "--method", "tools/call", "--tool-name", tool, "--tool-arg", *pairs)
    assert called.returncode == 0, called.stderr
    result = json.loads(called.stdout)
    assert not result.get("isError"), result
    assert result["structuredContent"] == expected[2]["value"]
    assert json.loads(result["content"][0]["text"]) == expected[2]["value"]


def test_inspector_flags_a_type_array(tmp_path: Path) -> None:
    """The control of the check above: the same Inspector reports a `type` array in a schema, so that its silence
    about Keel's tools means something. The server here is a few lines of FastMCP (the main venv's)."""
    server = tmp_path / "type_array_server.py"
    server.write_text(TYPE_ARRAY_SERVER)
    target = {"transport": "stdio", "command": venv_python("main"), "args": [str(server)], "cwd": str(tmp_path)}
    listed = inspector(target, tmp_path, "--method", "tools/list", "--strict")
    problems = portability_problems(listed.stderr)
    assert problems and 'tool "lookup"' in problems[0], listed.stderr


TYPE_ARRAY_SERVER = '''
from fastmcp import FastMCP

server = FastMCP("type-array")

@server.tool(output_schema={"type": "object", "properties": {"name": {"type": ["string", "null"]}}})
def lookup(name: str = "") -> dict:
    """Its output schema's `name` is a type array, which the Inspector's portability check reports."""
    return {"name": name or None}

server.run(show_banner=False)
'''


def test_golden_schemas_convert_to_strict() -> None:
    """Every input schema of the golden tools list converts with OpenAI Agents' strict converter, and the minimal
    argument set of each CALL, completed with nulls, validates against the converted schema."""
    require_env("main")
    from support.mcp_sessions import GOLDEN
    schemas = {t["name"]: t["inputSchema"] for t in json.loads(GOLDEN.read_text(encoding="utf-8"))}
    for tool, arguments in CALLS:
        strict = strict_converted(copy.deepcopy(schemas[tool]))
        jsonschema.validate(strict_sets(schemas[tool], arguments)["nulls"], strict)
