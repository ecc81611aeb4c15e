"""Run one tool call: identity → Tools → JSON result, or a ToolError an agent can act on; always observed."""
from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
import msgspec
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent

from keel.errors import KeelError, UnknownEntity
from keel.tools import Tools

from .backend import Backend
from .config import Identity
from .observe import Observer

MAX_MESSAGE = 600       # error messages echo arguments; a hostile argument must not come back at full size
CALL_THREADS = 16       # threads running calls on a blocking (network) store


def _plain(value: Any) -> Any:
    """msgspec's hook for subclasses of JSON's types (keel.times.Instant is an int): their plain value."""
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return kind(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


JSON = msgspec.json.Encoder(enc_hook=_plain)   # compact UTF-8 JSON, ten times json.dumps' speed on a result


class CallRunner:
    """Runs Tools methods for the five MCP handlers."""

    def __init__(self, backend: Backend, identity: Callable[[], Identity | None], observer: Observer) -> None:
        self.backend = backend
        self.identity = identity
        self.observer = observer
        self._threads: ThreadPoolExecutor | None = None

    async def call(self, tool: str, fn: Callable[[Tools], dict[str, Any]], *, write: bool = False) -> CallToolResult:
        """Run fn on the caller's Tools; the result is the structured content and its compact JSON text."""
        start = time.perf_counter()
        who: Identity | None = None
        outcome, miss, error, size = "ok", False, None, 0
        try:
            who = self.identity()
            if who is None:
                raise ToolError("not authenticated: this server binds callers by bearer token")
            tools = self.backend.tools(who)
            run = self._locked(fn) if write else fn
            result = await self._in_thread(run, tools) if self.backend.blocking else run(tools)
            data = JSON.encode(result)
            text, size = data.decode("utf-8"), len(data)
            miss = tool == "search" and not result.get("results")
            outcome = "miss" if miss else "ok"
            return CallToolResult(content=[TextContent(type="text", text=text)], structured_content=result)
        except UnknownEntity as e:
            outcome, miss, error = "miss", True, type(e).__name__
            raise ToolError(_clip(str(e))) from None
        except KeelError as e:
            outcome, error = "error", type(e).__name__
            raise ToolError(_clip(str(e))) from None
        except ToolError as e:
            outcome, error = "error", type(e).__name__
            raise
        except Exception as e:
            ref = secrets.token_hex(4)
            outcome, error = "crash", f"{type(e).__name__} ref={ref}"
            logging.getLogger("keel.tools_server").exception("tool %s crashed (ref %s)", tool, ref)
            raise ToolError(f"internal error in {tool} (ref {ref}); the server log has the details") from None
        finally:
            self.observer.record(tool, who, latency_s=time.perf_counter() - start, result_bytes=size,
                                 outcome=outcome, miss=miss, error=error)

    async def _in_thread(self, run: Callable[[Tools], dict[str, Any]], tools: Tools) -> dict[str, Any]:
        """run(tools) on one of CALL_THREADS threads, awaited to its end even when the caller is cancelled (as
        anyio.to_thread.run_sync does). asyncio's executor, not anyio's worker threads: 40-70 µs less CPU per
        call on Redis (bench/serve_load.py; the calls need no context variables: the identity is read before)."""
        if self._threads is None:
            self._threads = ThreadPoolExecutor(CALL_THREADS, thread_name_prefix="keel-call")
        with anyio.CancelScope(shield=True):
            return await asyncio.get_running_loop().run_in_executor(self._threads, run, tools)

    def _locked(self, fn: Callable[[Tools], dict[str, Any]]) -> Callable[[Tools], dict[str, Any]]:
        def run(tools: Tools) -> dict[str, Any]:
            with self.backend.write_lock:
                return fn(tools)
        return run


def _clip(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE] + "… (truncated)"
