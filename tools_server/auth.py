"""Bearer auth on the HTTP transport through the SDK: the token verifier (static tokens from a TokenTable,
OAuth JWTs from trusted issuers, or both), the scope check, and the caller identity of the current request.

The SDK's bearer middleware calls `BearerVerifier.verify_token`; an unknown or missing token never reaches a
tool (401, with `resource_metadata` when OAuth is on), and an HTTP session stays bound to the principal that
opened it (another gets 404). `ScopeCheck` then asks OAuth callers for `keel:read` to read and `keel:write` to
annotate (403 `insufficient_scope`); a static token may do both.
"""
from __future__ import annotations

import json
import logging
from typing import Any

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.routes import build_resource_metadata_url, create_protected_resource_routes
from mcp.server.auth.settings import AuthSettings
from pydantic import AnyHttpUrl
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from keel.oauth import READ_SCOPE, SCOPES, WRITE_SCOPE, JwtVerifier, OAuthSettings, TokenRefused

from .config import Identity
from .tokens import TokenTable

WRITE_TOOLS = frozenset({"annotate"})
log = logging.getLogger("keel.serve.oauth")


class BearerVerifier:
    """The SDK's TokenVerifier: a static token of the table, else a JWT of a trusted issuer (when OAuth is on).
    The identity travels in the access token's claims; `token` is a digest the per-caller limits key on."""

    def __init__(self, table: TokenTable | None = None, oauth: OAuthSettings | None = None) -> None:
        self.table = table
        self.jwt = JwtVerifier(oauth) if oauth is not None else None
        self.resource = oauth.resource if oauth is not None else None

    async def verify_token(self, token: str) -> AccessToken | None:
        if self.table is not None:
            found = self.table.lookup(token)
            if found is not None:
                digest, identity = found
                return AccessToken(token=digest, client_id=f"keel-{digest[:16]}", scopes=list(SCOPES),
                                   subject=digest, claims=_claims(identity))
        if self.jwt is None:
            return None
        try:
            v = await self.jwt.verify(token)
        except TokenRefused as e:
            log.warning(f"bearer token refused: {e}")
            return None
        return AccessToken(token=v.key, client_id=v.client, scopes=list(v.scopes), expires_at=v.expires_at,
                           resource=self.resource, subject=v.subject,
                           claims={**_claims(v.identity), "iss": v.issuer})


TokenFileVerifier = BearerVerifier      # the name of the static-token verifier before OAuth came


def _claims(identity: Identity) -> dict[str, Any]:
    return {"keel_tenant": identity.tenant, "keel_agent": identity.agent, "keel_task": identity.task}


def authenticated_identity() -> Identity | None:
    """The identity of the current HTTP request's bearer token (None outside an authenticated request)."""
    token = get_access_token()
    if token is None or not token.claims or "keel_tenant" not in token.claims:
        return None
    c = token.claims
    return Identity(c["keel_tenant"], c.get("keel_agent"), c.get("keel_task"))


def auth_settings(host: str, port: int, oauth: OAuthSettings | None = None) -> AuthSettings:
    """SDK auth settings. Static tokens only: a resource server that verifies its own tokens, no metadata. With
    OAuth: the resource URL, so 401s carry `resource_metadata` (the audience is checked by JwtVerifier)."""
    if oauth is not None:
        return AuthSettings(issuer_url=oauth.issuers[0], resource_server_url=oauth.resource,  # type: ignore[arg-type]
                            validate_token_resource=False)
    shown = f"[{host}]" if ":" in host else host
    return AuthSettings(issuer_url=f"http://{shown}:{port}", resource_server_url=None)


def metadata_routes(oauth: OAuthSettings) -> list[Route]:
    """RFC 9728 Protected Resource Metadata (the SDK's route) naming every trusted issuer and Keel's scopes, at
    /.well-known/oauth-protected-resource<resource path>."""
    return create_protected_resource_routes(resource_url=AnyHttpUrl(oauth.resource),
                                            authorization_servers=list(oauth.issuers),  # type: ignore[arg-type]
                                            scopes_supported=list(SCOPES), resource_name="Keel")


def needed_scopes(body: bytes) -> set[str] | None:
    """The scopes a POSTed JSON-RPC body needs: keel:write for annotate, keel:read for the other tools, None
    (either scope) for everything else; None too for a body that is not JSON-RPC (the SDK refuses it)."""
    try:
        parsed = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    needed: set[str] = set()
    for msg in parsed if isinstance(parsed, list) else [parsed]:
        if isinstance(msg, dict) and msg.get("method") == "tools/call":
            params = msg.get("params")
            name = params.get("name") if isinstance(params, dict) else None
            needed.add(WRITE_SCOPE if name in WRITE_TOOLS else READ_SCOPE)
    return needed or None


class ScopeCheck:
    """ASGI middleware on `path`, after the SDK's authentication: an OAuth caller needs one of Keel's scopes for
    any request, keel:read to call a reading tool and keel:write to call annotate; else 403 insufficient_scope
    (RFC 6750 §3.1). Callers holding both scopes (static tokens) pass without their body being read."""

    def __init__(self, app: ASGIApp, *, path: str, resource: str | None) -> None:
        self.app = app
        self.path = path
        self.metadata = str(build_resource_metadata_url(AnyHttpUrl(resource))) if resource else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        user = scope.get("user")
        if scope["type"] != "http" or scope["path"] != self.path or not isinstance(user, AuthenticatedUser):
            return await self.app(scope, receive, send)
        held = set(user.scopes)
        if held >= set(SCOPES):
            return await self.app(scope, receive, send)
        if not held & set(SCOPES):
            return await self.refuse(send, READ_SCOPE)
        if scope["method"] != "POST":
            return await self.app(scope, receive, send)
        messages: list[Message] = []
        body = b""
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        missing = sorted((needed_scopes(body) or set()) - held)
        if missing:
            return await self.refuse(send, " ".join(missing))

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()
        await self.app(scope, replay, send)

    async def refuse(self, send: Send, scopes: str) -> None:
        parts = ['error="insufficient_scope"', f'scope="{scopes}"',
                 f'error_description="this call needs the scope {scopes}"']
        if self.metadata:
            parts.append(f'resource_metadata="{self.metadata}"')
        body = json.dumps({"error": "insufficient_scope", "error_description": f"this call needs the scope {scopes}"})
        await send({"type": "http.response.start", "status": 403,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", ("Bearer " + ", ".join(parts)).encode())]})
        await send({"type": "http.response.body", "body": body.encode()})
