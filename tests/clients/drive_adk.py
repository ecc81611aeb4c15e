"""Google ADK (google-adk[mcp], .cache/clients/adk) against `keel serve`: McpToolset lists the tools (each turned
into a Gemini function declaration, as ADK sends it to a model), and an LlmAgent run by ADK's InMemoryRunner makes
the plan's calls. The agent's model is a scripted BaseLlm that asks for one call per turn: no model is needed,
and every call goes through ADK's own function-calling path. Each answer is the function response ADK hands back
to the model."""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from importlib.metadata import version
from typing import Any

from google.adk.agents import LlmAgent
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import InMemoryRunner
from google.adk.tools.mcp_tool import McpToolset, StdioConnectionParams, StreamableHTTPConnectionParams
from google.genai import types
from mcp import StdioServerParameters
from plan import answer_error, answer_ok, emit, read_plan


class ScriptedLlm(BaseLlm):
    """Asks for the plan's calls one per turn (as many as function responses it has seen), then says done."""
    calls: list[dict[str, Any]]

    async def generate_content_async(self, llm_request: LlmRequest,
                                     stream: bool = False) -> AsyncGenerator[LlmResponse, None]:
        seen = sum(1 for content in llm_request.contents for part in content.parts or []
                   if part.function_response is not None)
        if seen < len(self.calls):
            call = self.calls[seen]
            part = types.Part(function_call=types.FunctionCall(name=call["tool"], args=call["arguments"],
                                                               id=f"call-{seen}"))
        else:
            part = types.Part(text="done")
        yield LlmResponse(content=types.Content(role="model", parts=[part]))


def connection(p: dict[str, Any]) -> Any:
    if p["transport"] == "stdio":
        return StdioConnectionParams(server_params=StdioServerParameters(command=p["command"], args=p["args"],
                                                                         cwd=p["cwd"]), timeout=60)
    return StreamableHTTPConnectionParams(url=p["url"], headers={"Authorization": f"Bearer {p['token']}"},
                                          timeout=60)


def answer(response: dict[str, Any]) -> dict[str, Any]:
    text = "".join(c.get("text", "") for c in response.get("content", []))
    if response.get("isError") or response.get("is_error"):
        return answer_error(text)
    structured = response.get("structuredContent", response.get("structured_content"))
    assert json.loads(text) == structured, "text and structured content differ"
    return answer_ok(structured)


async def main() -> None:
    p = read_plan()
    toolset = McpToolset(connection_params=connection(p))
    try:
        tools = await toolset.get_tools()
        declarations = {t.name: t._get_declaration().model_dump(mode="json", exclude_none=True) for t in tools}
        agent = LlmAgent(name="keel_agent", model=ScriptedLlm(model="scripted", calls=p["calls"]), tools=[toolset])
        runner = InMemoryRunner(agent=agent, app_name="keel-test")
        session = await runner.session_service.create_session(app_name="keel-test", user_id="u")
        answers = []
        message = types.Content(role="user", parts=[types.Part(text="go")])
        async for event in runner.run_async(user_id="u", session_id=session.id, new_message=message):
            for response in event.get_function_responses():
                answers.append(answer(response.response or {}))
    finally:
        await toolset.close()
    emit({"client": f"google-adk {version('google-adk')}, mcp {version('mcp')}",
          "tools": [{"name": t.name} for t in tools], "declarations": declarations, "answers": answers})


asyncio.run(main())
