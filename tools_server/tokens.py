"""The tokens file: sha256 hashes of bearer tokens, each bound to one caller identity (no MCP SDK here).
Reading it (TokenTable, Identity, hash_token, tokens_path) is keel.tokens, shared with `keel inspect`;
this module makes tokens and their lines, and re-exports the reading side for this package.

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

import json
import os
import secrets
from pathlib import Path

from keel.errors import UsageError
from keel.tokens import TOKENS_ENV, Identity, TokenTable, hash_token, tokens_path

__all__ = ["TOKENS_ENV", "TokenTable", "append_entry", "hash_token", "new_token", "token_entry", "tokens_path"]

FILE_MODE = 0o644           # digests only: readable by the server's user in a container (see above)
CONTAINER_UID = 10001       # the user of Keel's image (deploy/Containerfile)


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


