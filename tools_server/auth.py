"""Bearer auth on the HTTP transport: the token verifier (static tokens from a TokenTable, OAuth JWTs from trusted
issuers, or both), the challenges of RFC 6750 and the MCP authorization spec, the scope check, and the caller
identity of the current request.

`BearerAuth` takes the place of the SDK's authentication middleware (its backend loses why a token was refused,
and its 401 says `invalid_token` "Authentication required" even when no token was sent). On /mcp it answers
- no bearer credentials (no Authorization header, or another scheme): 401 with no error code (RFC 6750 §3.1);
- `Authorization: Bearer` with nothing after it: 400 `invalid_request`;
- a token refused: 401 `invalid_token` whose `error_description` says why (expired, another audience, an issuer
  not trusted, a bad signature or unknown key, a tenant not served here...), a reason that holds no claim value;
each challenge with `scope=` naming the scopes the request needs (`keel:read`, plus `keel:write` for a body that
calls annotate), so a client's client-credentials flow asks its identity provider for those and not for every
scope in `scopes_supported` (a read-only client would get `invalid_scope`), and `resource_metadata=` with OAuth.
An HTTP session stays bound to the principal that opened it (another gets 404). `ScopeCheck` then asks OAuth
callers for `keel:read` to read and `keel:write` to annotate: else 403 `insufficient_scope` with `scope=` naming
the scopes that call lacks (clients add them to what they hold: MCP's step-up flow); a static token may do both.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.routes import build_resource_metadata_url, create_protected_resource_routes
from mcp.server.auth.settings import AuthSettings
from pydantic import AnyHttpUrl
from starlette.authentication import AuthCredentials, UnauthenticatedUser
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from keel.oauth import READ_SCOPE, SCOPES, WRITE_SCOPE, JwtVerifier, OAuthSettings, TokenRefused

from .config import Identity
from .tokens import TokenTable

WRITE_TOOLS = frozenset({"annotate"})
CHALLENGE_BODY_BYTES = 64 * 1024    # how much of an unauthenticated POST is read to name the scopes it needs
log = logging.getLogger("keel.serve.oauth")


class BearerVerifier:
    """The SDK's TokenVerifier: a static token of the table, else a JWT of a trusted issuer (when OAuth is on).
    The identity travels in the access token's claims; `token` is a digest the per-caller limits key on."""

    def __init__(self, table: TokenTable | None = None, oauth: OAuthSettings | None = None) -> None:
        self.table = table
        self.jwt = JwtVerifier(oauth) if oauth is not None else None
        self.resource = oauth.resource if oauth is not None else None

    async def verify_token(self, token: str) -> AccessToken | None:
        """The SDK's protocol: the access token, or None when refused (`verify` says why)."""
        try:
            return await self.verify(token)
        except TokenRefused:
            return None

    async def verify(self, token: str) -> AccessToken:
        """The access token, or TokenRefused with a reason fit for the caller (never a claim value)."""
        if self.table is not None:
            found = self.table.lookup(token)
            if found is not None:
                digest, identity = found
                return AccessToken(token=digest, client_id=f"keel-{digest[:16]}", scopes=list(SCOPES),
                                   subject=digest, claims=_claims(identity))
        if self.jwt is None:
            raise TokenRefused("unknown token")
        try:
            v = await self.jwt.verify(token)
        except TokenRefused as e:
            log.warning(f"bearer token refused: {e}")
            if self.table is not None and str(e) == "not a JWT":
                raise TokenRefused("neither a token of this server's tokens file nor a JWT") from None
            raise
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


def metadata_url(resource: str | None) -> str | None:
    """The Protected Resource Metadata URL a challenge names (`resource_metadata=`); None without OAuth."""
    return str(build_resource_metadata_url(AnyHttpUrl(resource))) if resource else None


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


def challenge_scopes(body: bytes) -> list[str]:
    """The scopes a 401 names: keel:read, which every call but annotate needs (a client replaces its scopes
    with a 401's, so a writer that re-authenticates keeps reading), and keel:write when the body calls annotate
    (so a writer whose token expired gets it back on that call)."""
    return _ordered({READ_SCOPE} | (needed_scopes(body) or set()))


def _ordered(scopes: Iterable[str]) -> list[str]:
    wanted = set(scopes)
    return [s for s in SCOPES if s in wanted] + sorted(wanted - set(SCOPES))


@dataclass(frozen=True)
class Challenge:
    """An RFC 6750 §3 refusal: its status, error code (None when no credentials were sent), a description for
    the caller, the scopes the request needs and the resource's metadata URL."""
    status: int
    error: str | None
    description: str
    scopes: list[str]
    metadata: str | None = None

    def header(self) -> str:
        """The WWW-Authenticate value. No error code or description without one (§3.1); the description is
        kept to the characters §3 allows in it."""
        parts = []
        if self.error:
            parts += [f'error="{self.error}"', f'error_description="{_quotable(self.description)}"']
        parts.append(f'scope="{" ".join(self.scopes)}"')
        if self.metadata:
            parts.append(f'resource_metadata="{self.metadata}"')
        return "Bearer " + ", ".join(parts)

    async def send(self, send: Send) -> None:
        doc: dict[str, str] = {"error": self.error} if self.error else {}
        doc["error_description"] = self.description
        body = json.dumps(doc).encode()
        await send({"type": "http.response.start", "status": self.status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"www-authenticate", self.header().encode())]})
        await send({"type": "http.response.body", "body": body})


def _quotable(text: str) -> str:
    """RFC 6750 §3: error_description is %x20-21 / %x23-5B / %x5D-7E (no quote, no backslash)."""
    return "".join(c if " " <= c <= "~" and c not in '"\\' else "?" for c in text)


class BearerAuth:
    """ASGI middleware in place of the SDK's AuthenticationMiddleware (see the module docstring): it sets
    `scope["user"]`/`scope["auth"]` as that one does (the SDK's AuthenticatedUser, so sessions, the auth context
    and the limits read them unchanged) and answers unauthenticated requests to `path` itself, saying why."""

    def __init__(self, app: ASGIApp, *, verifier: BearerVerifier, path: str, resource: str | None) -> None:
        self.app = app
        self.verifier = verifier
        self.path = path
        self.metadata = metadata_url(resource)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        header = Headers(scope=scope).get("authorization")
        scheme, _, token = (header or "").strip().partition(" ")
        token = token.strip()
        refusal: tuple[int, str | None, str]
        if scheme.lower() != "bearer":
            refusal = (401, None, "this endpoint needs a bearer token: Authorization: Bearer <token>")
        elif not token:
            refusal = (400, "invalid_request", "no token after Bearer in the Authorization header")
        else:
            try:
                access = await self.verifier.verify(token)
            except TokenRefused as e:
                refusal = (401, "invalid_token", f"bearer token refused: {e}")
            else:
                scope["auth"], scope["user"] = AuthCredentials(access.scopes), AuthenticatedUser(access)
                return await self.app(scope, receive, send)
        scope["auth"], scope["user"] = AuthCredentials(), UnauthenticatedUser()
        if scope["type"] != "http" or scope["path"] != self.path:
            return await self.app(scope, receive, send)     # routes without auth (metadata, probes, metrics)
        body = await _read_body(receive, CHALLENGE_BODY_BYTES) if scope["method"] == "POST" else b""
        status, error, description = refusal
        await Challenge(status, error, description, challenge_scopes(body), self.metadata).send(send)


def install_bearer_auth(middleware: list[Middleware], *, path: str, resource: str | None) -> None:
    """Put BearerAuth in place of the SDK's AuthenticationMiddleware in an app's `user_middleware`, with the
    verifier the SDK was given (build_server's BearerVerifier). Pinned by tests/test_oauth.py: an SDK that
    builds its authentication otherwise fails here, at startup, not at a request."""
    for i, m in enumerate(middleware):
        if m.cls is cast(Any, AuthenticationMiddleware):
            verifier = getattr(m.kwargs.get("backend"), "token_verifier", None)
            if not isinstance(verifier, BearerVerifier):
                raise RuntimeError(f"the SDK's bearer backend holds {type(verifier).__name__}, not a BearerVerifier")
            middleware[i] = Middleware(BearerAuth, verifier=verifier, path=path, resource=resource)
            return
    raise RuntimeError("the SDK's app has no AuthenticationMiddleware to replace")


async def _read_body(receive: Receive, limit: int) -> bytes:
    """At most `limit` bytes of a request's body (b"" past it: the challenge then names keel:read only)."""
    body = b""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b""
        body += bytes(message.get("body", b""))
        if len(body) > limit:
            return b""
        if not message.get("more_body"):
            return body


class ScopeCheck:
    """ASGI middleware on `path`, after the authentication: an OAuth caller needs one of Keel's scopes for any
    request, keel:read to call a reading tool and keel:write to call annotate; else 403 insufficient_scope
    (RFC 6750 §3.1) naming the scopes the call lacks. Callers holding both scopes (static tokens) pass without
    their body being read."""

    def __init__(self, app: ASGIApp, *, path: str, resource: str | None) -> None:
        self.app = app
        self.path = path
        self.metadata = metadata_url(resource)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        user = scope.get("user")
        if scope["type"] != "http" or scope["path"] != self.path or not isinstance(user, AuthenticatedUser):
            return await self.app(scope, receive, send)
        held = set(user.scopes)
        if held >= set(SCOPES):
            return await self.app(scope, receive, send)
        messages: list[Message] = []
        body = b""
        if scope["method"] == "POST":
            while True:
                message = await receive()
                messages.append(message)
                if message["type"] != "http.request":
                    break
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
        needed = needed_scopes(body)
        if needed is None:                  # not a tool call: any of Keel's scopes will do
            missing = set() if held & set(SCOPES) else {READ_SCOPE}
        else:
            missing = needed - held
        if missing:
            scopes = _ordered(missing)
            return await Challenge(403, "insufficient_scope", f"this call needs the scope {' '.join(scopes)}",
                                   scopes, self.metadata).send(send)

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()
        await self.app(scope, replay, send)
