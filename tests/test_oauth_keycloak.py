"""`keel serve --transport http --issuer` against a real identity provider: Keycloak (deploy/local/keycloak, from
Maven Central, cached like Kafka's jars) with a realm, a client per agent (client-credentials grant), the tenant
and task as token claims (hardcoded-claim protocol mappers), the audience = Keel's resource URL (audience mapper)
and the client scopes keel:read / keel:write. Tokens Keycloak issues drive the MCP server: right token -> answers;
expired, wrong audience, wrong issuer, another tenant's, a bad signature, missing write scope, signed by a key the
realm rotated away -> refused with the right status and an RFC 6750 challenge saying why; a token signed by the
realm's new key accepted without a restart. Then the MCP SDKs' own client-credentials flows against it: the Python
SDK's ClientCredentialsOAuthProvider (a read-only client connects, a writer steps up on 403) and the TypeScript
SDK's ClientCredentialsProvider (tests/clients/node/oauth_client_credentials.mjs, run with node).

Where Keycloak cannot be fetched or started (no mvn, no network, no Java 21+, too slow) this module skips and says
why; tests/test_oauth.py covers the verifier with locally minted tokens either way. KEEL_KEYCLOAK_URL (with
KEEL_KEYCLOAK_ADMIN / KEEL_KEYCLOAK_ADMIN_PASSWORD) uses a Keycloak already running instead of starting one.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

import anyio
import httpx2
import jwt
import pytest
from support.mcp_sessions import (
    FINANCE,
    MCP_HEADERS,
    ROOT,
    TENANT_A,
    TENANT_B,
    TENANT_B_EVENTS,
    HttpServer,
    fact,
    free_port,
    http_server,
    http_session,
    ok,
    raw_initialize,
    refused,
)

SCRIPT = ROOT / "deploy" / "local" / "keycloak"
RESOURCE = "https://keel.example.test/mcp"      # the audience Keycloak puts in tokens; Keel requires it


class Keycloak:
    """Keycloak's admin REST API, as the master realm's bootstrap admin."""

    def __init__(self, url: str, admin: str, password: str) -> None:
        self.url = url.rstrip("/")
        self.admin, self.password = admin, password
        self.http = httpx2.Client(timeout=60)
        self._admin_token, self._admin_until = "", 0.0

    def _headers(self) -> dict[str, str]:
        """The admin's bearer header, one token while it has 10 s left: each password grant hashes the admin's
        password (PBKDF2, hundreds of thousands of rounds), and the setup makes some thirty admin calls."""
        if time.monotonic() >= self._admin_until:
            r = self.http.post(f"{self.url}/realms/master/protocol/openid-connect/token", data={
                "grant_type": "password", "client_id": "admin-cli", "username": self.admin,
                "password": self.password})
            r.raise_for_status()
            self._admin_token = r.json()["access_token"]
            self._admin_until = time.monotonic() + float(r.json()["expires_in"]) - 10
        return {"authorization": f"Bearer {self._admin_token}"}

    def call(self, method: str, path: str, body: Any = None) -> Any:
        r = self.http.request(method, f"{self.url}/admin/realms{path}", json=body, headers=self._headers())
        assert r.status_code < 300, (method, path, r.status_code, r.text)
        return r.json() if r.content else r.headers.get("location")

    def realm(self, name: str) -> str:
        """A new realm with the client scopes keel:read and keel:write; its issuer URL."""
        self.call("POST", "", {"realm": name, "enabled": True, "accessTokenLifespan": 300})
        for scope in ("keel:read", "keel:write"):
            self.call("POST", f"/{name}/client-scopes", {"name": scope, "protocol": "openid-connect", "attributes": {
                "include.in.token.scope": "true", "display.on.consent.screen": "false"}})
        return f"{self.url}/realms/{name}"

    def client(self, realm: str, client_id: str, *, tenant: str, task: str | None = None,
               audience: str | None = RESOURCE, write: bool | str = True, lifespan: int | None = None) -> str:
        """A confidential client of one agent (client-credentials grant) whose tokens carry `tenant` (and `task`)
        claims and `audience`; keel:read always (a default scope: in every token), keel:write when `write`
        (`"optional"`: only in tokens asked for it, with `scope=keel:write`). Its secret."""
        secret = secrets.token_urlsafe(24)
        mappers = [_claim("tenant", tenant)] + ([_claim("task", task)] if task else [])
        if audience:
            mappers.append({"name": "keel-audience", "protocol": "openid-connect",
                            "protocolMapper": "oidc-audience-mapper",
                            "config": {"included.custom.audience": audience, "access.token.claim": "true",
                                       "id.token.claim": "false", "introspection.token.claim": "true"}})
        attributes = {"access.token.lifespan": str(lifespan)} if lifespan else {}
        self.call("POST", f"/{realm}/clients", {
            "clientId": client_id, "enabled": True, "publicClient": False, "secret": secret,
            "clientAuthenticatorType": "client-secret", "serviceAccountsEnabled": True,
            "standardFlowEnabled": False, "directAccessGrantsEnabled": False, "protocolMappers": mappers,
            "attributes": attributes})
        internal = self.call("GET", f"/{realm}/clients?clientId={client_id}")[0]["id"]
        scopes = {s["name"]: s["id"] for s in self.call("GET", f"/{realm}/client-scopes")}
        self.call("PUT", f"/{realm}/clients/{internal}/default-client-scopes/{scopes['keel:read']}")
        if write:
            kind = "optional" if write == "optional" else "default"
            self.call("PUT", f"/{realm}/clients/{internal}/{kind}-client-scopes/{scopes['keel:write']}")
        return secret

    def token(self, realm: str, client_id: str, secret: str) -> str:
        r = self.http.post(f"{self.url}/realms/{realm}/protocol/openid-connect/token", data={
            "grant_type": "client_credentials", "client_id": client_id, "client_secret": secret})
        assert r.status_code == 200, r.text
        return str(r.json()["access_token"])

    def rotate_keys(self, realm: str) -> None:
        """A new RSA signing key (higher priority), then the old one deleted: tokens it signed are rotated away."""
        realm_id = self.call("GET", f"/{realm}")["id"]
        kind = "org.keycloak.keys.KeyProvider"
        old = [c["id"] for c in self.call("GET", f"/{realm}/components?type={kind}")
               if c["providerId"] == "rsa-generated"]
        self.call("POST", f"/{realm}/components", {
            "name": "rsa-rotated", "providerId": "rsa-generated", "providerType": kind, "parentId": realm_id,
            "config": {"priority": ["200"], "keySize": ["2048"], "active": ["true"], "enabled": ["true"],
                       "algorithm": ["RS256"]}})
        for component in old:
            self.call("DELETE", f"/{realm}/components/{component}")


def _claim(name: str, value: str) -> dict[str, Any]:
    return {"name": f"keel-{name}", "protocol": "openid-connect", "protocolMapper": "oidc-hardcoded-claim-mapper",
            "config": {"claim.name": name, "claim.value": value, "jsonType.label": "String",
                       "access.token.claim": "true", "id.token.claim": "false", "userinfo.token.claim": "false",
                       "introspection.token.claim": "true"}}


@pytest.fixture(scope="module")
def keycloak() -> Iterator[Keycloak]:
    url = os.environ.get("KEEL_KEYCLOAK_URL")
    if url:
        yield Keycloak(url, os.environ.get("KEEL_KEYCLOAK_ADMIN", "admin"),
                       os.environ.get("KEEL_KEYCLOAK_ADMIN_PASSWORD", "admin"))
        return
    port = free_port()
    # The JIT's first tier only: Keycloak starts on about 11 s of CPU instead of 19 (the suite runs on 2 cores),
    # and the few hundred requests of this module do not need the optimizing compiler.
    java = f"-XX:TieredStopAtLevel=1 {os.environ.get('JAVA_OPTS_APPEND', '')}".strip()
    env = {**os.environ, "KEEL_LOCAL_KEYCLOAK_PORT": str(port), "KEEL_LOCAL_KEYCLOAK_MANAGEMENT_PORT": str(free_port()),
           "KEEL_KEYCLOAK_ADMIN_PASSWORD": secrets.token_urlsafe(12), "JAVA_OPTS_APPEND": java}
    try:
        up = subprocess.run([str(SCRIPT), "up"], check=False, env=env, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        subprocess.run([str(SCRIPT), "down"], check=False, env=env, capture_output=True, timeout=120)
        pytest.skip("Keycloak did not start within 10 minutes (deploy/local/keycloak up)")
    if up.returncode != 0:
        said = [line[line.index("[keycloak]"):] for line in up.stderr.splitlines() if "[keycloak]" in line]
        reason = (said or up.stderr.strip().splitlines() or ["no output"])[-1][-400:]
        pytest.skip(f"Keycloak could not be fetched or started (deploy/local/keycloak up exited "
                    f"{up.returncode}): {reason}")
    values = dict(line.split("=", 1) for line in up.stdout.split() if "=" in line)
    try:
        yield Keycloak(values["KEEL_KEYCLOAK_URL"], values["KEEL_KEYCLOAK_ADMIN"],
                       values["KEEL_KEYCLOAK_ADMIN_PASSWORD"])
    finally:
        subprocess.run([str(SCRIPT), "down"], check=False, env=env, capture_output=True, timeout=120)


class Setup(NamedTuple):
    kc: Keycloak
    server: HttpServer
    realm: str
    secrets: dict[str, str]     # client id -> secret
    other_realm: str


@pytest.fixture(scope="module")
def setup(keycloak: Keycloak, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tag = secrets.token_hex(4)
    realm, other = f"keel-{tag}", f"keel-other-{tag}"
    issuer = keycloak.realm(realm)
    keycloak.realm(other)
    clients = {
        "agent-a": keycloak.client(realm, "agent-a", tenant=TENANT_A, task="t1"),
        "reader-a": keycloak.client(realm, "reader-a", tenant=TENANT_A, write=False),
        "agent-b": keycloak.client(realm, "agent-b", tenant=TENANT_B),
        "no-audience": keycloak.client(realm, "no-audience", tenant=TENANT_A, audience=None),
        "short-lived": keycloak.client(realm, "short-lived", tenant=TENANT_A, lifespan=1),
    }
    clients["elsewhere"] = keycloak.client(other, "elsewhere", tenant=TENANT_A)
    tmp = tmp_path_factory.mktemp("keycloak")
    events = tmp / "events.jsonl"
    shutil.copyfile(FINANCE / "events.jsonl", events)
    with events.open("a", encoding="utf-8") as f:
        f.writelines(json.dumps(e) + "\n" for e in TENANT_B_EVENTS)
    with http_server(tmp, str(FINANCE), "--events", str(events), "--tenant", TENANT_A, "--issuer", issuer,
                     "--resource", RESOURCE, "--oauth-leeway", "0") as server:
        yield Setup(keycloak, server, realm, clients, other)


def token(s: Setup, client: str, realm: str | None = None) -> str:
    return s.kc.token(realm or s.realm, client, s.secrets[client])


def status(s: Setup, bearer: str) -> int:
    return raw_initialize(s.server.url, authorization=f"Bearer {bearer}").status_code


def test_keycloak_tokens_carry_the_claims_keel_reads(setup: Setup) -> None:
    claims = jwt.decode(token(setup, "agent-a"), options={"verify_signature": False})
    assert claims["azp"] == "agent-a" and claims["tenant"] == TENANT_A and claims["task"] == "t1"
    assert RESOURCE in ([claims["aud"]] if isinstance(claims["aud"], str) else claims["aud"])
    assert {"keel:read", "keel:write"} <= set(claims["scope"].split())
    reader = jwt.decode(token(setup, "reader-a"), options={"verify_signature": False})
    assert "keel:read" in reader["scope"].split() and "keel:write" not in reader["scope"].split()


def test_right_token_answers_and_reads_only_its_tenant(setup: Setup) -> None:
    async def go() -> None:
        async with http_session(setup.server.url, token(setup, "agent-a")) as s:
            assert fact(await ok(s, "context", {"entity": "debt:visa"}), "balance_cop")["value"] == 3870000
            for entity in ("debt:mastercard", f"household:{TENANT_B}"):      # tenant B's entities
                assert "unknown entity" in await refused(s, "context", {"entity": entity})
                await refused(s, "history", {"entity": entity})
                await refused(s, "related", {"entity": entity})
            assert "unknown argument 'tenant'" in await refused(
                s, "context", {"entity": "debt:mastercard", "tenant": TENANT_B})
            assert (await ok(s, "search", {"query": "Mastercard"}))["results"] == []
            note = await ok(s, "annotate", {"entity": "debt:visa", "predicate": "reviewed", "value": True,
                                            "scope": "agent"})
            assert note
    anyio.run(go)


def challenge(r: httpx2.Response) -> dict[str, str]:
    """The parameters of a `WWW-Authenticate: Bearer k="v", …` challenge."""
    header = r.headers["www-authenticate"]
    assert header.startswith("Bearer ")
    return dict(re.findall(r'(\w+)="([^"]*)"', header))


def test_refused_tokens(setup: Setup) -> None:
    meta_url = "https://keel.example.test/.well-known/oauth-protected-resource/mcp"
    r = raw_initialize(setup.server.url)
    assert r.status_code == 401          # no token: no error code (RFC 6750 §3.1), the scope to ask for
    assert challenge(r) == {"scope": "keel:read", "resource_metadata": meta_url}
    meta = httpx2.get(f"{setup.server.base}/.well-known/oauth-protected-resource/mcp", timeout=10).json()
    assert meta["resource"] == RESOURCE and meta["authorization_servers"] == [f"{setup.kc.url}/realms/{setup.realm}"]

    # each refused with 401 invalid_token saying why, and the server's log says so too (a reason, never a claim value)
    def refused_because(bearer: str, reason: str) -> None:
        r = raw_initialize(setup.server.url, authorization=f"Bearer {bearer}")
        assert r.status_code == 401, (reason, r.status_code)
        assert challenge(r) == {"error": "invalid_token", "error_description": f"bearer token refused: {reason}",
                                "scope": "keel:read", "resource_metadata": meta_url}
        assert f"bearer token refused: {reason}" in setup.server.stderr()
        assert TENANT_B not in r.text and "agent-b" not in r.text and "no-audience" not in r.text
    refused_because(token(setup, "no-audience"), "issued for another resource (aud)")
    refused_because(token(setup, "elsewhere", setup.other_realm), "issuer not trusted")
    refused_because(token(setup, "agent-b"), "tenant not served here")       # another tenant's
    head, body, signature = token(setup, "agent-a").split(".")
    refused_because(f"{head}.{body}.{signature[:-6]}AAAAAA", "bad signature")   # a signature not the realm's
    short = token(setup, "short-lived")                                      # Keycloak gave it 1 s to live
    exp = jwt.decode(short, options={"verify_signature": False})["exp"]
    while time.time() < exp + 1:
        time.sleep(0.2)
    refused_because(short, "expired")
    assert TENANT_B not in setup.server.stderr() and "agent-b" not in setup.server.stderr()

    reader = token(setup, "reader-a")
    init = raw_initialize(setup.server.url, authorization=f"Bearer {reader}")
    assert init.status_code == 200
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "annotate", "arguments": {
        "entity": "debt:visa", "predicate": "reviewed", "value": True, "scope": "agent"}}}
    r = httpx2.post(setup.server.url, json=call, timeout=30, headers={
        **MCP_HEADERS, "authorization": f"Bearer {reader}", "mcp-session-id": init.headers["mcp-session-id"],
        "mcp-protocol-version": "2025-06-18"})
    assert r.status_code == 403
    assert challenge(r) == {"error": "insufficient_scope", "error_description": "this call needs the scope keel:write",
                            "scope": "keel:write", "resource_metadata": meta_url}

    async def reads(s: Any) -> None:
        assert fact(await ok(s, "context", {"entity": "debt:visa"}), "balance_cop")["value"] == 3870000

    async def go() -> None:
        async with http_session(setup.server.url, reader) as s:
            await reads(s)
    anyio.run(go)
    assert setup.server.alive()


# ---- the MCP SDKs' client-credentials flows, as agents use them ------------------------------------------------

NODE_CLIENT = ROOT / "tests" / "clients" / "node" / "oauth_client_credentials.mjs"


class SdkSetup(NamedTuple):
    server: HttpServer
    issuer: str
    secrets: dict[str, str]     # client id -> secret


@pytest.fixture(scope="module")
def sdk(setup: Setup, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SdkSetup]:
    """A server whose resource is its own URL (the SDKs check that the metadata's `resource` is the URL they
    connect to) and two clients of the realm whose tokens name it: a reader (keel:read only) and a writer that
    gets keel:write only when it asks for it (an optional client scope), so its step-up is exercised."""
    tmp = tmp_path_factory.mktemp("keycloak-sdk")
    issuer = f"{setup.kc.url}/realms/{setup.realm}"
    events = tmp / "events.jsonl"
    shutil.copyfile(FINANCE / "events.jsonl", events)
    with http_server(tmp, str(FINANCE), "--events", str(events), "--tenant", TENANT_A, "--issuer", issuer) as server:
        clients = {
            "sdk-reader": setup.kc.client(setup.realm, "sdk-reader", tenant=TENANT_A, audience=server.url,
                                          write=False),
            "sdk-writer": setup.kc.client(setup.realm, "sdk-writer", tenant=TENANT_A, audience=server.url,
                                          write="optional"),
        }
        yield SdkSetup(server, issuer, clients)


READ = {"tool": "context", "arguments": {"entity": "debt:visa"}}
WRITE = {"tool": "annotate", "arguments": {"entity": "debt:visa", "predicate": "reviewed", "value": True,
                                           "scope": "agent"}}


class Storage:
    """The Python SDK's TokenStorage, in memory."""

    def __init__(self) -> None:
        self.tokens: Any = None
        self.client: Any = None

    async def get_tokens(self) -> Any:
        return self.tokens

    async def set_tokens(self, tokens: Any) -> None:
        self.tokens = tokens

    async def get_client_info(self) -> Any:
        return self.client

    async def set_client_info(self, client_info: Any) -> None:
        self.client = client_info


def python_client(sdk: SdkSetup, client_id: str, calls: list[dict[str, Any]]) -> dict[str, Any]:
    """Connect with the MCP Python SDK's ClientCredentialsOAuthProvider and make `calls`: what the node client
    reports, the same shape (calls, token_requests)."""
    from urllib.parse import parse_qs

    from mcp.client.auth import OAuthFlowError
    from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    asked: list[dict[str, Any]] = []

    async def record(request: httpx2.Request) -> None:
        form = parse_qs(request.content.decode(errors="replace")) if request.method == "POST" else {}
        if "grant_type" in form:
            asked.append({"grant_type": form["grant_type"][0], "scope": form.get("scope", [None])[0]})

    out: dict[str, Any] = {"calls": [], "token_requests": asked}

    async def go() -> None:
        provider = ClientCredentialsOAuthProvider(sdk.server.url, Storage(), client_id, sdk.secrets[client_id],
                                                  issuer=sdk.issuer)
        async with (httpx2.AsyncClient(auth=provider, event_hooks={"request": [record]},
                                       timeout=httpx2.Timeout(30.0, read=60.0)) as client,
                    streamable_http_client(sdk.server.url, http_client=client) as (read, write),
                    ClientSession(read, write) as session):
            await session.initialize()
            out["tools"] = [t.name for t in (await session.list_tools()).tools]
            for call in calls:
                result = await session.call_tool(call["tool"], call["arguments"])
                out["calls"].append({"tool": call["tool"], "ok": not result.is_error,
                                     "result": result.structured_content})
    try:
        anyio.run(go)
    except* OAuthFlowError as group:     # the flow failed (Keycloak refused a scope): the SDK ends the session
        assert "tools" in out, group.exceptions            # connected first
        failed = calls[len(out["calls"])]
        out["calls"].append({"tool": failed["tool"], "ok": False, "thrown": str(group.exceptions[0])})
    return out


def node_client(sdk: SdkSetup, client_id: str, calls: list[dict[str, Any]], scope: str = "") -> dict[str, Any]:
    """Connect with the TypeScript SDK's ClientCredentialsProvider (tests/clients/node, installed by
    scripts/ensure-clients; `scope`: its scope option) and make `calls`."""
    node = shutil.which("node")
    sdk_dir = NODE_CLIENT.parent / "node_modules" / "@modelcontextprotocol" / "sdk"
    if node is None or not sdk_dir.is_dir():
        reason = ("no node on PATH" if node is None else f"{sdk_dir} missing") + " (scripts/ensure-clients installs it)"
        if os.environ.get("KEEL_REQUIRE_SERVICES") == "1":
            pytest.fail(f"{reason} but KEEL_REQUIRE_SERVICES=1")
        pytest.skip(reason)
    run = subprocess.run([node, str(NODE_CLIENT), sdk.server.url, sdk.issuer, client_id, json.dumps(calls), scope],
                         env={**os.environ, "KEEL_CLIENT_SECRET": sdk.secrets[client_id]}, capture_output=True,
                         text=True, timeout=120, check=False)
    assert run.stdout.strip(), run.stderr
    out: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    assert run.returncode == (0 if out["connected"] else 1), run.stderr
    assert out["connected"], (out, run.stderr)
    return out


def test_python_sdk_read_only_client_connects(sdk: SdkSetup) -> None:
    """The MCP Python SDK's ClientCredentialsOAuthProvider with a client holding only keel:read: the 401 names
    keel:read, which is what it asks Keycloak for (without scope= it asked for every scope of the metadata,
    keel:write too, and Keycloak answered invalid_scope). Its annotate gets 403 scope=keel:write; the SDK's
    step-up asks for it and Keycloak refuses, which ends that session."""
    out = python_client(sdk, "sdk-reader", [READ, WRITE])
    assert {"context", "annotate"} <= set(out["tools"])
    read, write = out["calls"]
    assert read["ok"] and fact(read["result"], "balance_cop")["value"] == 3870000
    assert not write["ok"] and "invalid_scope" in write["thrown"], write
    first, step_up = out["token_requests"]
    assert first == {"grant_type": "client_credentials", "scope": "keel:read"}
    assert "keel:write" in step_up["scope"].split()
    assert sdk.server.alive()


def test_python_sdk_writer_steps_up(sdk: SdkSetup) -> None:
    """A writer whose keel:write is optional (granted only when asked for): it connects with keel:read, its first
    annotate gets 403 insufficient_scope scope=keel:write, the SDK adds keel:write to what it asked for before,
    and the call goes through; reading goes on with the new token."""
    out = python_client(sdk, "sdk-writer", [READ, WRITE, READ])
    assert [c["ok"] for c in out["calls"]] == [True, True, True], out["calls"]
    first, step_up = out["token_requests"]
    assert first["scope"] == "keel:read" and {"keel:read", "keel:write"} <= set(step_up["scope"].split())
    assert sdk.server.alive()


def test_typescript_sdk_client_credentials(sdk: SdkSetup) -> None:
    """The TypeScript SDK's ClientCredentialsProvider (1.32) asks for its configured `scope`, or for none, in each
    token request, never for a challenge's: a read-only client connects with Keycloak's default scopes, a writer
    configured with scope "keel:read keel:write" writes; a writer left without it is refused annotate (403) after
    one re-authentication that asks for nothing more."""
    out = node_client(sdk, "sdk-reader", [READ, WRITE])
    read, write = out["calls"]
    assert read["ok"] and fact(read["result"], "balance_cop")["value"] == 3870000
    assert not write["ok"] and "403" in write["thrown"], write
    assert {"context", "annotate"} <= set(out["tools"])
    assert [r["scope"] for r in out["token_requests"]] == [None, None]

    out = node_client(sdk, "sdk-writer", [READ, WRITE, READ], scope="keel:read keel:write")
    assert [c["ok"] for c in out["calls"]] == [True, True, True], out["calls"]
    assert out["token_requests"] == [{"grant_type": "client_credentials", "scope": "keel:read keel:write"}]

    out = node_client(sdk, "sdk-writer", [READ, WRITE])
    assert [c["ok"] for c in out["calls"]] == [True, False]
    assert [r["scope"] for r in out["token_requests"]] == [None, None]
    assert sdk.server.alive()


def test_rotated_keys(setup: Setup) -> None:
    """Runs last in this module (it rotates the realm's signing key)."""
    before = token(setup, "agent-a")
    assert status(setup, before) == 200                      # its key is now cached by Keel
    setup.kc.rotate_keys(setup.realm)
    after = token(setup, "agent-a")
    assert jwt.get_unverified_header(after)["kid"] != jwt.get_unverified_header(before)["kid"]
    assert status(setup, after) == 200                       # the new key, fetched without a restart
    assert status(setup, before) == 401                      # signed by a key the realm rotated away
    assert setup.server.alive()


def test_script_help() -> None:
    out = subprocess.run([str(SCRIPT), "--help"], check=False, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "keycloak-quarkus-dist" in out.stdout
    assert subprocess.run([str(SCRIPT), "bogus"], check=False, capture_output=True, timeout=30).returncode == 2

