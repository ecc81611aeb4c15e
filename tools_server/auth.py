"""Bearer auth on the HTTP transport through the SDK: the token verifier over a TokenTable, and the
caller identity of the current request.

The SDK's bearer middleware calls `TokenFileVerifier.verify_token`; an unknown or missing token never
reaches a tool (401), and an HTTP session stays bound to the token that opened it (another token gets 404).
"""
from __future__ import annotations

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings

from .config import Identity
from .tokens import TokenTable


class TokenFileVerifier:
    """The SDK's TokenVerifier over a TokenTable; the identity travels in the access token's claims."""

    def __init__(self, table: TokenTable) -> None:
        self.table = table

    async def verify_token(self, token: str) -> AccessToken | None:
        found = self.table.lookup(token)
        if found is None:
            return None
        digest, identity = found
        return AccessToken(token=digest, client_id=f"keel-{digest[:16]}", scopes=[], subject=digest,
                           claims={"keel_tenant": identity.tenant, "keel_agent": identity.agent,
                                   "keel_task": identity.task})


def authenticated_identity() -> Identity | None:
    """The identity of the current HTTP request's bearer token (None outside an authenticated request)."""
    token = get_access_token()
    if token is None or not token.claims or "keel_tenant" not in token.claims:
        return None
    c = token.claims
    return Identity(c["keel_tenant"], c.get("keel_agent"), c.get("keel_task"))


def auth_settings(host: str, port: int) -> AuthSettings:
    """SDK auth settings for a resource server that verifies its own tokens (no OAuth endpoints are mounted)."""
    shown = f"[{host}]" if ":" in host else host
    return AuthSettings(issuer_url=f"http://{shown}:{port}", resource_server_url=None)
