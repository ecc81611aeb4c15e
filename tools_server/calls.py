"""Run one tool call: identity → Tools → JSON result, or a ToolError an agent can act on; always observed."""
from __future__ import annotations

import asyncio
import copy
import logging
import secrets
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anyio
import msgspec
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent

from keel import audit
from keel.audit import RESULT_JSON
from keel.errors import KeelError, UnknownEntity
from keel.times import format_time, now_micros
from keel.tools import Tools

from .backend import Backend
from .config import Identity
from .observe import Observer

MAX_MESSAGE = 600       # error messages echo arguments; a hostile argument must not come back at full size
CALL_THREADS = 16       # threads running calls on a blocking (network) store


JSON: msgspec.json.Encoder = RESULT_JSON  # compact UTF-8 JSON, ten times json.dumps' speed on a result
WORLD_TIME_TOOLS = ("context", "search", "related")     # answers of a world time `at`, the clock's by default


class CallRunner:
    """Runs Tools methods for the five MCP handlers."""

    def __init__(self, backend: Backend, identity: Callable[[], Identity | None], observer: Observer) -> None:
        self.backend = backend
        self.identity = identity
        self.observer = observer
        self._threads: ThreadPoolExecutor | None = None

    async def call(self, tool: str, fn: Callable[[Tools], dict[str, Any]], *, write: bool = False,
                   arguments: dict[str, Any] | None = None) -> CallToolResult:
        """Run fn on the caller's Tools; the result is the structured content and its compact JSON text. With an
        audit log, one record of the call (keel.audit) is written before the answer is returned."""
        start = time.perf_counter()
        who: Identity | None = None
        outcome, miss, error, size = "ok", False, None, 0
        record: dict[str, Any] | None = None
        result: dict[str, Any] | None = None
        data: bytes | None = None
        pinned = None
        try:
            who = self.identity()
            if self.backend.audit is not None:
                record, pinned = self._record(tool, who, arguments or {})
            if who is None:
                raise ToolError("not authenticated: this server binds callers by bearer token")
            tools = self.backend.tools(who)
            if record is not None and pinned is not None:   # the world time the answer is of, for its replay
                tools = copy.copy(tools)
                tools.clock = lambda: pinned
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
            if record is not None and self.backend.audit is not None:
                self._audit(tool, audit.finish(record, outcome=outcome, error=error, result=result, sent=data))

    def _audit(self, tool: str, record: dict[str, Any]) -> None:
        """Write the record; when it cannot be written, no answer goes out (an unaudited answer is withheld)."""
        try:
            self.backend.audit.write(record)  # type: ignore[union-attr]
        except (OSError, ValueError, KeelError) as e:
            logging.getLogger("keel.tools_server").error("audit record %s of %s not written: %s: %s", record["id"],
                                                         tool, type(e).__name__, e)
            raise ToolError(f"the audit log cannot be written ({type(e).__name__}); {tool}'s answer is withheld "
                            f"(audit record {record['id']})") from None

    def _record(self, tool: str, who: Identity | None, arguments: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        """A new audit record of a call, and the clock the call runs with (None: its own `at` is given)."""
        pinned = None
        at = arguments.get("at")
        if tool in WORLD_TIME_TOOLS and at is None:
            pinned = now_micros()
        record = audit.new_record(
            cartridge=self.backend.name, tool=tool, tenant=who.tenant if who else None,
            agent=who.agent if who else None, task=who.task if who else None,
            subject=_subject(), arguments=arguments,
            at=format_time(pinned) if pinned is not None else None)
        if pinned is None and tool in WORLD_TIME_TOOLS:
            record["at"] = record["arguments"].get("at") if isinstance(record["arguments"].get("at"), str) else None
        return record, pinned

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


def _subject() -> str | None:
    """The bearer token's subject (HTTP): an OAuth token's `sub`, a static token's sha256; None on stdio."""
    token = get_access_token()
    subject = token.subject if token is not None else None
    return subject if isinstance(subject, str) else None


def _clip(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE] + "… (truncated)"
