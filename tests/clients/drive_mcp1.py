"""The MCP Python SDK 1.x client (mcp 1.30, .cache/clients/langchain) against `keel serve`: list the tools, make the
plan's calls. The 1.x client validates each structured result against the tool's outputSchema itself."""
from __future__ import annotations

import asyncio
import json
from contextlib import asynccontextmanager
from importlib.metadata import version
from typing import Any

import httpx
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from plan import answer_error, answer_ok, emit, read_plan


@asynccontextmanager
async def session(p: dict[str, Any]):
    if p["transport"] == "stdio":
        params = StdioServerParameters(command=p["command"], args=p["args"], cwd=p["cwd"])
        async with stdio_client(params) as (read, write), ClientSession(read, write) as s:
            await s.initialize()
            yield s
    else:
        headers = {"Authorization": f"Bearer {p['token']}"}
        async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(30, read=60)) as http, \
                streamable_http_client(p["url"], http_client=http) as (read, write, _), \
                ClientSession(read, write) as s:
            await s.initialize()
            yield s


async def main() -> None:
    p = read_plan()
    async with session(p) as s:
        tools = (await s.list_tools()).tools
        answers = []
        for call in p["calls"]:
            result = await s.call_tool(call["tool"], call["arguments"])
            text = result.content[0].text if result.content else ""
            if result.isError:
                answers.append(answer_error(text))
            else:
                assert json.loads(text) == result.structuredContent, "text and structuredContent differ"
                answers.append(answer_ok(result.structuredContent))
    emit({"client": f"mcp {version('mcp')}",
          "tools": [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in tools],
          "answers": answers})


asyncio.run(main())
