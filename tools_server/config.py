"""What a Keel MCP server is built from: a backend, who the caller is, and how the server is reached."""
from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from keel.errors import UsageError
from keel.tokens import Identity  # the caller a tool call runs as (shared with `keel inspect`)

if TYPE_CHECKING:
    from keel.oauth import OAuthSettings

    from .backend import Backend
    from .observe import Metrics
    from .tokens import TokenTable

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
MCP_PATH = "/mcp"
METRICS_PATH = "/metrics"
CALL_LOGGER = "keel.tools_server.calls"


@dataclass(frozen=True)
class HttpOptions:
    """How `keel serve --transport http` holds up under load (flags, then KEEL_MCP_* variables, then these
    defaults; see `http_options`).

    stateless             no MCP sessions: every POST stands alone, so any of several servers may answer it
    session_idle_timeout  seconds a session may go without a request before it is closed (its id then gets 404)
    max_sessions          open sessions at most; a request opening one more gets 503 (the SDK's answer)
    header_timeout        seconds a connection has to send a whole request, from connecting or from its
                          first byte; silent or trickling connections are closed
    calls_in_flight       POSTs to /mcp one token may have in flight at once; more get 429
    calls_per_second      POSTs to /mcp one token may send in any one-second window; more get 429
    """
    stateless: bool = False
    session_idle_timeout: float = 300.0
    max_sessions: int = 1000
    header_timeout: float = 10.0
    calls_in_flight: int = 16
    calls_per_second: int = 50


HTTP_ENV = {"stateless": "KEEL_MCP_STATELESS", "session_idle_timeout": "KEEL_MCP_SESSION_IDLE_TIMEOUT",
            "max_sessions": "KEEL_MCP_MAX_SESSIONS", "header_timeout": "KEEL_MCP_HEADER_TIMEOUT",
            "calls_in_flight": "KEEL_MCP_CALLS_IN_FLIGHT", "calls_per_second": "KEEL_MCP_CALLS_PER_SECOND"}


def http_options(flags: Mapping[str, object], env: Mapping[str, str] | None = None) -> HttpOptions:
    """HttpOptions from parsed flags (None = not given), then the KEEL_MCP_* variables, then the defaults.
    Raises UsageError naming the flag or variable of a bad value."""
    env = os.environ if env is None else env
    default = HttpOptions()
    values: dict[str, object] = {}
    for name, var in HTTP_ENV.items():
        flag, raw = flags.get(name), env.get(var)
        if flag is None and (raw is None or not raw.strip()):
            continue
        where = f"--{name.replace('_', '-')}" if flag is not None else var
        value = flag if flag is not None else raw.strip()  # type: ignore[union-attr]
        values[name] = _option(name, value, type(getattr(default, name)), where)
    return HttpOptions(**values)  # type: ignore[arg-type]


def _option(name: str, value: object, kind: type, where: str) -> object:
    if kind is bool:
        if isinstance(value, bool):
            return value
        text = str(value).lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise UsageError(f"bad {where} {value!r}: use true or false")
    try:
        number = kind(value)
    except (TypeError, ValueError):
        number = None
    if number is None or not math.isfinite(number) or number <= 0:
        what = "a positive whole number" if kind is int else "a positive number of seconds"
        raise UsageError(f"bad {where} {value!r}: {what}")
    return number


@dataclass
class ServerConfig:
    """Everything `build_server` needs: either `identity` (stdio, in-process) or bearer auth (HTTP) by static
    `tokens`, by `oauth` (JWTs of trusted issuers), or both."""
    backend: Backend
    identity: Identity | None = None
    tokens: TokenTable | None = None
    oauth: OAuthSettings | None = None
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    allow_hosts: tuple[str, ...] = ()
    call_log: logging.Logger | None = None
    http: HttpOptions = field(default_factory=HttpOptions)
    metrics: Metrics | None = None      # the server's series; build_server makes them when None

    def __post_init__(self) -> None:
        if (self.identity is None) == (not self.bearer):
            raise UsageError("bind the caller either by a fixed identity (--tenant) or by bearer tokens "
                             "(--tokens, --issuer)")

    @property
    def bearer(self) -> bool:
        """Callers are bound by bearer tokens (static, OAuth or both)."""
        return self.tokens is not None or self.oauth is not None
