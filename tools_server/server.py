"""`build_server(config) -> MCPServer`: the five tools (context, history, search, annotate, related) over keel.Tools, nothing else.

Handlers take every argument loosely and leave checking to keel.Tools, so an agent gets Keel's own
messages for bad arguments and every call, good or bad, is observed. The schemas clients see are the
hand-written ones of `surface.py`.
"""
from __future__ import annotations

import warnings
from collections.abc import Awaitable, Callable
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from mcp.server.caching import CacheHint
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.tools import Tool
from mcp_types import CallToolResult
from pydantic import BaseModel, ConfigDict
from pydantic.json_schema import PydanticJsonSchemaWarning

from keel.errors import UsageError
from keel.tools import Tools

from .auth import BearerVerifier, auth_settings, authenticated_identity
from .calls import CallRunner
from .config import Identity, ServerConfig
from .http import add_metrics_route
from .observe import Metrics, Observer
from .surface import LIST_TOOLS_TTL_MS, SPECS, ToolSpec

INSTRUCTIONS = ("Exact, auditable answers about one tenant's graph. Find ids with search; read with context, "
                "history and related; save conclusions with annotate.")
Handler = Callable[..., Awaitable[CallToolResult]]


class _Missing:
    """Default of a required argument the caller left out (Tools then says what is expected)."""

    def __repr__(self) -> str:
        return "missing"


def build_server(config: ServerConfig) -> MCPServer:
    """A new MCP server over `config.backend`, callers bound by `config.identity` or bearer tokens."""
    if config.metrics is None:
        config.metrics = Metrics()      # the HTTP transport adds its series to the same registry
    observer = Observer(config.call_log, config.metrics)
    runner = CallRunner(config.backend, _identity_source(config), observer)
    handlers = _handlers(runner)
    auth: dict[str, Any] = {}
    if config.bearer:
        auth = {"token_verifier": BearerVerifier(config.tokens, config.oauth),
                "auth": auth_settings(config.host, config.port, config.oauth)}
    server: MCPServer = MCPServer(
        "keel", instructions=INSTRUCTIONS, version=_version(), tools=[_tool(s, handlers[s.name], runner) for s in SPECS],
        log_level="WARNING", cache_hints={"tools/list": CacheHint(ttl_ms=LIST_TOOLS_TTL_MS, scope="public")},
        **auth)
    add_metrics_route(server, observer.metrics, config)
    return server


def _identity_source(config: ServerConfig) -> Callable[[], Identity | None]:
    if config.bearer:
        return authenticated_identity        # HTTP: only the bearer token decides, never a flag or an argument
    fixed = config.identity
    return lambda: fixed


def _tool(spec: ToolSpec, fn: Handler, run: CallRunner) -> Tool:
    with warnings.catch_warnings():     # the schema derived from the loose signature is replaced below
        warnings.simplefilter("ignore", PydanticJsonSchemaWarning)
        tool = Tool.from_function(fn, name=spec.name, description=spec.description, annotations=spec.annotations,
                                  structured_output=False)
    names = tuple(spec.input_schema["properties"])

    async def checked(**arguments: Any) -> CallToolResult:
        unknown = arguments.pop(_UNKNOWN, ())
        if unknown:                     # a tool error naming them, observed like every call
            message = (f"unknown argument{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                       f"{spec.name} takes {', '.join(names)}")
            return await run.call(spec.name, lambda t: _refuse(message))
        return await fn(**arguments)

    metadata = tool.fn_metadata.model_copy(update={"output_schema": spec.output_schema,
                                                   "arg_model": _strict(tool.fn_metadata.arg_model)})
    return tool.model_copy(update={"parameters": spec.input_schema, "fn_metadata": metadata, "fn": checked})


_UNKNOWN = "__unknown_arguments__"


def _strict(model: type[BaseModel]) -> type[BaseModel]:
    """The SDK's argument model, keeping the names of arguments the tool does not take so the tool can refuse
    them by name (the SDK's own model would drop them silently)."""
    class Strict(model):  # type: ignore[valid-type, misc]
        model_config = ConfigDict(**{**model.model_config, "extra": "allow"})

        def model_dump_one_level(self) -> dict[str, Any]:
            return {**super().model_dump_one_level(), _UNKNOWN: sorted(self.model_extra or {})}
    Strict.__name__ = model.__name__
    return Strict


def _refuse(message: str) -> dict[str, Any]:
    raise UsageError(message)


def _handlers(run: CallRunner) -> dict[str, Handler]:
    missing: Any = _Missing()

    async def context(entity: Any = None, at: Any = None, known_at: Any = None) -> CallToolResult:
        return await run.call("context", lambda t: t.context(entity, at=at, known_at=known_at),
                              arguments={"entity": entity, "at": at, "known_at": known_at})

    async def history(entity: Any = None, predicate: Any = None, known_at: Any = None, since: Any = None,
                      type: Any = None, cursor: Any = None, limit: Any = None) -> CallToolResult:
        return await run.call("history", lambda t: t.history(entity, predicate=predicate, known_at=known_at,
                                                             since=since, type=type, cursor=cursor, limit=limit),
                              arguments={"entity": entity, "predicate": predicate, "known_at": known_at,
                                         "since": since, "type": type, "cursor": cursor, "limit": limit})

    async def search(query: Any = None, type: Any = None, limit: Any = None, at: Any = None,
                     known_at: Any = None) -> CallToolResult:
        return await run.call("search", lambda t: t.search(query, type=type, limit=limit, at=at, known_at=known_at),
                              arguments={"query": query, "type": type, "limit": limit, "at": at, "known_at": known_at})

    async def annotate(entity: Any = None, predicate: Any = None, value: Any = missing, scope: Any = None,
                       evidence: Any = None, withdraw: Any = None, reason: Any = None) -> CallToolResult:
        def write(t: Tools) -> dict[str, Any]:       # no value: Tools says whether one was needed
            given = {} if value is missing else {"value": value}
            return t.annotate(entity, predicate, **given, scope=scope, evidence=evidence, withdraw=withdraw,
                              reason=reason)
        return await run.call("annotate", write, write=True, arguments={   # the value and reason never kept
            "entity": entity, "predicate": predicate, "scope": scope, "evidence": evidence, "withdraw": withdraw})

    async def related(entity: Any = None, relation: Any = None, at: Any = None,
                      known_at: Any = None) -> CallToolResult:
        return await run.call("related", lambda t: t.related(entity, relation=relation, at=at, known_at=known_at),
                              arguments={"entity": entity, "relation": relation, "at": at, "known_at": known_at})

    return {"context": context, "history": history, "search": search, "annotate": annotate, "related": related}


def _version() -> str:
    try:
        return version("keel")
    except PackageNotFoundError:
        return "0"
