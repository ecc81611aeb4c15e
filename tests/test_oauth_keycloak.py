"""`keel serve --transport http --issuer` against a real identity provider: Keycloak (deploy/local/keycloak, from
Maven Central, cached like Kafka's jars) with a realm, a client per agent (client-credentials grant), the tenant
and task as token claims (hardcoded-claim protocol mappers), the audience = Keel's resource URL (audience mapper)
and the client scopes keel:read / keel:write. Tokens Keycloak issues drive the MCP server: right token -> answers;
expired, wrong audience, wrong issuer, another tenant's, missing write scope, signed by a key the realm rotated
away -> refused with the right status; a token signed by the realm's new key accepted without a restart.

Where Keycloak cannot be fetched or started (no mvn, no network, no Java 21+, too slow) this module skips and says
why; tests/test_oauth.py covers the verifier with locally minted tokens either way. KEEL_KEYCLOAK_URL (with
KEEL_KEYCLOAK_ADMIN / KEEL_KEYCLOAK_ADMIN_PASSWORD) uses a Keycloak already running instead of starting one.
"""
from __future__ import annotations

import json
import os
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
               audience: str | None = RESOURCE, write: bool = True, lifespan: int | None = None) -> str:
        """A confidential client of one agent (client-credentials grant) whose tokens carry `tenant` (and `task`)
        claims and `audience`; keel:read always, keel:write when `write`. Its secret."""
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
            self.call("PUT", f"/{realm}/clients/{internal}/default-client-scopes/{scopes['keel:write']}")
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


def test_refused_tokens(setup: Setup) -> None:
    r = raw_initialize(setup.server.url)
    assert r.status_code == 401
    assert 'resource_metadata="https://keel.example.test/.well-known/oauth-protected-resource/mcp"' in r.headers[
        "www-authenticate"]
    meta = httpx2.get(f"{setup.server.base}/.well-known/oauth-protected-resource/mcp", timeout=10).json()
    assert meta["resource"] == RESOURCE and meta["authorization_servers"] == [f"{setup.kc.url}/realms/{setup.realm}"]

    # each refused with 401, and the server's log says why (a reason, never a claim value)
    assert status(setup, token(setup, "no-audience")) == 401
    assert "bearer token refused: issued for another resource (aud)" in setup.server.stderr()
    assert status(setup, token(setup, "elsewhere", setup.other_realm)) == 401
    assert "bearer token refused: issuer not trusted" in setup.server.stderr()
    assert status(setup, token(setup, "agent-b")) == 401                     # another tenant's (not served here)
    assert "bearer token refused: tenant not served here" in setup.server.stderr()
    short = token(setup, "short-lived")                                      # Keycloak gave it 1 s to live
    exp = jwt.decode(short, options={"verify_signature": False})["exp"]
    while time.time() < exp + 1:
        time.sleep(0.2)
    assert status(setup, short) == 401
    assert "bearer token refused: expired" in setup.server.stderr()
    assert TENANT_B not in setup.server.stderr() and "agent-b" not in setup.server.stderr()

    reader = token(setup, "reader-a")
    init = raw_initialize(setup.server.url, authorization=f"Bearer {reader}")
    assert init.status_code == 200
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "annotate", "arguments": {
        "entity": "debt:visa", "predicate": "reviewed", "value": True, "scope": "agent"}}}
    r = httpx2.post(setup.server.url, json=call, timeout=30, headers={
        **MCP_HEADERS, "authorization": f"Bearer {reader}", "mcp-session-id": init.headers["mcp-session-id"],
        "mcp-protocol-version": "2025-06-18"})
    assert r.status_code == 403 and 'error="insufficient_scope"' in r.headers["www-authenticate"]

    async def reads(s: Any) -> None:
        assert fact(await ok(s, "context", {"entity": "debt:visa"}), "balance_cop")["value"] == 3870000

    async def go() -> None:
        async with http_session(setup.server.url, reader) as s:
            await reads(s)
    anyio.run(go)
    assert setup.server.alive()


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

