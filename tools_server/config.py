"""What a Keel MCP server is built from: a backend, who the caller is, and how the server is reached."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from keel.envelope import TENANT
from keel.errors import UsageError

if TYPE_CHECKING:
    from .backend import Backend
    from .tokens import TokenTable

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
MCP_PATH = "/mcp"
METRICS_PATH = "/metrics"
CALL_LOGGER = "keel.tools_server.calls"


@dataclass(frozen=True)
class Identity:
    """The caller a tool call runs as: tenant, and the agent and task that own private notes."""
    tenant: str
    agent: str | None = None
    task: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.tenant, str) or not TENANT.fullmatch(self.tenant):
            raise UsageError(f"bad tenant {self.tenant!r}")
        for name in ("agent", "task"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value or len(value) > 256):
                raise UsageError(f"bad {name} {value!r}: a non-empty string of at most 256 characters")


@dataclass
class ServerConfig:
    """Everything `build_server` needs. Exactly one of `identity` (stdio, in-process) or `tokens` (HTTP)."""
    backend: Backend
    identity: Identity | None = None
    tokens: TokenTable | None = None
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    allow_hosts: tuple[str, ...] = ()
    call_log: logging.Logger | None = None

    def __post_init__(self) -> None:
        if (self.identity is None) == (self.tokens is None):
            raise UsageError("bind the caller either by a fixed identity (--tenant) or by bearer tokens (--tokens)")
