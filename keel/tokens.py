"""Reading the tokens file: sha256 hashes of bearer tokens, each bound to one caller identity.

Every server that binds callers by bearer token reads the same file: `keel serve --transport http`
(tools_server) and `keel inspect` (inspector), so it lives in the core, below both. Making tokens and
appending lines (`keel token`) stays with tools_server.tokens.

JSON lines `{"token_sha256": "<64 hex>", "tenant": "T", "agent": "A", "task": "K"}` (agent and task
optional; blank lines and `#` comments allowed). The file never holds a token itself.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import KeelError, UsageError
from .identifiers import TENANT

TOKENS_ENV = "KEEL_TOKENS_FILE"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_FIELDS = {"token_sha256", "tenant", "agent", "task"}


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


def hash_token(token: str) -> str:
    """The sha256 hex digest a tokens file stores for `token`."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class TokenTable:
    """sha256(token) → identity."""

    def __init__(self, entries: dict[str, Identity], source: tuple[Path, str | None] | None = None) -> None:
        self._by_hash = dict(entries)
        self._source = source            # (file, tenant filter) it was loaded from, for `reload`

    def __len__(self) -> int:
        return len(self._by_hash)

    def tenants(self) -> list[str]:
        """The tenants the tokens are bound to."""
        return sorted({identity.tenant for identity in self._by_hash.values()})

    def lookup(self, token: str) -> tuple[str, Identity] | None:
        """(hash, identity) of a presented token, None when unknown."""
        digest = hash_token(token)
        identity = self._by_hash.get(digest)
        return None if identity is None else (digest, identity)

    @classmethod
    def load(cls, path: str | Path, *, tenant: str | None = None) -> TokenTable:
        """Read a tokens file; with `tenant`, keep only that tenant's tokens. Raises UsageError on a bad line."""
        entries: dict[str, Identity] = {}
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise UsageError(f"tokens file {path}: {e.strerror or e}") from None
        for number, line in enumerate(lines, 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            digest, identity = _parse_line(line, f"{path}:{number}")
            if digest in entries:
                raise UsageError(f"{path}:{number}: the same token hash appears twice")
            if tenant is None or identity.tenant == tenant:
                entries[digest] = identity
        if not entries:
            which = f" for tenant {tenant!r}" if tenant else ""
            raise UsageError(f"tokens file {path} holds no token{which}; make one with `keel token`")
        return cls(entries, (Path(path), tenant))

    def reload(self) -> int:
        """Read the file again (SIGHUP): the new table replaces the old in one assignment, so calls in flight
        are not disturbed, and the next request of a removed token is refused (401). A bad file raises
        UsageError and leaves the table as it was. Returns the number of tokens."""
        if self._source is None:
            raise UsageError("this token table was not loaded from a file")
        path, tenant = self._source
        self._by_hash = TokenTable.load(path, tenant=tenant)._by_hash
        return len(self)


def _parse_line(line: str, where: str) -> tuple[str, Identity]:
    try:
        data: Any = json.loads(line)
    except ValueError:
        raise UsageError(f"{where}: not a JSON object") from None
    if not isinstance(data, dict):
        raise UsageError(f"{where}: not a JSON object")
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise UsageError(f"{where}: unknown field(s) {', '.join(unknown)}")
    digest = data.get("token_sha256")
    if not isinstance(digest, str) or not _HEX64.match(digest):
        raise UsageError(f"{where}: token_sha256 must be 64 lowercase hex digits (never the token itself)")
    try:
        identity = Identity(data.get("tenant"), data.get("agent"), data.get("task"))
    except KeelError as e:
        raise UsageError(f"{where}: {e}") from None
    return digest, identity


def tokens_path(flag: str | None) -> str | None:
    """The tokens file from the flag, else from KEEL_TOKENS_FILE."""
    return flag or os.environ.get(TOKENS_ENV) or None
