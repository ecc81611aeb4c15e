"""The MCP server over the Redis graph (reads), and annotate's read-your-writes through Kafka and a worker.

Needs KEEL_REDIS_URL (and KEEL_KAFKA_BOOTSTRAP for annotate); skipped without them unless
KEEL_REQUIRE_SERVICES=1. Each test uses its own tenant of a private copy of the finance cartridge (conftest.py
`private_finance`: its own namespace, topic and worker group) and drops the namespace from Redis at the end.
"""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.mcp_sessions import (
    FINANCE,
    ROOT,
    fact,
    finance_story,
    memory_session,
    ok,
    refused,
    stdio_session,
    stop_process,
)

from keel.cartridge import load_cartridge
from keel.config import resolve
from keel.embedded import replay_file
from keel.projector import Projector
from tools_server.backend import Backend
from tools_server.config import Identity, ServerConfig
from tools_server.server import build_server

pytestmark = pytest.mark.services


def tenant_events(tmp_path: Path, tenant: str) -> Path:
    """The finance stream moved to `tenant` (event ids made unique too)."""
    out = tmp_path / "events.jsonl"
    with out.open("w", encoding="utf-8") as f:
        for line in (FINANCE / "events.jsonl").read_text(encoding="utf-8").splitlines():
            event = json.loads(line)
            event["tenant"] = tenant
            f.write(json.dumps(event) + "\n")
    return out


@pytest.fixture
def tenant() -> str:
    return f"mcp-{secrets.token_hex(4)}"


@pytest.fixture
def redis_store(redis_url: str, private_finance: Path) -> Iterator[Any]:
    from keel.store.redis import RedisStore
    store = RedisStore.from_url(redis_url, namespace=load_cartridge(private_finance).name)
    try:
        yield store
    finally:
        store.drop_namespace()
        store.close()


def test_reads_over_redis(tmp_path: Path, tenant: str, redis_store: Any, private_finance: Path) -> None:
    cartridge = load_cartridge(private_finance)
    report = replay_file(Projector(cartridge, redis_store), tenant_events(tmp_path, tenant))
    assert report.applied == 17 and not report.rejected
    backend = Backend(cartridge, redis_store, None, blocking=True)
    server = build_server(ServerConfig(backend, identity=Identity(tenant, "a1")))

    async def go() -> None:
        async with memory_session(server) as s:
            assert (await ok(s, "search", {"query": "Visa", "type": "debt"}))["results"][0]["entity"] == "debt:visa"
            assert fact(await ok(s, "context", {"entity": "debt:visa"}), "balance_cop")["value"] == 3870000
            then = await ok(s, "context", {"entity": "debt:visa", "at": "2026-09-15"})
            assert fact(then, "balance_cop")["value"] == 4200000
            assert then["rules"]["debt_expensive"]["rate_ea_pct"] == 25
            versions = (await ok(s, "history", {"entity": "debt:visa", "predicate": "balance_cop"}))["versions"]
            assert [v["value"] for v in versions] == [4200000, 3870000]
            dues = (await ok(s, "related", {"entity": "debt:visa", "relation": "for_debt"}))["relations"]
            assert len(dues) == 3
            assert fact(await ok(s, "context", {"entity": "due:visa-2026-11"}), "status")["value"] == "pending"
            for entity in ("debt:*", "debt:{x}", "{" + tenant + "}:debt", "debt:visa|f", "debt:%7C"):
                await refused(s, "context", {"entity": entity})
            assert "no event log" in await refused(s, "annotate", {"entity": "debt:visa", "predicate": "n",
                                                                   "value": 1, "scope": "agent"})
    anyio.run(go)


@pytest.fixture
def worker(tmp_path: Path, tenant: str, redis_url: str, kafka_bootstrap: str, redis_store: Any,
           private_finance: Path) -> Iterator[Path]:
    """The tenant's events published to the cartridge topic and a worker applying them to Redis."""
    events = tenant_events(tmp_path, tenant)
    env = {**os.environ, "KEEL_REDIS_URL": redis_url, "KEEL_KAFKA_BOOTSTRAP": kafka_bootstrap}
    keel = [sys.executable, "-m", "keel.cli"]
    subprocess.run([*keel, "publish", str(private_finance), str(events), "--kafka", kafka_bootstrap], cwd=str(ROOT),
                   env=env, check=True, capture_output=True, timeout=120)
    log = (tmp_path / "worker.log").open("wb")
    proc = subprocess.Popen([*keel, "worker", str(private_finance), "--kafka", kafka_bootstrap, "--redis", redis_url],
                            cwd=str(ROOT), env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not redis_store.has_event(tenant, "pay-libranza-2026-11"):
            assert proc.poll() is None, (tmp_path / "worker.log").read_text()
            assert time.monotonic() < deadline, "the worker did not apply the stream in 120 s"
            time.sleep(0.2)
        yield events
    finally:
        stop_process(proc, 30)
        log.close()


def test_annotate_read_your_writes_through_kafka(worker: Path, tenant: str, redis_url: str,
                                                  kafka_bootstrap: str, private_finance: Path) -> None:
    settings = resolve({"redis": redis_url, "kafka": kafka_bootstrap})
    backend = Backend.redis(load_cartridge(private_finance), redis_url, settings)
    assert backend.log is not None
    server = build_server(ServerConfig(backend, identity=Identity(tenant, "debts", "visa-plan")))

    async def go() -> None:
        async with memory_session(server) as s:
            await finance_story(s)          # annotate returns once the worker shows the note, then context sees it
            assert "requires evidence" in await refused(s, "annotate", {"entity": "debt:visa", "predicate": "n",
                                                                        "value": 1, "scope": "tenant"})
    try:
        anyio.run(go)
    finally:
        backend.close()


def test_stdio_serve_on_redis_and_kafka(worker: Path, tenant: str, redis_url: str, kafka_bootstrap: str,
                                        private_finance: Path) -> None:
    async def go() -> None:
        async with stdio_session(str(private_finance), "--tenant", tenant, "--redis", redis_url, "--kafka", kafka_bootstrap,
                                 "--agent", "a1", "--no-call-log") as s:
            note = (await ok(s, "annotate", {"entity": "debt:visa", "predicate": "seen", "value": True,
                                             "scope": "agent"}))["fact"]
            assert note["by"] == "agent:a1"
            assert fact(await ok(s, "context", {"entity": "debt:visa"}), "seen", scope="agent")["value"] is True
    anyio.run(go)
