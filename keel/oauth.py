"""OAuth 2.1 resource server: JWT access tokens verified against the issuers' JWKS (keel serve over HTTP, keel webhook).

The MCP specification (2025-06-18) makes an MCP server an OAuth 2.1 resource server: it accepts only access
tokens an authorization server it trusts issued for it (the `aud` claim names the server's resource URL,
RFC 8707), publishes Protected Resource Metadata (RFC 9728; the SDK's route, see tools_server.auth) and answers
401 with an RFC 6750 challenge (`WWW-Authenticate: Bearer error="invalid_token", error_description="…", scope="…",
resource_metadata="…"`; tools_server.auth). The SDK leaves verifying a JWT to the server; this module does it with
PyJWT:

- each issuer's `jwks_uri` comes from its metadata (`<issuer>/.well-known/openid-configuration`, else RFC 8414's
  `/.well-known/oauth-authorization-server<path>`), whose `issuer` must be the configured one;
- the signing keys are fetched with PyJWT's PyJWKClient and kept by `kid`. A token with a `kid` not seen yet makes
  one new fetch (the issuer rotated its keys, no restart needed); a `kid` still unknown after it is refused with
  no further fetch for `refetch_after` seconds, and fetches are capped per minute, so a stream of made-up `kid`s
  cannot make Keel hammer the issuer;
- only allow-listed asymmetric algorithms are accepted (never `none`, never HMAC: a public key is no secret);
- `exp` (required), `nbf`, `iss` and `aud` are checked with `leeway` seconds for clock skew.

The caller's identity comes from claims with configurable names (ClaimNames): the tenant (required), the agent
(the first present of `azp`, `client_id`, `sub` by default) and the task (optional); the scopes from `scope`
(a space-separated string, or a list). A refused token is logged by reason only (never a claim value); the same
reason (TokenRefused's message) is the `error_description` the caller gets.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import anyio
import jwt
from jwt import PyJWK, PyJWKClient

from .errors import UsageError
from .tokens import Identity

ISSUER_ENV = "KEEL_OAUTH_ISSUER"          # one issuer URL, or several separated by spaces or commas
RESOURCE_ENV = "KEEL_OAUTH_RESOURCE"
READ_SCOPE = "keel:read"
WRITE_SCOPE = "keel:write"
SCOPES = (READ_SCOPE, WRITE_SCOPE)
ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
FETCH_TIMEOUT_S = 10.0
MISSING_KIDS_KEPT = 1000          # kids remembered as not found (then forgotten all at once)

log = logging.getLogger("keel.serve.oauth")


class TokenRefused(Exception):
    """Why a bearer token was refused (a reason without claim values, safe to log)."""


@dataclass(frozen=True)
class ClaimNames:
    """Which claims carry the caller's identity and scopes."""
    tenant: str = "tenant"
    agent: tuple[str, ...] = ("azp", "client_id", "sub")
    task: str = "task"
    scope: str = "scope"


@dataclass(frozen=True)
class OAuthSettings:
    """A resource server's trust: the issuers, its own resource URL (the audience it requires), and the rules.

    tenants: when not None, only tokens whose tenant claim is one of these are accepted (`keel serve --tenant`).
    """
    issuers: tuple[str, ...]
    resource: str
    algorithms: tuple[str, ...] = ALGORITHMS
    leeway: float = 30.0
    claims: ClaimNames = field(default_factory=ClaimNames)
    refetch_after: float = 300.0
    tenants: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if not self.issuers:
            raise UsageError("OAuth needs at least one issuer (--issuer URL or KEEL_OAUTH_ISSUER)")
        for url in (*self.issuers, self.resource):
            parsed = urllib.parse.urlsplit(url)
            if parsed.scheme not in ("http", "https") or not parsed.netloc or parsed.query or parsed.fragment:
                raise UsageError(f"bad URL {url!r}: an absolute http(s) URL without query or fragment")
        bad = [a for a in self.algorithms if a not in ALGORITHMS]
        if bad or not self.algorithms:
            raise UsageError(f"bad algorithm(s) {', '.join(bad) or '(none)'}: use some of {', '.join(ALGORITHMS)}")


def oauth_settings(issuers: list[str] | None, resource: str | None, *, host: str, port: int,
                   env: Mapping[str, str] | None = None, path: str = "/mcp", **rules: Any) -> OAuthSettings | None:
    """Settings from the flags, then KEEL_OAUTH_ISSUER / KEEL_OAUTH_RESOURCE; None when no issuer is given.
    Without a resource URL the server's own http://HOST:PORT<path> is the audience required (`/mcp` for keel
    serve, `/events` for keel webhook). Issuers are compared
    as exact strings (RFC 8414), so give them as the issuer spells them in its metadata."""
    env = os.environ if env is None else env
    given = [i for i in (issuers or []) if i.strip()]
    if not given:
        given = [i for i in env.get(ISSUER_ENV, "").replace(",", " ").split() if i]
    resource = resource or env.get(RESOURCE_ENV, "").strip() or None
    if not given:
        if resource:
            raise UsageError("--resource is for OAuth: give --issuer URL (or KEEL_OAUTH_ISSUER) too")
        return None
    if resource is None:
        shown = f"[{host}]" if ":" in host else host
        resource = f"http://{shown}:{port}{path}"
    return OAuthSettings(issuers=tuple(given), resource=resource, **rules)


@dataclass(frozen=True)
class VerifiedToken:
    """What a verified JWT says about its caller."""
    identity: Identity
    scopes: tuple[str, ...]
    issuer: str
    subject: str | None
    client: str
    expires_at: int | None
    key: str            # a stable digest of (issuer, tenant, agent, task): per-caller limits key on it


class IssuerKeys:
    """One issuer's signing keys by kid, fetched from its JWKS with PyJWKClient (see the module docstring)."""

    def __init__(self, issuer: str, *, refetch_after: float, fetches_per_minute: int = 10,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.issuer = issuer
        self.refetch_after = refetch_after
        self.fetches_per_minute = fetches_per_minute
        self.clock = clock
        self.fetches = 0                 # JWKS fetches so far (for operators and tests)
        self._client: PyJWKClient | None = None
        self._keys: dict[str, PyJWK] = {}
        self._missing: dict[str, float] = {}     # kid -> when a fetch last failed to find it
        self._recent: deque[float] = deque()     # when the fetches of the last minute were made
        self._lock = threading.Lock()

    def cached(self, kid: str) -> PyJWK | None:
        return self._keys.get(kid)

    def fetch_for(self, kid: str) -> PyJWK:
        """The key `kid`; a kid not seen yet makes one fetch of the JWKS (blocking: run in a thread). A kid that
        fetch did not find is refused without fetching again for refetch_after seconds, and at most
        fetches_per_minute fetches are made in any minute, whatever the kids presented."""
        with self._lock:
            key = self._keys.get(kid)
            if key is not None:
                return key
            now = self.clock()
            looked = self._missing.get(kid)
            if looked is not None and now - looked < self.refetch_after:
                raise TokenRefused("unknown signing key (kid)")
            while self._recent and now - self._recent[0] >= 60.0:
                self._recent.popleft()
            if len(self._recent) >= self.fetches_per_minute:
                raise TokenRefused("unknown signing key (kid)")
            self._recent.append(now)
            self.fetches += 1
            try:
                client = self._client or PyJWKClient(jwks_uri(self.issuer), cache_jwk_set=False,
                                                     timeout=FETCH_TIMEOUT_S)
                self._client = client
                keys = client.get_signing_keys(refresh=True)
            except (jwt.PyJWKClientError, UsageError) as e:
                log.warning(f"signing keys of issuer {self.issuer} not fetched: {e}")
                raise TokenRefused("issuer's signing keys unavailable") from None
            self._keys = {k.key_id: k for k in keys if k.key_id}
            log.info(f"signing keys of issuer {self.issuer} fetched: {len(self._keys)} key(s)")
            key = self._keys.get(kid)
            if key is None:
                if len(self._missing) >= MISSING_KIDS_KEPT:
                    self._missing.clear()
                self._missing[kid] = now
                raise TokenRefused("unknown signing key (kid)")
            return key


def jwks_uri(issuer: str) -> str:
    """The issuer's `jwks_uri` from its metadata (OpenID discovery, else RFC 8414); its `issuer` must match."""
    parts = urllib.parse.urlsplit(issuer)
    path = parts.path.rstrip("/")
    candidates = [issuer.rstrip("/") + "/.well-known/openid-configuration",
                  f"{parts.scheme}://{parts.netloc}/.well-known/oauth-authorization-server{path}"]
    reasons = []
    for url in candidates:
        try:
            with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as r:
                meta = json.loads(r.read(1 << 20))
        except (OSError, ValueError) as e:
            reasons.append(f"{url}: {getattr(e, 'reason', None) or e}")
            continue
        if not isinstance(meta, dict) or meta.get("issuer") != issuer or not isinstance(meta.get("jwks_uri"), str):
            reasons.append(f"{url}: not metadata of issuer {issuer} with a jwks_uri")
            continue
        return str(meta["jwks_uri"])
    raise UsageError("; ".join(reasons))


class JwtVerifier:
    """Verifies JWT access tokens for one resource server (OAuthSettings). `verify` is async; key fetches run in
    a worker thread so the event loop never waits on the issuer."""

    def __init__(self, settings: OAuthSettings) -> None:
        self.settings = settings
        self.issuers = {i: IssuerKeys(i, refetch_after=settings.refetch_after) for i in settings.issuers}
        r = settings.resource
        self._audiences = sorted({r, r.rstrip("/"), r.rstrip("/") + "/"})

    async def verify(self, token: str) -> VerifiedToken:
        """The verified token, or TokenRefused saying why."""
        try:
            header = jwt.get_unverified_header(token)
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.InvalidTokenError:
            raise TokenRefused("not a JWT") from None
        alg, kid, iss = header.get("alg"), header.get("kid"), unverified.get("iss")
        if alg not in self.settings.algorithms:
            raise TokenRefused("algorithm not allowed")
        keys = self.issuers.get(iss) if isinstance(iss, str) else None
        if keys is None:
            raise TokenRefused("issuer not trusted")
        if not isinstance(kid, str) or not kid:
            raise TokenRefused("no signing key id (kid)")
        key = keys.cached(kid)
        if key is None:
            key = await anyio.to_thread.run_sync(keys.fetch_for, kid)
        return self.check(token, key, keys.issuer)

    def check(self, token: str, key: PyJWK, issuer: str) -> VerifiedToken:
        s = self.settings
        try:
            claims = jwt.decode(token, key.key, algorithms=list(s.algorithms), audience=self._audiences,
                                issuer=issuer, leeway=s.leeway,
                                options={"require": ["exp", "iss", "aud"]})
        except jwt.ExpiredSignatureError:
            raise TokenRefused("expired") from None
        except jwt.ImmatureSignatureError:
            raise TokenRefused("not valid yet (nbf/iat)") from None
        except jwt.InvalidAudienceError:
            raise TokenRefused("issued for another resource (aud)") from None
        except jwt.InvalidIssuerError:
            raise TokenRefused("wrong issuer") from None
        except jwt.MissingRequiredClaimError as e:
            raise TokenRefused(f"claim {e.claim!r} missing") from None
        except jwt.InvalidSignatureError:
            raise TokenRefused("bad signature") from None
        except jwt.InvalidTokenError as e:
            raise TokenRefused(f"invalid token ({type(e).__name__})") from None
        return self.identify(claims, issuer)

    def identify(self, claims: Mapping[str, Any], issuer: str) -> VerifiedToken:
        names = self.settings.claims
        tenant = claims.get(names.tenant)
        if not isinstance(tenant, str) or not tenant:
            raise TokenRefused(f"no tenant claim {names.tenant!r}")
        if self.settings.tenants is not None and tenant not in self.settings.tenants:
            raise TokenRefused("tenant not served here")
        agent = next((claims[n] for n in names.agent if isinstance(claims.get(n), str) and claims[n]), None)
        task = claims.get(names.task)
        try:
            identity = Identity(tenant, agent, task if isinstance(task, str) and task else None)
        except UsageError:
            raise TokenRefused("bad tenant, agent or task claim") from None
        raw = claims.get(names.scope)
        scopes = tuple(raw.split()) if isinstance(raw, str) else tuple(s for s in raw or () if isinstance(s, str))
        exp = claims.get("exp")
        sub = claims.get("sub")
        key = hashlib.sha256(json.dumps([issuer, identity.tenant, identity.agent, identity.task]).encode()).hexdigest()
        return VerifiedToken(identity=identity, scopes=scopes, issuer=issuer,
                             subject=sub if isinstance(sub, str) else None, client=agent or f"keel-{key[:16]}",
                             expires_at=int(exp) if isinstance(exp, int | float) else None, key=key)
