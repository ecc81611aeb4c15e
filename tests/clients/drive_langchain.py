"""langchain-mcp-adapters 0.3 (with mcp<2, .cache/clients/langchain) against `keel serve`: the tools as LangChain
tools, and the plan's calls run by LangGraph's ToolNode from a scripted AI message: the tool step of an agent
graph, without a model. Each answer is the ToolMessage's artifact (the structured result) or its error text."""
from __future__ import annotations

import asyncio
import json
from importlib.metadata import version
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage
from langchain_mcp_adapters.client import MultiServerMCPClient
from langchain_mcp_adapters.tools import load_mcp_tools
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from plan import answer_error, answer_ok, emit, read_plan


def connection(p: dict[str, Any]) -> dict[str, Any]:
    if p["transport"] == "stdio":
        return {"transport": "stdio", "command": p["command"], "args": p["args"], "cwd": p["cwd"]}
    return {"transport": "streamable_http", "url": p["url"], "headers": {"Authorization": f"Bearer {p['token']}"}}


def text_of(message: ToolMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    return "".join(block.get("text", "") if isinstance(block, dict) else str(block) for block in content)


async def main() -> None:
    p = read_plan()
    client = MultiServerMCPClient({"keel": connection(p)})
    async with client.session("keel") as session:
        tools = await load_mcp_tools(session)
        graph = StateGraph(MessagesState)            # the tool step of an agent graph: START -> tools -> END
        graph.add_node("tools", ToolNode(tools, handle_tool_errors=True))
        graph.add_edge(START, "tools")
        graph.add_edge("tools", END)
        app = graph.compile()
        answers = []
        for n, call in enumerate(p["calls"]):
            ask = AIMessage(content="", tool_calls=[{"name": call["tool"], "args": call["arguments"],
                                                     "id": f"call-{n}", "type": "tool_call"}])
            message = (await app.ainvoke({"messages": [ask]}))["messages"][-1]
            assert isinstance(message, ToolMessage) and message.tool_call_id == f"call-{n}", message
            if message.status == "error":
                answers.append(answer_error(text_of(message)))
            else:
                structured = message.artifact["structured_content"]
                assert json.loads(text_of(message)) == structured, "text and structured content differ"
                answers.append(answer_ok(structured))
    emit({"client": f"langchain-mcp-adapters {version('langchain-mcp-adapters')}, mcp {version('mcp')}",
          "tools": [{"name": t.name, "args_schema": t.args_schema if isinstance(t.args_schema, dict) else None}
                    for t in tools],
          "answers": answers})


asyncio.run(main())
