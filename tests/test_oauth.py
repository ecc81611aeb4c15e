"""OAuth 2.1 resource server (keel.oauth, tools_server.auth): JWTs minted here with a throwaway RSA key,
verified against a JWKS served on loopback by a tiny issuer; then `keel serve --transport http --issuer` driven
with them (RFC 6750 challenges: 401 without an error code when no token was sent, invalid_token saying why, scope=
on every challenge, 403 insufficient_scope; RFC 9728 metadata; static tokens beside OAuth)."""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import shutil
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import httpx2
import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm
from support.mcp_sessions import (
    FINANCE,
    MCP_HEADERS,
    TENANT_A,
    TENANT_B,
    TENANT_B_EVENTS,
    fact,
    http_server,
    http_session,
    make_token,
    ok,
    raw_initialize,
    refused,
)

from keel.errors import UsageError
from keel.oauth import ClaimNames, JwtVerifier, OAuthSettings, TokenRefused, oauth_settings
from keel.tokens import Identity
from tools_server.auth import BearerVerifier, needed_scopes

RESOURCE = "http://127.0.0.1:1/mcp"


class Issuer:
    """A minimal authorization server on loopback: OpenID metadata and a JWKS, with keys it can rotate."""

    def __init__(self) -> None:
        self.keys: dict[str, Any] = {}          # kid -> private key, published in the JWKS
        self.jwks_fetches = 0
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/.well-known/openid-configuration":
                    body = {"issuer": issuer.url, "jwks_uri": issuer.url + "/jwks"}
                elif self.path == "/jwks":
                    issuer.jwks_fetches += 1
                    body = issuer.jwks()
                else:
                    self.send_error(404)
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.add_key("k1")

    def add_key(self, kid: str) -> None:
        self.keys[kid] = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def jwks(self) -> dict[str, Any]:
        out = []
        for kid, key in self.keys.items():
            jwk = json.loads(RSAAlgorithm.to_jwk(key.public_key()))
            out.append({**jwk, "kid": kid, "use": "sig", "alg": "RS256"})
        return {"keys": out}

    def token(self, *, kid: str = "k1", key: Any = None, alg: str = "RS256", aud: Any = RESOURCE,
              iss: str | None = None, ttl: float = 300, nbf: float | None = None, drop: tuple[str, ...] = (),
              **claims: Any) -> str:
        now = time.time()
        body = {"iss": iss or self.url, "aud": aud, "exp": int(now + ttl), "iat": int(now), "azp": "agent-7",
                "sub": "svc-1", "tenant": TENANT_A, "scope": "keel:read keel:write", **claims}
        if nbf is not None:
            body["nbf"] = int(now + nbf)
        for name in drop:
            body.pop(name, None)
        return jwt.encode(body, key if key is not None else self.keys[kid], algorithm=alg, headers={"kid": kid})

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def issuer() -> Iterator[Issuer]:
    i = Issuer()
    yield i
    i.close()


def settings(issuer: Issuer, **rules: Any) -> OAuthSettings:
    return OAuthSettings(issuers=(issuer.url,), resource=RESOURCE, refetch_after=3600, **rules)


def verify(verifier: JwtVerifier, token: str) -> Any:
    return anyio.run(verifier.verify, token)


def refusal(verifier: JwtVerifier, token: str) -> str:
    with pytest.raises(TokenRefused) as caught:
        verify(verifier, token)
    return str(caught.value)


def test_a_good_token_gives_tenant_agent_task_and_scopes(issuer: Issuer) -> None:
    v = JwtVerifier(settings(issuer))
    got = verify(v, issuer.token(task="q3"))
    assert got.identity == Identity(TENANT_A, "agent-7", "q3")
    assert got.scopes == ("keel:read", "keel:write") and got.issuer == issuer.url and got.subject == "svc-1"
    # the agent falls back to client_id, then sub; the task is optional
    assert verify(v, issuer.token(drop=("azp",), client_id="cli")).identity == Identity(TENANT_A, "cli")
    assert verify(v, issuer.token(drop=("azp",))).identity == Identity(TENANT_A, "svc-1")
    # a scope claim given as a list; the audience given as a list that names this server
    assert verify(v, issuer.token(scope=["keel:read"], aud=["other", RESOURCE])).scopes == ("keel:read",)
    assert issuer.jwks_fetches == 1         # the keys are fetched once and kept


def test_exp_nbf_iss_aud_are_checked(issuer: Issuer) -> None:
    v = JwtVerifier(settings(issuer, leeway=5))
    assert refusal(v, issuer.token(ttl=-60)) == "expired"
    assert verify(v, issuer.token(ttl=-2)).identity.tenant == TENANT_A       # within the leeway
    assert refusal(v, issuer.token(nbf=120)) == "not valid yet (nbf/iat)"
    assert refusal(v, issuer.token(aud="http://elsewhere/mcp")) == "issued for another resource (aud)"
    assert refusal(v, issuer.token(iss="http://127.0.0.1:9/other")) == "issuer not trusted"
    assert refusal(v, issuer.token(drop=("exp",))) == "claim 'exp' missing"
    assert refusal(v, issuer.token(drop=("aud",))) == "claim 'aud' missing"
    assert refusal(v, issuer.token(drop=("tenant",))) == "no tenant claim 'tenant'"
    assert refusal(v, issuer.token(tenant="Bad Tenant!")) == "bad tenant, agent or task claim"
    assert refusal(v, "not.a.jwt") == "not a JWT"
    assert refusal(v, "opaque-token") == "not a JWT"


def test_only_allow_listed_algorithms(issuer: Issuer) -> None:
    v = JwtVerifier(settings(issuer, algorithms=("RS256",)))
    assert refusal(v, issuer.token(alg="PS256")) == "algorithm not allowed"
    # HMAC with the public key as the secret (the classic confusion attack), and alg none
    public = json.dumps(issuer.jwks()["keys"][0]).encode()
    assert refusal(v, hmac_token(issuer, public)) == "algorithm not allowed"
    assert refusal(JwtVerifier(settings(issuer)), hmac_token(issuer, public)) == "algorithm not allowed"
    unsigned = jwt.encode({"iss": issuer.url, "aud": RESOURCE, "exp": int(time.time()) + 60, "tenant": TENANT_A},
                          None, algorithm="none", headers={"kid": "k1"})
    assert refusal(v, unsigned) == "algorithm not allowed"
    # a token signed with another key under a published kid
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert refusal(v, issuer.token(key=other)) == "bad signature"
    with pytest.raises(UsageError, match="bad algorithm"):       # HMAC cannot even be allowed
        OAuthSettings(issuers=(issuer.url,), resource=RESOURCE, algorithms=("HS256",))


def hmac_token(issuer: Issuer, secret: bytes) -> str:
    """An HS256 token made by hand (PyJWT refuses to sign with a public key as the secret)."""
    def part(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()
    head = part(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "k1"}).encode())
    body = part(json.dumps({"iss": issuer.url, "aud": RESOURCE, "exp": int(time.time()) + 60,
                            "tenant": TENANT_A}).encode())
    mac = hmac.new(secret, f"{head}.{body}".encode(), hashlib.sha256).digest()
    return f"{head}.{body}.{part(mac)}"


def test_a_new_kid_is_fetched_once_and_an_unknown_kid_refused(issuer: Issuer) -> None:
    v = JwtVerifier(settings(issuer))
    verify(v, issuer.token())
    assert issuer.jwks_fetches == 1
    issuer.add_key("k2")                                        # the issuer rotates: a new kid
    assert verify(v, issuer.token(kid="k2")).identity.tenant == TENANT_A
    assert issuer.jwks_fetches == 2                             # fetched once for it
    verify(v, issuer.token(kid="k2"))
    verify(v, issuer.token(kid="k1"))
    assert issuer.jwks_fetches == 2                             # then kept
    stray = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert refusal(v, issuer.token(kid="k9", key=stray)) == "unknown signing key (kid)"
    assert issuer.jwks_fetches == 3                             # one look for the unknown kid
    for _ in range(5):                                          # then refused without fetching again
        assert refusal(v, issuer.token(kid="k9", key=stray)) == "unknown signing key (kid)"
    assert issuer.jwks_fetches == 3
    del issuer.keys["k1"]                                       # rotated away: a fresh server never accepts it
    fresh = JwtVerifier(settings(issuer))
    assert refusal(fresh, issuer.token(kid="k1", key=stray)) == "unknown signing key (kid)"
    assert verify(fresh, issuer.token(kid="k2")).identity.tenant == TENANT_A


def test_unknown_kids_are_looked_for_again_later_and_fetches_capped(issuer: Issuer) -> None:
    clock = [0.0]
    v = JwtVerifier(settings(issuer))
    keys = v.issuers[issuer.url]
    keys.clock = lambda: clock[0]
    keys.refetch_after, keys.fetches_per_minute = 300, 3
    verify(v, issuer.token())
    stray = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert refusal(v, issuer.token(kid="k5", key=stray)) == "unknown signing key (kid)"
    assert issuer.jwks_fetches == 2
    issuer.add_key("k5")                                        # published later
    assert refusal(v, issuer.token(kid="k5")) == "unknown signing key (kid)"    # not looked for again yet
    clock[0] += 301
    assert verify(v, issuer.token(kid="k5")).identity.tenant == TENANT_A
    assert issuer.jwks_fetches == 3
    for n in range(10):                                         # a flood of made-up kids: 3 fetches a minute
        refusal(v, issuer.token(kid=f"made-up-{n}", key=stray))
    assert issuer.jwks_fetches == 3 + 2                         # the minute already had one fetch (k5)
    clock[0] += 61
    refusal(v, issuer.token(kid="made-up-x", key=stray))
    assert issuer.jwks_fetches == 6


def test_claim_names_are_configurable_and_tenants_filtered(issuer: Issuer) -> None:
    names = ClaimNames(tenant="org", agent=("agent_id",), task="job", scope="scp")
    v = JwtVerifier(settings(issuer, claims=names, tenants=frozenset({TENANT_A})))
    got = verify(v, issuer.token(org=TENANT_A, agent_id="a-9", job="j1", scp=["keel:read"], drop=("tenant",)))
    assert got.identity == Identity(TENANT_A, "a-9", "j1") and got.scopes == ("keel:read",)
    assert refusal(v, issuer.token(org=TENANT_B, drop=("tenant",))) == "tenant not served here"
    assert refusal(v, issuer.token()) == "no tenant claim 'org'"


def test_an_unreachable_issuer_refuses_tokens_without_crashing() -> None:
    v = JwtVerifier(OAuthSettings(issuers=("http://127.0.0.1:9",), resource=RESOURCE))
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    token = jwt.encode({"iss": "http://127.0.0.1:9", "aud": RESOURCE, "exp": int(time.time()) + 60,
                        "tenant": TENANT_A}, key, algorithm="RS256", headers={"kid": "k"})
    assert refusal(v, token) == "issuer's signing keys unavailable"


def test_settings_from_flags_and_environment() -> None:
    assert oauth_settings([], None, host="127.0.0.1", port=8765, env={}) is None
    s = oauth_settings([], None, host="::1", port=9000, env={"KEEL_OAUTH_ISSUER": "https://a/x, https://b"})
    assert s is not None and s.issuers == ("https://a/x", "https://b") and s.resource == "http://[::1]:9000/mcp"
    s = oauth_settings(["https://idp"], "https://keel.example/mcp", host="h", port=1, env={})
    assert s is not None and s.resource == "https://keel.example/mcp"
    with pytest.raises(UsageError, match="--resource is for OAuth"):
        oauth_settings([], "https://keel.example/mcp", host="h", port=1, env={})
    with pytest.raises(UsageError, match="bad URL"):
        oauth_settings(["idp.example"], None, host="h", port=1, env={})


def test_scopes_needed_by_a_body() -> None:
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "annotate", "arguments": {}}}
    assert needed_scopes(json.dumps(call).encode()) == {"keel:write"}
    call["params"]["name"] = "context"
    assert needed_scopes(json.dumps(call).encode()) == {"keel:read"}
    assert needed_scopes(b'{"jsonrpc":"2.0","id":1,"method":"tools/list"}') is None
    assert needed_scopes(b"not json") is None


def test_challenge_headers() -> None:
    """RFC 6750 §3: no error code and no description without credentials; a description keeps to the characters
    a quoted value may hold; scope= always."""
    from tools_server.auth import Challenge, challenge_scopes
    assert Challenge(401, None, "needs a token", ["keel:read"]).header() == 'Bearer scope="keel:read"'
    odd = Challenge(401, "invalid_token", 'no tenant claim \'a"b\\c\' — ñ', ["keel:read"], "http://x/.well-known/p")
    assert odd.header() == ('Bearer error="invalid_token", error_description="no tenant claim \'a?b?c\' ? ?", '
                            'scope="keel:read", resource_metadata="http://x/.well-known/p"')
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "annotate", "arguments": {}}}
    assert challenge_scopes(json.dumps(call).encode()) == ["keel:read", "keel:write"]
    assert challenge_scopes(b"") == challenge_scopes(b"not json") == ["keel:read"]


def test_keel_auth_replaces_the_sdk_authentication() -> None:
    """install_bearer_auth takes the SDK's AuthenticationMiddleware out, keeping its verifier; an SDK that builds
    its authentication another way stops the server at startup, not at a request."""
    from mcp.server.auth.middleware.bearer_auth import BearerAuthBackend
    from starlette.middleware import Middleware
    from starlette.middleware.authentication import AuthenticationMiddleware

    from tools_server.auth import BearerAuth, install_bearer_auth
    verifier = BearerVerifier(oauth=OAuthSettings(issuers=("http://127.0.0.1:9",), resource=RESOURCE))
    stack = [Middleware(AuthenticationMiddleware, backend=BearerAuthBackend(verifier)), Middleware(dict)]
    install_bearer_auth(stack, path="/mcp", resource=RESOURCE)
    assert [m.cls for m in stack] == [BearerAuth, dict] and stack[0].kwargs["verifier"] is verifier
    with pytest.raises(RuntimeError, match="no AuthenticationMiddleware"):
        install_bearer_auth(stack, path="/mcp", resource=RESOURCE)
    other = [Middleware(AuthenticationMiddleware, backend=BearerAuthBackend(object()))]  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="not a BearerVerifier"):
        install_bearer_auth(other, path="/mcp", resource=None)


def test_static_tokens_and_oauth_in_one_verifier(issuer: Issuer, tmp_path: Path) -> None:
    from keel.tokens import TokenTable
    tokens = tmp_path / "tokens.jsonl"
    static = make_token(tokens, TENANT_B, "b1")
    verifier = BearerVerifier(TokenTable.load(tokens), settings(issuer))
    a = anyio.run(verifier.verify_token, static)
    assert a is not None and a.claims == {"keel_tenant": TENANT_B, "keel_agent": "b1", "keel_task": None}
    assert a.scopes == ["keel:read", "keel:write"]
    o = anyio.run(verifier.verify_token, issuer.token())
    assert o is not None and o.claims["keel_tenant"] == TENANT_A and o.resource == RESOURCE
    assert o.token != issuer.token() and len(o.token) == 64      # limits key on a digest, never the token
    assert anyio.run(verifier.verify_token, issuer.token(ttl=-600)) is None
    assert anyio.run(verifier.verify_token, "nope") is None


# ---- `keel serve --transport http --issuer`, end to end ------------------------------------------------

@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Issuer, str]]:
    tmp = tmp_path_factory.mktemp("oauth")
    events = tmp / "events.jsonl"
    shutil.copyfile(FINANCE / "events.jsonl", events)
    with events.open("a", encoding="utf-8") as f:
        f.writelines(json.dumps(e) + "\n" for e in TENANT_B_EVENTS)
    tokens = tmp / "tokens.jsonl"
    static = make_token(tokens, TENANT_B, "b1")
    issuer = Issuer()
    try:
        with http_server(tmp, str(FINANCE), "--events", str(events), "--tokens", str(tokens),
                         "--issuer", issuer.url) as server:
            yield server, issuer, static
    finally:
        issuer.close()


def _resource(server: Any) -> str:
    return f"{server.base}/mcp"


def challenge(r: httpx2.Response) -> dict[str, str]:
    """The parameters of a `WWW-Authenticate: Bearer k="v", …` challenge, checked as both SDKs' clients read it
    (the MCP Python SDK's parser gives the same values; a quoted value holds no quote or backslash)."""
    from mcp.client.auth.utils import extract_field_from_www_auth
    header = r.headers["www-authenticate"]
    assert header.startswith("Bearer ") and "\\" not in header
    params = dict(re.findall(r'(\w+)="([^"]*)"', header))
    assert header == "Bearer " + ", ".join(f'{k}="{v}"' for k, v in params.items())
    for name, value in params.items():
        assert extract_field_from_www_auth(r, name) == value
    return params


def test_served_401_names_the_metadata_and_metadata_names_the_issuer(served: tuple[Any, Issuer, str]) -> None:
    server, issuer, _ = served
    r = raw_initialize(server.url)
    assert r.status_code == 401
    meta_url = f"{server.base}/.well-known/oauth-protected-resource/mcp"
    # no credentials: no error code (RFC 6750 §3.1), the scope to ask for, the metadata
    assert challenge(r) == {"scope": "keel:read", "resource_metadata": meta_url}
    assert set(r.json()) == {"error_description"} and "bearer token" in r.json()["error_description"]
    meta = httpx2.get(meta_url, timeout=10).json()
    assert meta["resource"] == _resource(server) and meta["authorization_servers"] == [issuer.url]
    assert meta["scopes_supported"] == ["keel:read", "keel:write"]
    assert server.alive()


def test_served_challenges_say_why_a_token_was_refused(served: tuple[Any, Issuer, str]) -> None:
    """invalid_token with a description that names the reason (never a claim value), scope= on each one."""
    server, issuer, _ = served
    aud = _resource(server)
    stray = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cases = {
        "expired": issuer.token(aud=aud, ttl=-600),
        "issued for another resource (aud)": issuer.token(aud="http://127.0.0.1:1/mcp"),
        "issuer not trusted": issuer.token(aud=aud, iss="http://127.0.0.1:9"),
        "bad signature": issuer.token(aud=aud, key=stray),
        "unknown signing key (kid)": issuer.token(aud=aud, kid="k-stray", key=stray),
        "algorithm not allowed": issuer.token(aud=aud, alg="HS256", key="a-shared-secret-of-32-bytes-or-more"),
        "no tenant claim 'tenant'": issuer.token(aud=aud, drop=("tenant",)),
        "bad tenant, agent or task claim": issuer.token(aud=aud, tenant="Not A Tenant!"),
        "neither a token of this server's tokens file nor a JWT": "not-a-token",
    }
    for reason, bad in cases.items():
        r = raw_initialize(server.url, authorization=f"Bearer {bad}")
        assert r.status_code == 401, (reason, r.status_code)
        assert challenge(r) == {"error": "invalid_token", "error_description": f"bearer token refused: {reason}",
                                "scope": "keel:read",
                                "resource_metadata": f"{server.base}/.well-known/oauth-protected-resource/mcp"}
        assert r.json() == {"error": "invalid_token", "error_description": f"bearer token refused: {reason}"}
        assert "Not A Tenant" not in r.text and "agent-7" not in r.text and "svc-1" not in r.text
    # Within --oauth-leeway (30 s) a token just expired is still good, as keel.oauth says (the SDK's own check of
    # `expires_at` used to refuse it without leeway)
    assert raw_initialize(server.url, authorization=f"Bearer {issuer.token(aud=aud, ttl=-5)}").status_code == 200
    assert server.alive()


def test_served_challenges_without_a_usable_token(served: tuple[Any, Issuer, str]) -> None:
    """Another scheme is no credentials (no error code); `Bearer` alone is 400 invalid_request; a 401 on a call
    to annotate names keel:write too, so a writer whose token expired gets a token that can write."""
    server, issuer, _ = served
    meta = f"{server.base}/.well-known/oauth-protected-resource/mcp"
    for header in ("Basic dXNlcjpwYXNz", issuer.token(aud=_resource(server))):     # a JWT without "Bearer "
        r = raw_initialize(server.url, authorization=header)
        assert r.status_code == 401 and challenge(r) == {"scope": "keel:read", "resource_metadata": meta}
    r = raw_initialize(server.url, authorization="Bearer")
    assert r.status_code == 400 and challenge(r) == {
        "error": "invalid_request", "error_description": "no token after Bearer in the Authorization header",
        "scope": "keel:read", "resource_metadata": meta}

    def post(body: Any, **headers: str) -> httpx2.Response:
        return httpx2.post(server.url, json=body, timeout=10, headers={**MCP_HEADERS, **headers})
    annotate = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "annotate", "arguments": {}}}
    context = {"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "context", "arguments": {}}}
    assert challenge(post(annotate))["scope"] == "keel:read keel:write"
    assert challenge(post([context, annotate]))["scope"] == "keel:read keel:write"
    assert challenge(post(context))["scope"] == "keel:read"
    expired = issuer.token(aud=_resource(server), ttl=-600)
    r = post(annotate, authorization=f"Bearer {expired}")
    assert r.status_code == 401 and challenge(r)["scope"] == "keel:read keel:write"
    assert challenge(r)["error_description"] == "bearer token refused: expired"
    # a body too big to look into is answered without reading it all: keel:read
    big = {**annotate, "params": {"name": "annotate", "arguments": {"value": "x" * 100_000}}}
    assert challenge(post(big))["scope"] == "keel:read"
    # routes without auth are not challenged
    assert httpx2.get(meta, timeout=10, headers={"authorization": "Bearer nope"}).status_code == 200
    assert httpx2.get(f"{server.base}/healthz", timeout=10, headers={"authorization": "Bearer"}).status_code == 200
    assert server.alive()


def test_served_scopes_and_identity(served: tuple[Any, Issuer, str]) -> None:
    server, issuer, static = served
    aud = _resource(server)
    reader = issuer.token(aud=aud, scope="keel:read", task="t1")
    both = issuer.token(aud=aud)
    neither = issuer.token(aud=aud, scope="openid profile")
    assert raw_initialize(server.url, authorization=f"Bearer {reader}").status_code == 200
    r = raw_initialize(server.url, authorization=f"Bearer {neither}")
    assert r.status_code == 403
    assert challenge(r) == {"error": "insufficient_scope", "error_description": "this call needs the scope keel:read",
                            "scope": "keel:read",
                            "resource_metadata": f"{server.base}/.well-known/oauth-protected-resource/mcp"}

    annotate = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "annotate", "arguments": {
        "entity": "debt:visa", "predicate": "note", "value": "x"}}}
    init = raw_initialize(server.url, authorization=f"Bearer {reader}")
    sid = init.headers["mcp-session-id"]
    r = httpx2.post(server.url, json=annotate, timeout=10, headers={
        **MCP_HEADERS, "authorization": f"Bearer {reader}", "mcp-session-id": sid, "mcp-protocol-version": "2025-06-18"})
    assert r.status_code == 403        # the scope that call lacks (the client adds it to what it holds)
    assert challenge(r)["error"] == "insufficient_scope" and challenge(r)["scope"] == "keel:write"
    assert r.json()["error"] == "insufficient_scope"

    async def as_reader(s: Any) -> None:
        assert fact(await ok(s, "context", {"entity": "debt:visa"}), "balance_cop")["value"] == 3870000
        assert "unknown entity" in await refused(s, "context", {"entity": "debt:mastercard"})    # tenant B's
        assert (await s.list_tools()).tools       # tools/list needs no more than one of Keel's scopes

    async def as_writer(s: Any) -> None:
        got = await ok(s, "annotate", {"entity": "debt:visa", "predicate": "note", "value": "seen", "scope": "agent"})
        assert got

    async def static_b(s: Any) -> None:              # the static token beside OAuth: tenant B, both scopes
        assert fact(await ok(s, "context", {"entity": "debt:visa"}), "balance_cop")["value"] == 111000

    async def go() -> None:
        async with http_session(server.url, reader) as s:
            await as_reader(s)
        async with http_session(server.url, both) as s:
            await as_writer(s)
        async with http_session(server.url, static) as s:
            await static_b(s)
    anyio.run(go)
    assert server.alive()


def test_static_tokens_alone_get_the_same_challenges(tmp_path: Path) -> None:
    """Without OAuth (--tokens only) the challenges are the same, without resource_metadata (no metadata)."""
    tokens = tmp_path / "tokens.jsonl"
    good = make_token(tokens, TENANT_A, "a1")
    with http_server(tmp_path, str(FINANCE), "--events", str(FINANCE / "events.jsonl"), "--tokens", str(tokens)) as server:
        r = raw_initialize(server.url)
        assert r.status_code == 401 and challenge(r) == {"scope": "keel:read"}
        r = raw_initialize(server.url, authorization="Bearer not-a-token")
        assert r.status_code == 401 and challenge(r) == {
            "error": "invalid_token", "error_description": "bearer token refused: unknown token", "scope": "keel:read"}
        assert raw_initialize(server.url, authorization=f"Bearer {good}").status_code == 200
        assert "not-a-token" not in server.stderr()
        assert server.alive()


def test_stateless_fast_path_checks_scopes_too(issuer: Issuer, tmp_path: Path) -> None:
    """--stateless answers tool calls in StatelessToolCalls, before the SDK: the scope check sits in front of it."""
    with http_server(tmp_path, str(FINANCE), "--events", str(FINANCE / "events.jsonl"), "--issuer", issuer.url,
                     "--stateless") as server:
        reader = issuer.token(aud=_resource(server), scope="keel:read")
        headers = {**MCP_HEADERS, "authorization": f"Bearer {reader}", "mcp-protocol-version": "2025-06-18"}

        def call(name: str, arguments: dict[str, Any]) -> httpx2.Response:
            return httpx2.post(server.url, timeout=10, headers=headers, json={
                "jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}})
        r = call("context", {"entity": "debt:visa"})
        assert r.status_code == 200 and not r.json()["result"].get("isError"), r.text
        r = call("annotate", {"entity": "debt:visa", "predicate": "note", "value": "x", "scope": "agent"})
        assert r.status_code == 403 and 'scope="keel:write"' in r.headers["www-authenticate"]
        assert server.alive()


def test_the_webhook_takes_the_same_oauth_tokens(issuer: Issuer) -> None:
    """`keel webhook --issuer`: a bearer token with keel:write for the webhook's resource produces the tenant's
    events (the tenant from the token); a read-only token is 403, another audience 401, another tenant's header
    403, an envelope of another tenant refused; signed requests keep working beside it."""
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer
    from support.outbox import sample_envelopes
    from test_webhook import RecordingSink

    from keel.cartridge import load_cartridge
    from keel.ingress.auth import Secrets, sign
    from keel.ingress.webhook import Limits, WebhookHandler, create_app

    resource = "http://127.0.0.1:1/events"
    verifier = JwtVerifier(OAuthSettings(issuers=(issuer.url,), resource=resource, refetch_after=3600))
    sink, limits = RecordingSink(), Limits(max_body=64 * 1024, max_batch=50)
    secret = "a-signing-secret"
    handler = WebhookHandler([load_cartridge(FINANCE)], lambda: Secrets({TENANT_A: (secret.encode(),)}), sink,
                             limits, oauth=verifier)
    envelopes = sample_envelopes()[:2]
    body = "".join(json.dumps(e) + "\n" for e in envelopes).encode()
    foreign = "".join(json.dumps({**e, "tenant": TENANT_B}) + "\n" for e in envelopes).encode()

    async def go() -> None:
        async with TestClient(TestServer(create_app(handler, limits))) as client:
            async def post(data: bytes, **headers: str) -> tuple[int, dict[str, Any]]:
                response = await client.post("/events/finance", data=data,
                                             headers={"Content-Type": "application/x-ndjson", **headers})
                return response.status, await response.json()
            status, doc = await post(body, Authorization=f"Bearer {issuer.token(aud=resource)}")
            assert status == 202 and doc["tenant"] == TENANT_A and doc["accepted"] == [e["id"] for e in envelopes]
            status, doc = await post(body, Authorization=f"Bearer {issuer.token(aud=resource, scope='keel:read')}")
            assert status == 403 and "keel:write" in doc["error"]
            status, doc = await post(body, Authorization=f"Bearer {issuer.token()}")          # issued for /mcp
            assert status == 401 and "another resource" in doc["error"]
            status, doc = await post(body, **{"Authorization": f"Bearer {issuer.token(aud=resource)}",
                                              "X-Keel-Tenant": TENANT_B})
            assert status == 403
            status, doc = await post(foreign, Authorization=f"Bearer {issuer.token(aud=resource)}")
            assert status == 400 and not doc["accepted"]               # the token's tenant, not the body's
            status, doc = await post(body)
            assert status == 401 and "OAuth bearer token" in doc["error"]
            status, doc = await post(body, **{"X-Keel-Tenant": TENANT_A, "X-Keel-Signature": sign(secret, body)})
            assert status == 202                                         # signatures still work beside it
    asyncio.run(go())
    assert len(sink.records) == 4


def test_webhook_needs_secrets_or_an_issuer(capsys: pytest.CaptureFixture[str]) -> None:
    from keel.cli import main
    assert main(["webhook", str(FINANCE), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "--secrets FILE" in err and "--issuer URL" in err
