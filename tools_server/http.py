"""The streamable HTTP transport: Host/Origin checks (DNS rebinding), bearer auth, /metrics, /healthz, /readyz,
uvicorn."""
from __future__ import annotations

import asyncio
import importlib.util
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import anyio
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response

from keel.errors import UsageError

from .config import MCP_PATH, METRICS_PATH, ServerConfig
from .observe import Metrics
from .tokens import TokenTable

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


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


def http_app(server: MCPServer, config: ServerConfig, *, json_response: bool = True) -> Starlette:
    """The ASGI app: /mcp (streamable HTTP, bearer auth when tokens are configured) and /metrics.

    Tool calls answer with a plain JSON body by default (no SSE stream per call: the five tools send no
    progress or server-to-client requests, and a JSON body is several milliseconds faster); SSE with
    json_response=False."""
    return server.streamable_http_app(streamable_http_path=MCP_PATH, json_response=json_response,
                                      transport_security=security_settings(config), host=config.host)


async def serve_http(server: MCPServer, config: ServerConfig, *, json_response: bool = True) -> None:
    """Serve until cancelled (Ctrl-C). uvicorn parses HTTP with httptools (C) when installed, as it is here."""
    import uvicorn
    app = http_app(server, config, json_response=json_response)
    uv = uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_level="warning",
                                       access_log=False, lifespan="on"))
    if config.tokens is not None:
        reload_tokens_on_sighup(config.tokens)
    await uv.serve()


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
