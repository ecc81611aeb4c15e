"""The streamable HTTP transport: Host/Origin checks (DNS rebinding), bearer auth, per-token limits, /metrics,
/healthz, /readyz, uvicorn with a deadline for receiving requests."""
from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import importlib.util
import logging
import signal
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import ASGIApp

from keel.errors import UsageError

from .auth import ScopeCheck, install_bearer_auth, metadata_routes
from .config import MCP_PATH, METRICS_PATH, ServerConfig
from .fastpath import StatelessToolCalls
from .observe import Metrics
from .surface import TOOL_NAMES
from .throttle import CallLimits, CountResponses
from .tokens import TokenTable

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

LOOPBACK = ("127.0.0.1", "localhost", "[::1]")
RECLAIM_EVERY_S = 10.0          # how often the open sessions are counted for reclaim_session_memory
RECLAIM_AFTER = 100             # sessions closed since the last reclaim that make the next one


def security_settings(config: ServerConfig) -> TransportSecuritySettings:
    """Loopback names always; more only through --allow-host (a NAME[:PORT] or an origin http(s)://NAME[:PORT])."""
    hosts: list[str] = []
    origins: list[str] = []
    for name in LOOPBACK:
        hosts += [name, f"{name}:*"]
        origins += [f"http://{name}", f"http://{name}:*"]
    for entry in config.allow_hosts:
        if entry.startswith(("http://", "https://")):
            origins.append(entry.rstrip("/"))
            continue
        hosts.append(entry)
        origins += [f"http://{entry}", f"https://{entry}"]
        if not _has_port(entry):
            hosts.append(f"{entry}:*")
            origins += [f"http://{entry}:*", f"https://{entry}:*"]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts,
                                     allowed_origins=origins)


def _has_port(host: str) -> bool:
    return host.rsplit("]", 1)[-1].count(":") == 1 if host.startswith("[") else host.count(":") == 1


def add_metrics_route(server: MCPServer, metrics: Metrics, config: ServerConfig) -> None:
    """GET /metrics in Prometheus text format, behind the same Host/Origin checks as /mcp (no token needed).
    GET /healthz (the server's event loop answers) and /readyz (the store answers), without checks: probes
    of an orchestrator reach them by the pod's address."""
    guard = TransportSecurityMiddleware(security_settings(config))

    async def metrics_endpoint(request: Request) -> Response:
        refused = await guard.validate_request(request, is_post=False)
        if refused is not None:
            return refused
        return PlainTextResponse(metrics.render(), media_type=CONTENT_TYPE_PLAIN_0_0_4)

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        reason = await anyio.to_thread.run_sync(config.backend.unreachable)
        if reason:
            return JSONResponse({"status": "not ready", "failing": {"store": reason}}, status_code=503)
        return JSONResponse({"status": "ready"})

    server.custom_route(METRICS_PATH, methods=["GET"])(metrics_endpoint)
    server.custom_route("/healthz", methods=["GET"])(healthz)
    server.custom_route("/readyz", methods=["GET"])(readyz)


def http_app(server: MCPServer, config: ServerConfig, *, json_response: bool = True) -> ASGIApp:
    """The ASGI app: /mcp (streamable HTTP, bearer auth, per-token limits), /metrics, /healthz, /readyz.

    Tool calls answer with a plain JSON body by default (no SSE stream per call: the five tools send no
    progress or server-to-client requests, and a JSON body is several milliseconds faster); SSE with
    json_response=False. `config.http` says whether there are sessions, how long an idle one lives and how
    many may be open, and each token's limits (HttpOptions)."""
    opts = config.http
    metrics = config.metrics if config.metrics is not None else Metrics()
    app = server.streamable_http_app(streamable_http_path=MCP_PATH, json_response=json_response,
                                     stateless_http=opts.stateless, session_idle_timeout=opts.session_idle_timeout,
                                     max_sessions=opts.max_sessions, transport_security=security_settings(config),
                                     host=config.host)
    # Keel's bearer authentication in place of the SDK's (RFC 6750 challenges that say why, with scope=), then
    # (Starlette builds its middleware stack at the first request) the scope check of OAuth callers, then limits
    # keyed on the verified caller.
    resource = config.oauth.resource if config.oauth is not None else None
    if config.bearer:
        install_bearer_auth(app.user_middleware, path=MCP_PATH, resource=resource)
    app.user_middleware.append(Middleware(ScopeCheck, path=MCP_PATH, resource=resource))
    if config.oauth is not None:          # before the SDK's own metadata route, which names one issuer only
        app.router.routes[:0] = metadata_routes(config.oauth)
    app.user_middleware.append(Middleware(CallLimits, path=MCP_PATH, in_flight=opts.calls_in_flight,
                                          per_second=opts.calls_per_second))
    if opts.stateless and json_response:
        app.user_middleware.append(Middleware(StatelessToolCalls, path=MCP_PATH, server=server, tools=TOOL_NAMES,
                                              security=security_settings(config)))
    if opts.stateless:
        metrics.sessions.set(0)
        metrics.sessions_limit.set(0)
    else:
        metrics.sessions.set_function(lambda: open_sessions(server))
        metrics.sessions_limit.set(opts.max_sessions)
    return CountResponses(app, path=MCP_PATH, metrics=metrics)


def open_sessions(server: MCPServer) -> int:
    """The server's open MCP sessions. The SDK keeps them in a private dict and offers no count; pinned by
    tests/test_mcp_load.py (keel_mcp_sessions)."""
    return len(server.session_manager._server_instances)


async def reclaim_session_memory(count: Callable[[], int], *, every_s: float = RECLAIM_EVERY_S,
                                 after: int = RECLAIM_AFTER) -> None:
    """Give the memory of ended sessions back to the system: once `after` sessions have closed (expired or
    deleted) since the last time, collect garbage and trim the C heap (glibc's malloc_trim).

    A session leaves reference cycles (its task, streams and scopes) that wait for Python's rare full
    collection, and freed memory stays in the process's heap: 3,000 abandoned sessions took a server from
    94 to 212 MB and it stayed there after they expired; with this it comes back to about 150 MB (the rest is
    pymalloc arenas still holding some live object; later sessions reuse them). bench/serve_load.py --sessions
    measures it. The collection pauses the event loop for tens of milliseconds, at most once per `every_s`."""
    trim = _malloc_trim()
    peak = count()
    while True:
        await anyio.sleep(every_s)
        now = count()
        peak = max(peak, now)
        if peak - now >= after:
            objects = gc.collect()
            if trim is not None:
                trim(0)
            logging.getLogger("keel.serve").info(f"{peak - now} sessions closed since the last reclaim; "
                                                 f"{objects} objects collected, heap trimmed")
            peak = now


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, None elsewhere (musl, macOS)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


def request_deadline(seconds: float) -> type[Any]:
    """uvicorn's httptools protocol with a deadline for receiving a request: a connection must send a whole
    request (head and body) within `seconds` of opening, and each later request within `seconds` of its first
    byte, or it is closed. uvicorn has no such setting: its `timeout_keep_alive` runs only between a response
    and the next byte, so a connection that never sends anything, or trickles a request, stays open."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol  # uvicorn only when serving HTTP

    class DeadlineProtocol(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None

        def _arm(self) -> None:
            if self._deadline is None:
                self._deadline = self.loop.call_later(seconds, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return DeadlineProtocol


async def serve_http(server: MCPServer, config: ServerConfig, *, json_response: bool = True,
                     sock: socket.socket | None = None) -> None:
    """Serve until cancelled (Ctrl-C), on `sock` when given (see bind_socket). uvicorn parses HTTP with
    httptools (C), with a deadline for receiving each request (request_deadline); idle keep-alive connections
    close after uvicorn's timeout_keep_alive (5 s)."""
    import uvicorn
    app = http_app(server, config, json_response=json_response)
    uv = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level="warning",
                                       access_log=False, lifespan="on",
                                       http=request_deadline(config.http.header_timeout)))
    if config.tokens is not None:
        reload_tokens_on_sighup(config.tokens)
    async with anyio.create_task_group() as tasks:
        if not config.http.stateless:
            tasks.start_soon(reclaim_session_memory, lambda: open_sessions(server))
        await uv.serve(sockets=None if sock is None else [sock])
        tasks.cancel_scope.cancel()


def reload_tokens_on_sighup(table: TokenTable) -> None:
    """SIGHUP re-reads the tokens file (as the webhook does its secrets); connections and calls in flight are
    untouched. A bad file is reported and the old tokens stay."""
    def reload() -> None:
        try:
            print(f"keel serve: tokens file reloaded ({table.reload()} token(s))", file=sys.stderr, flush=True)
        except UsageError as e:
            print(f"keel serve: tokens file NOT reloaded, the previous tokens stay: {e}", file=sys.stderr, flush=True)
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload)


def run_server(main: Callable[[], Awaitable[None]]) -> None:
    """Run a server coroutine to completion on uvloop where it is installed (a quarter less CPU per tool call
    over HTTP than the default asyncio loop, measured with bench/tools.py), else on asyncio."""
    anyio.run(main, backend_options={"use_uvloop": importlib.util.find_spec("uvloop") is not None})
