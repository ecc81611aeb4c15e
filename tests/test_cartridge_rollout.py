"""Issue 29 against real Kafka and Redis: a producer ahead of the workers (a version the workers' cartridge does
not know stops its partition, skipping nothing, until a worker with the new cartridge runs), and the rollout
procedure of docs/operations.md while a worker ingests (validate and diff against the topic, workers switched,
producers on the new version, `keel replay --all`), after which every tenant equals the embedded build under the
new cartridge."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from common import finance_events
from support.mcp_sessions import free_port
from support.probes import get
from support.versions import add_currency, label_currency, variant
from support.workers import (
    WorkerProcess,
    committed,
    embedded_digests,
    keel,
    read_until,
    redis_digests,
    services,
    services_env,
    status,
    unique_cartridge,
    wait_applied,
    wait_until,
    write_jsonl,
)

from keel.cartridge import load_cartridge
from keel.store.redis import RedisStore
from keel.wire import dlq_topic, partition_for
from workers.status import render_status

pytestmark = [services, pytest.mark.timeout(900)]
PARTITIONS = 8


@pytest.fixture
def env() -> dict[str, str]:
    return services_env()


def lines(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines() if line.strip()]


def other_tenant(than: str) -> str:
    """A tenant whose records land on another partition than `than`'s."""
    return next(t for t in (f"casa-{i}" for i in range(100))
                if partition_for(t, PARTITIONS) != partition_for(than, PARTITIONS))


def event_ids(env: dict[str, str], name: str, tenant: str) -> list[str]:
    store = RedisStore.from_url(env["KEEL_REDIS_URL"], namespace=name)
    try:
        return store.event_ids(tenant)
    finally:
        store.close()


def test_a_newer_version_stops_its_partition_until_a_worker_knows_it(env: dict[str, str], tmp_path: Path) -> None:
    old = unique_cartridge(tmp_path, "finance")
    # same name (the same topic and graph); version 2 of debt.snapshot, the projection as before: no replay needed
    new = variant(tmp_path / "new", add_currency, source=old)
    name = load_cartridge(old).name
    sample = lines(old)
    newer = {**sample[0], "id": "snap-visa-v2", "occurred_at": "2026-09-02", "version": 2,
             "payload": {**sample[0]["payload"], "currency": "USD"}}
    casa = other_tenant("hogar-demo")
    others = [{**e, "tenant": casa, "id": f"{casa}-{e['id']}"} for e in sample]
    stream = [*sample[:8], newer, *sample[8:], *others]
    events = write_jsonl(tmp_path / "events.jsonl", stream)
    keel("publish", str(new), str(events), "--partitions", str(PARTITIONS), env=env)   # the producer is ahead
    held_partition = partition_for("hogar-demo", PARTITIONS)
    port = free_port()
    worker = WorkerProcess([old], env, tmp_path / "old.log", "--metrics-port", str(port))
    try:
        def held() -> dict[str, Any] | None:
            rows = {p["partition"]: p for p in status(old, env)["partitions"]}
            return rows[held_partition]["held"] if held_partition in rows else None
        wait_until(lambda: held() is not None and len(event_ids(env, name, casa)) == len(others), 180,
                   "the partition held and the other tenant applied", on_timeout=worker.text)
        assert held() == {"offset": 8, "type": "debt.snapshot", "version": 2, "known": 1}
        code, body = get(f"http://127.0.0.1:{port}/readyz")
        assert code == 503
        assert (f"partition {held_partition} stopped at offset 8: a record of debt.snapshot version 2, newer than "
                f"this cartridge knows (version 1)") in body
        assert f"partition {held_partition} stopped at offset 8" in worker.text()
        assert event_ids(env, name, "hogar-demo") == sorted(e["id"] for e in sample[:8])    # nothing after it
        doc = status(old, env)
        assert doc["dead_letters"]["total"] == 0                            # nothing dead-lettered
        assert any(f"partition {held_partition}: stopped at offset 8, a record of debt.snapshot version 2" in p
                   for p in doc["problems"])
        assert "HELD (newer version)" in render_status(doc)
        assert [p["lag"] for p in doc["partitions"] if p["lag"]] == [len(sample) - 8 + 1]
        checked = keel("validate", str(old), "--kafka", env=env, check=False)     # the log, record by record
        assert checked.returncode == 2
        assert (f"keel.{name}.events partition {held_partition} offset 8: event snap-visa-v2: debt.snapshot "
                f"version 2 is newer than this cartridge knows (version 1)") in checked.stderr
        assert f"keel.{name}.events: 1 bad record(s) of {len(stream)}" in checked.stderr
        assert keel("validate", str(new), "--kafka", env=env).returncode == 0
        assert worker.terminate() == 0
    finally:
        worker.kill()
    worker = WorkerProcess([new], env, tmp_path / "new.log", "--metrics-port", str(port))
    try:
        wait_applied(new, env, len(stream), worker)
        expected = embedded_digests(load_cartridge(new), events)
        assert sorted(expected) == sorted(["hogar-demo", casa])
        assert redis_digests(new, env, expected) == expected
        assert event_ids(env, name, "hogar-demo") == sorted(e["id"] for e in stream if e["tenant"] == "hogar-demo")
        doc = status(new, env)
        assert all(p["held"] is None for p in doc["partitions"]) and doc["dead_letters"]["total"] == 0
        wait_until(lambda: get(f"http://127.0.0.1:{port}/readyz")[0] == 200, 60, "ready", on_timeout=worker.text)
    finally:
        worker.kill()
    assert read_until(env["KEEL_KAFKA_BOOTSTRAP"], dlq_topic(name), until=lambda out: False, timeout=2) == []


def generated(n: int, tenants: int, seed: int, *, first: int = 0) -> list[dict[str, Any]]:
    """finance envelopes (recorded_at set, so the embedded build is the oracle), tenants interleaved."""
    by_tenant: dict[str, list[dict[str, Any]]] = {}
    for e in finance_events(n, tenants, seed=seed):
        e = {**e, "id": f"{e['id']}-{first}", "recorded_at": e["occurred_at"]}
        by_tenant.setdefault(e["tenant"], []).append(e)
    out, queues = [], list(by_tenant.values())
    while any(queues):
        out += [q.pop(0) for q in queues if q]
    return out


def as_version_2(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What a producer on version 2 sends: snapshots with `version: 2` and a currency."""
    return [{**e, "version": 2, "payload": {**e["payload"], "currency": "USD"}} if e["type"] == "debt.snapshot" else e
            for e in events]


def test_rolling_out_a_new_version_while_a_worker_ingests(env: dict[str, str], tmp_path: Path) -> None:
    """docs/operations.md, "Rolling out a cartridge change", step by step with a worker ingesting a backlog."""
    old = unique_cartridge(tmp_path, "finance")
    new = variant(tmp_path / "new", label_currency, source=old)
    before = write_jsonl(tmp_path / "before.jsonl", generated(3000, 30, seed=5))
    keel("publish", str(old), str(before), "--partitions", str(PARTITIONS), env=env)
    worker = WorkerProcess([old], env, tmp_path / "old.log", "--batch", "200", "--within", "0.05")
    try:
        wait_until(lambda: committed(old, env) > 0, 120, "the old worker ingesting", interval=0.05,
                   on_timeout=worker.text)
        checked = keel("validate", str(new), "--kafka", env=env)            # step 2, while the worker ingests
        assert "keel." in checked.stdout and "3000 events ok" in checked.stdout
        diff = keel("diff", str(old), str(new), "--kafka", "--json", env=env, check=False)
        report = json.loads(diff.stdout)
        assert diff.returncode == 1 and report["read"] == 3000 and report["refused_by_new"] == 0
        assert report["changed_tenants"] == 30                                # each has a debt with a currency now
        assert worker.terminate() == 0                                        # step 3: the workers switched
    finally:
        worker.kill()
    worker = WorkerProcess([new], env, tmp_path / "new.log", "--batch", "200", "--within", "0.05")
    try:
        after = write_jsonl(tmp_path / "after.jsonl", as_version_2(generated(1000, 30, seed=6, first=1)))
        keel("publish", str(new), str(after), env=env)                        # producers on version 2
        replay = keel("replay", str(new), "--all", env=env, timeout=600)     # step 4, the worker running
        assert "30 tenant(s) switched" in replay.stdout
        wait_applied(new, env, 4000, worker)
        both = write_jsonl(tmp_path / "all.jsonl", [*map(json.loads, before.read_text().splitlines()),
                                                    *map(json.loads, after.read_text().splitlines())])
        expected = embedded_digests(load_cartridge(new), both)
        assert len(expected) == 30
        assert redis_digests(new, env, expected) == expected
        assert status(new, env)["dead_letters"]["total"] == 0
        assert "Traceback" not in worker.text()
    finally:
        worker.kill()
