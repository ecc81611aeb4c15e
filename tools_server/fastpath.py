"""Stateless `tools/call` POSTs answered without the SDK's per-request transport (`keel serve --stateless`).

In stateless mode the SDK builds, for every POST, a transport, a task, a JSON-RPC dispatcher and a connection,
and passes the request and its answer through memory streams; that machinery is most of a call's CPU. This
ASGI layer answers the one request that matters under load, a well-formed `tools/call` of a handshake-era
protocol version, with the SDK's own parts for what the answer is made of:

- the Host/Origin and Content-Type checks: `TransportSecurityMiddleware.validate_request`;
- the Accept check: `check_accept_headers`;
- the call: `MCPServer.call_tool` (the tool's argument model and output check), its errors turned into a
  tool error result exactly as the SDK's `tools/call` handler does (an `MCPError` into a JSON-RPC error);
- the result's wire form: `serialize_server_result` for the request's protocol version.

Everything else (initialize, tools/list, notifications, GET, DELETE, a body that is not one such request, a
request failing a check, a body over the size limit) is replayed to the SDK unchanged, which answers it as it
always does. tests/test_mcp_load.py checks that both paths give the same answers.
"""
from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from mcp import MCPError
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http import check_accept_headers
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE, TransportSecurityMiddleware
from mcp_types import CallToolResult, ErrorData, TextContent
from mcp_types.methods import serialize_server_result
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .calls import JSON

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer
    from mcp.server.transport_security import TransportSecuritySettings

logger = logging.getLogger(__name__)
_DEFAULT_VERSION = "2025-03-26"         # the spec's version for a request without MCP-Protocol-Version
_PARAMS = frozenset({"name", "arguments", "_meta"})
_MESSAGE = frozenset({"jsonrpc", "id", "method", "params"})


class StatelessToolCalls:
    """ASGI middleware on `path`: answers stateless tools/call POSTs of authenticated callers itself."""

    def __init__(self, app: ASGIApp, *, path: str, server: MCPServer, tools: tuple[str, ...],
                 security: TransportSecuritySettings, max_body: int = DEFAULT_MAX_REQUEST_BODY_SIZE) -> None:
        self.app = app
        self.path = path
        self.server = server
        self.tools = frozenset(tools)
        self.security = TransportSecurityMiddleware(security)
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != self.path
                or not isinstance(scope.get("user"), AuthenticatedUser)):
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        version = request.headers.get("mcp-protocol-version", _DEFAULT_VERSION)
        if (version not in HANDSHAKE_PROTOCOL_VERSIONS or not check_accept_headers(request)[0]
                or await self.security.validate_request(request, is_post=True) is not None):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":          # the client went away
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.max_body:
                break
        body = b"".join(chunks)
        call = None if more else _tool_call(body, self.tools)
        if call is None:
            await self.app(scope, _replay(body, more, receive), send)
            return
        request_id, name, arguments = call
        answer = {"jsonrpc": "2.0", "id": request_id}
        try:
            result = await self.server.call_tool(name, arguments)
        except MCPError as e:
            answer["error"] = e.error.model_dump(by_alias=True, mode="json", exclude_none=True)
        except ToolError as e:      # call_tool raises nothing else; answered as the SDK's tools/call handler does
            logger.info("Tool %r failed: %r", name, str(e))
            result = CallToolResult(content=[TextContent(type="text", text=str(e))], is_error=True)
        if "error" not in answer:
            dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
            try:
                answer["result"] = serialize_server_result("tools/call", version, dumped)
            except ValueError:          # pydantic's ValidationError: our result breaks the protocol's shape
                logger.exception("tools/call result failed the protocol's result shape")
                answer["error"] = ErrorData(code=-32603, message="Internal error").model_dump(exclude_none=True)
        data = JSON.encode(answer)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})


def _tool_call(body: bytes, tools: frozenset[str]) -> tuple[int | str, str, dict[str, Any]] | None:
    """(id, tool, arguments) of a body that is exactly one well-formed tools/call request of one of `tools`;
    None for anything else (the SDK answers it)."""
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(message, dict) or message.keys() - _MESSAGE or message.get("jsonrpc") != "2.0" \
            or message.get("method") != "tools/call":
        return None
    request_id, params = message.get("id"), message.get("params")
    if isinstance(request_id, bool) or not isinstance(request_id, int | str) or not isinstance(params, dict) \
            or params.keys() - _PARAMS:
        return None
    name, arguments, meta = params.get("name"), params.get("arguments", {}), params.get("_meta")
    if name not in tools or not isinstance(arguments, dict) or (meta is not None and not isinstance(meta, dict)):
        return None
    return request_id, name, arguments


def _replay(body: bytes, more: bool, receive: Receive) -> Receive:
    """A receive that gives the body already read, then the rest of the request."""
    first: list[Message] = [{"type": "http.request", "body": body, "more_body": more}]

    async def replayed() -> Message:
        return first.pop() if first else await receive()
    return replayed
