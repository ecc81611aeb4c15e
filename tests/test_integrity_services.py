"""Write-side integrity through Kafka -> workers -> Redis and `keel replay` (issue 12): the same refusals as
file mode, dead-lettered with their reasons and counted; marks and the latest recorded_at survive a worker
restart and a replay (they live in Redis, written with the ids); digests equal the embedded build."""
from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from support.integrity import acct_set, correction_log, ledger_cartridge, odd, write_events
from support.workers import (
    WorkerProcess,
    embedded_digests,
    keel,
    produce_raw,
    read_topic,
    redis_digests,
    services_env,
    status,
    wait_applied,
)

from keel import reading
from keel.cartridge import load_cartridge
from keel.store.redis import RedisStore

pytestmark = pytest.mark.services


def records(envelopes: list[dict[str, Any]]) -> list[tuple[bytes, bytes]]:
    return [(e["tenant"].encode(), json.dumps(e).encode()) for e in envelopes]


def reasons(env: dict[str, str], topic: str, expected: int) -> dict[str, str]:
    """{event id: reason} of the dead letters of a topic."""
    out = {}
    for r in read_topic(env, topic, expected):
        headers = {k: v.decode() for k, v in r.headers}
        out[headers.get("keel.event_id", "?")] = headers["keel.reason"]
    return out


def run_worker(cartridge: Path, env: dict[str, str], log: Path, total: int) -> None:
    worker = WorkerProcess([cartridge], env, log)
    try:
        wait_applied(cartridge, env, total, worker)
    finally:
        worker.terminate()


def test_integrity_through_workers_and_replay(tmp_path: Path) -> None:
    env = services_env()
    folder = ledger_cartridge(tmp_path / "ledger", name=f"t{uuid.uuid4().hex[:10]}")
    cartridge = load_cartridge(folder)
    first = [
        acct_set("e1", "a1", 100, "2026-01-01", "2026-01-10T00:00:00Z", holder="h1"),
        acct_set("e2", "a1", 200, "2026-01-05", "2026-01-03T00:00:00Z"),          # backwards: clamped
        {k: v for k, v in acct_set("e1", "a1", 100, "2026-01-01", holder="h1").items()},   # identical
        acct_set("e1", "a1", 555, "2026-01-01", "2026-01-11T00:00:00Z"),          # id reused: conflict
        acct_set("e3", "a1", 999, "2026-01-02", "2099-01-01T00:00:00Z"),          # future: refused
        odd("e4", "set"),                                                         # not JSON
        odd("e5", "big", 5000),                                                   # over the limit
    ]
    produce_raw(env, cartridge.topic, records(first))
    run_worker(folder, env, tmp_path / "w1.log", len(first))
    # a new worker knows the ids' marks and the latest recorded_at from Redis alone
    second = [
        acct_set("e2", "a1", 201, "2026-01-05", "2026-01-12T00:00:00Z"),          # conflict after restart
        acct_set("e6", "a2", 7, "2026-01-06", "2026-01-01T00:00:00Z"),            # backwards after restart
    ]
    produce_raw(env, cartridge.topic, records(second))
    run_worker(folder, env, tmp_path / "w2.log", len(first) + len(second))

    why = reasons(env, cartridge.dlq_topic, 5)
    assert set(why) == {"e1", "e2", "e3", "e4", "e5"}
    assert "id 'e1' was first seen at " in why["e1"] and f"{cartridge.topic}" in why["e1"]
    assert "id 'e2' was first seen at " in why["e2"]
    assert "recorded_at 2099-01-01T00:00:00Z is in the future" in why["e3"]
    assert "handler acct_odd for acct.odd wrote predicate memo: a set is not a JSON value" in why["e4"]
    assert "over the 4096-byte limit (limits.value_bytes)" in why["e5"]
    assert status(folder, env)["dead_letters"]["total"] == 5

    store = RedisStore.from_url(env["KEEL_REDIS_URL"], namespace=cartridge.name)
    try:
        [a2] = reading.history(store, "t1", "acct:a2", predicate="balance")
        assert a2["recorded_at"] == "2026-01-10T00:00:00Z"      # the refused e2 moved nothing
        balances = [(v["value"], v["recorded_at"]) for v in reading.history(store, "t1", "acct:a1", predicate="balance")]
        assert balances == [(100, "2026-01-10T00:00:00Z"), (200, "2026-01-10T00:00:00Z")]
    finally:
        store.close()

    accepted = write_events(tmp_path / "all.jsonl", first + second)
    expected = embedded_digests(cartridge, accepted)
    assert redis_digests(folder, env, expected) == expected

    keel("replay", str(folder), "--tenant", "t1", env=env)
    assert redis_digests(folder, env, expected) == expected
    # the replayed generation kept the marks: a conflict is still refused afterwards
    produce_raw(env, cartridge.topic, records([acct_set("e6", "a2", 8, "2026-01-06")]))
    run_worker(folder, env, tmp_path / "w3.log", len(first) + len(second) + 1)
    assert "id 'e6' was first seen at " in reasons(env, cartridge.dlq_topic, 6)["e6"]
    assert redis_digests(folder, env, expected) == expected


def test_corrections_and_retractions_through_workers_and_replay(tmp_path: Path) -> None:
    env = services_env()
    folder = ledger_cartridge(tmp_path / "ledger", name=f"t{uuid.uuid4().hex[:10]}")
    cartridge = load_cartridge(folder)
    log = correction_log()
    produce_raw(env, cartridge.topic, records(log))
    run_worker(folder, env, tmp_path / "w1.log", len(log))
    why = reasons(env, cartridge.dlq_topic, 3)
    assert "already retracted or corrected" in why["e5"]
    assert "cannot correct event 'nope'" in why["e6"] and "not an applied event of tenant 't2'" in why["e7"]
    expected = embedded_digests(cartridge, write_events(tmp_path / "all.jsonl", log))
    assert redis_digests(folder, env, expected) == expected
    store = RedisStore.from_url(env["KEEL_REDIS_URL"], namespace=cartridge.name)
    try:
        assert [f["value"] for f in reading.facts(store, "t1", "acct:a1", at="2026-01-15")] == []
        assert [f["value"] for f in reading.facts(store, "t1", "acct:a1", at="2026-02-15")] == [200]
        assert reading.relations(store, "t1", "acct:a1", at="2026-01-15") == []
    finally:
        store.close()
    keel("replay", str(folder), "--tenant", "t1", env=env)
    assert redis_digests(folder, env, expected) == expected
