"""The tokens file: sha256 hashes of bearer tokens, each bound to one caller identity (no MCP SDK here).

JSON lines `{"token_sha256": "<64 hex>", "tenant": "T", "agent": "A", "task": "K"}` (agent and task
optional; blank lines and `#` comments allowed). The file never holds a token itself; `keel token` (or
`new_token` + `token_entry`) makes a token and its line, `append_entry` adds it to a file.

The file is not a secret: a sha256 digest of a 256-bit random token cannot be turned back into the token, so
reading the file lets no one call the server; it shows which tenants, agents and tasks have tokens. A new file
is therefore made mode 0644, so the server can read it in a container that runs as another user (the image's
uid 10001, deploy/Containerfile) from a bind mount, as compose does. A file that a container could not read
(not readable by others, not owned by uid 10001) gets a warning saying so.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
from pathlib import Path
from typing import Any

from keel.errors import KeelError, UsageError

from .config import Identity

TOKENS_ENV = "KEEL_TOKENS_FILE"
FILE_MODE = 0o644           # digests only: readable by the server's user in a container (see above)
CONTAINER_UID = 10001       # the user of Keel's image (deploy/Containerfile)
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_FIELDS = {"token_sha256", "tenant", "agent", "task"}


def hash_token(token: str) -> str:
    """The sha256 hex digest a tokens file stores for `token`."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    """A fresh random bearer token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def token_entry(token: str, identity: Identity) -> dict[str, str]:
    """The tokens-file line (as a dict) that binds `token` to `identity`."""
    entry = {"token_sha256": hash_token(token), "tenant": identity.tenant}
    if identity.agent:
        entry["agent"] = identity.agent
    if identity.task:
        entry["task"] = identity.task
    return entry


def append_entry(path: str | Path, entry: dict[str, str]) -> str | None:
    """Append one line to a tokens file; a new file is made mode 0644 whatever the umask. Returns a warning
    when the file is one a container running as uid 10001 cannot read (an older file made 0600); UsageError
    when it cannot be written."""
    line = json.dumps(entry, separators=(",", ":")) + "\n"
    try:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL, FILE_MODE)
            os.fchmod(fd, FILE_MODE)
        except FileExistsError:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(line)
            st = os.fstat(f.fileno())
    except OSError as e:
        raise UsageError(f"tokens file {path}: {e.strerror or e}") from None
    if st.st_mode & 0o004 or st.st_uid == CONTAINER_UID:
        return None
    return (f"{path} is mode {st.st_mode & 0o777:04o} and owned by uid {st.st_uid}: a container running as uid "
            f"{CONTAINER_UID} (Keel's image) cannot read it; `chmod 644 {path}` (it holds only sha256 digests)")


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
