"""Webhook authentication: per-tenant HMAC-SHA256 signatures of the raw request body.

A sender sends `X-Keel-Tenant: <tenant>` and `X-Keel-Signature: sha256=<hex of HMAC-SHA256(secret, body)>`.
The secrets file is a YAML (or JSON) mapping from tenant to its secret, or to a list of secrets while a
secret is rotated (any of them verifies):

    acme: "b6c1f0e4...at least 16 characters"
    globex: ["new secret ...", "previous secret ..."]
"""
from __future__ import annotations

import hashlib
import hmac
import os
import stat
from collections.abc import Mapping
from pathlib import Path

import yaml

from keel.identifiers import TENANT

from .errors import SecretsInvalid

TENANT_HEADER = "X-Keel-Tenant"
SIGNATURE_HEADER = "X-Keel-Signature"
SCHEME = "sha256="
MIN_SECRET = 16


def sign(secret: str | bytes, body: bytes) -> str:
    """The `X-Keel-Signature` value of a body: `sha256=<hex>` (what a sender computes)."""
    key = secret.encode() if isinstance(secret, str) else secret
    return SCHEME + hmac.new(key, body, hashlib.sha256).hexdigest()


class Secrets:
    """Tenant → accepted secrets, verified in constant time."""

    def __init__(self, secrets: Mapping[str, tuple[bytes, ...]]) -> None:
        self._secrets = dict(secrets)
        self._decoy = os.urandom(32)

    def __len__(self) -> int:
        return len(self._secrets)

    def verify(self, tenant: str | None, body: bytes, signature: str | None) -> bool:
        """Whether `signature` is `sha256=<hex>` of the body under one of the tenant's secrets. An unknown
        tenant costs the same work as a known one and fails."""
        given = (signature or "").strip()
        given_hex = given[len(SCHEME):].lower() if given.lower().startswith(SCHEME) else ""
        given_bytes = given_hex.encode("utf-8", "replace")
        keys = self._secrets.get(tenant or "") or (self._decoy,)
        ok = False
        for key in keys:
            expected = hmac.new(key, body, hashlib.sha256).hexdigest().encode()
            ok |= hmac.compare_digest(expected, given_bytes)
        return ok and bool(tenant) and tenant in self._secrets


def load_secrets(path: str | Path) -> Secrets:
    """Read and check a secrets file. Raises SecretsInvalid with every problem found."""
    file = Path(path)
    try:
        doc = yaml.safe_load(file.read_text(encoding="utf-8"))
    except OSError as e:
        raise SecretsInvalid(f"secrets file {file}: {e.strerror or e}") from e
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise SecretsInvalid(f"secrets file {file}: not valid YAML/JSON: {e}") from e
    if not isinstance(doc, dict) or not doc:
        raise SecretsInvalid(f"secrets file {file}: must be a non-empty mapping of tenant to secret "
                             f"(or to a list of secrets)")
    problems: list[str] = []
    secrets: dict[str, tuple[bytes, ...]] = {}
    for tenant, value in doc.items():
        if not isinstance(tenant, str) or not TENANT.match(tenant):
            problems.append(f"{tenant!r}: not a tenant name ([A-Za-z0-9][A-Za-z0-9._-]{{0,63}})")
            continue
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, str) and len(v) >= MIN_SECRET for v in values):
            problems.append(f"{tenant}: each secret must be a string of at least {MIN_SECRET} characters")
            continue
        secrets[tenant] = tuple(v.encode() for v in values)
    if problems:
        raise SecretsInvalid(f"secrets file {file}:\n" + "\n".join(f"  {p}" for p in problems))
    return Secrets(secrets)


def loose_permissions(path: str | Path) -> bool:
    """Whether the file is readable by group or others (the CLI warns)."""
    try:
        mode = Path(path).stat().st_mode
    except OSError:
        return False
    return bool(mode & (stat.S_IRGRP | stat.S_IROTH))
