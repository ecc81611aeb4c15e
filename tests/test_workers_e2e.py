"""The production write path against real Kafka and Redis: publish → `keel worker` → Redis, and the pass mark
of issue 3 throughout: each tenant's Redis digest equals the embedded build's digest of the same events."""
from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
from common import finance_events
from support.workers import (
    CARTRIDGES,
    WorkerProcess,
    committed,
    embedded_digests,
    keel,
    produce_raw,
    read_topic,
    redis_digests,
    services,
    services_env,
    status,
    unique_cartridge,
    wait_applied,
    wait_until,
    write_jsonl,
)

from keel import wire
from keel.cartridge import load_cartridge
from keel.embedded import build_embedded
from keel.errors import UnknownEntity
from keel.store.redis import RedisStore
from keel.times import parse_time
from keel.tools import Tools
from keel.wire import dlq_topic, events_topic, keel_headers

pytestmark = [services, pytest.mark.timeout(600)]
NOW = parse_time("2026-11-30T12:00:00Z")


@pytest.fixture
def env() -> dict[str, str]:
    return services_env()


def lines_of(path: Path) -> int:
    return sum(1 for line in path.read_bytes().splitlines() if line.strip())


def test_sample_streams_published_twice_equal_the_embedded_build(env: dict[str, str], tmp_path: Path) -> None:
    """One worker serving the three sample cartridges; then annotate in Redis mode (KafkaLog) with it."""
    folders = [unique_cartridge(tmp_path, name) for name in CARTRIDGES]
    counts = {}
    for folder in folders:
        counts[folder] = lines_of(folder / "events.jsonl")
        out = keel("publish", str(folder), str(folder / "events.jsonl"), env=env)
        assert f"published {counts[folder]} event(s)" in out.stdout
    worker = WorkerProcess(folders, env, tmp_path / "worker.log")
    try:
        expected = {}
        for folder in folders:
            wait_applied(folder, env, counts[folder], worker)
            expected[folder] = embedded_digests(load_cartridge(folder), folder / "events.jsonl")
            for tenant, digest in expected[folder].items():
                from_redis = keel("digest", str(folder), "--tenant", tenant, "--redis", env["KEEL_REDIS_URL"],
                                  env=env)
                from_file = keel("digest", str(folder), "--tenant", tenant, "--events",
                                 str(folder / "events.jsonl"), env=env)
                assert from_redis.stdout == from_file.stdout == digest + "\n"
        for folder in folders:                                          # the same streams again
            keel("publish", str(folder), str(folder / "events.jsonl"), env=env)
        for folder in folders:
            wait_applied(folder, env, 2 * counts[folder], worker)
            assert redis_digests(folder, env, expected[folder]) == expected[folder]
        for folder in folders:
            assert_redis_answers_equal_embedded(folder, env["KEEL_REDIS_URL"])
        finance = folders[0]
        note = keel("annotate", str(finance), "--redis", env["KEEL_REDIS_URL"], "--tenant", "hogar-demo",
                    "debt:visa", "next_step", "call the bank", "--scope", "tenant", "--evidence", "snap-visa-2026-09",
                    "--json", env=env)
        assert json.loads(note.stdout)["fact"]["value"] == "call the bank"
        history = keel("history", str(finance), "--redis", env["KEEL_REDIS_URL"], "--tenant", "hogar-demo",
                       "debt:visa", "--predicate", "next_step", "--json", env=env)
        assert [v["value"] for v in json.loads(history.stdout)["versions"]] == ["call the bank"]
        assert worker.terminate() == 0                                  # SIGTERM: graceful, exit 0
    finally:
        worker.kill()


def assert_redis_answers_equal_embedded(folder: Path, url: str) -> None:
    """context (facts, relations, rule verdicts, known_through) of every entity at several times is the same in
    Redis mode as embedded; Redis mode also tells the workers' lag, 0 once they caught up."""
    cartridge = load_cartridge(folder)
    projector, report = build_embedded(cartridge, folder / "events.jsonl")
    redis_store = RedisStore.from_url(url, namespace=cartridge.name)
    try:
        for tenant in sorted(report.tenants):
            embedded = Tools(cartridge, projector.store, tenant, clock=lambda: NOW)
            in_redis = Tools(cartridge, redis_store, tenant, clock=lambda: NOW)
            entities = [e for e, _, _ in projector.store.search_entities(tenant)]
            for entity in entities:
                for times in ({}, {"at": "2026-09-20"}, {"at": "2026-11-06", "known_at": "2026-10-01"}):
                    mine, theirs = (answer(t, entity, times) for t in (embedded, in_redis))
                    if isinstance(theirs, dict):
                        assert theirs.pop("lag") == 0
                    assert json.dumps(theirs) == json.dumps(mine), (entity, times)
            assert embedded.search("a")["known_through"] == in_redis.search("a")["known_through"] is not None
    finally:
        redis_store.close()


def answer(tools: Tools, entity: str, times: dict[str, str]) -> dict | str:
    """context's result, or the error's name (an entity not known yet at known_at)."""
    try:
        return tools.context(entity, **times)
    except UnknownEntity as e:
        return type(e).__name__


def test_bad_records_go_to_the_dead_letter_topic_and_the_worker_goes_on(env: dict[str, str],
                                                                        tmp_path: Path) -> None:
    folder = unique_cartridge(tmp_path, "finance")
    name = load_cartridge(folder).name
    good = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    unknown = {**good[0], "id": "u-1", "type": "debt.vanished"}
    bad_payload = {**good[0], "id": "b-1", "payload": {**good[0]["payload"], "balance_cop": "a lot"}}
    tenant = good[0]["tenant"].encode()
    bad = [(tenant, b'{"id": "broken", "tenant": '), (tenant, json.dumps(unknown).encode()),
           (tenant, json.dumps(bad_payload).encode()), (None, b"\xff\xfe not even text")]
    records = [(tenant, json.dumps(e).encode()) for e in good[:5]] + bad + \
              [(tenant, json.dumps(e).encode()) for e in good[5:]]
    produce_raw(env, events_topic(name), records)
    worker = WorkerProcess([folder], env, tmp_path / "worker.log")
    try:
        wait_applied(folder, env, len(records), worker)
        letters = read_topic(env, dlq_topic(name), len(bad))
        assert worker.alive()
        assert sorted(r.value for r in letters) == sorted(v for _, v in bad)     # the original bytes
        by_value = {r.value: keel_headers(r.headers) for r in letters}
        assert "not valid JSON" in by_value[bad[0][1]][wire.REASON]
        assert "unknown event type 'debt.vanished'" in by_value[bad[1][1]][wire.REASON]
        assert by_value[bad[1][1]][wire.EVENT_ID] == "u-1"
        assert by_value[bad[1][1]][wire.TENANT] == tenant.decode()
        assert "payload.balance_cop: expected number" in by_value[bad[2][1]][wire.REASON]
        for headers in by_value.values():
            assert headers[wire.SOURCE_TOPIC] == events_topic(name)
            assert int(headers[wire.SOURCE_OFFSET]) >= 0 and int(headers[wire.SOURCE_PARTITION]) >= 0
        from keel.store.redis import RedisStore
        store = RedisStore.from_url(env["KEEL_REDIS_URL"], namespace=name)
        assert store.event_ids(tenant.decode()) == sorted(e["id"] for e in good)
        store.close()
        doc = status(folder, env)
        assert doc["dead_letters"]["total"] == doc["dead_letters"]["open"] == len(bad)
        assert doc["dead_letters"]["by_tenant"][""] == 2                                  # broken JSON, binary
        assert sum(doc["dead_letters_counted_by_workers"].values()) == len(bad)
    finally:
        worker.kill()


def generated(path: Path, n: int, tenants: int, seed: int) -> Path:
    """A finance stream in canonical form (recorded_at set, so the embedded build is the oracle), tenants
    interleaved round-robin, each tenant's events in generation order."""
    by_tenant: dict[str, list[dict]] = {}
    for e in finance_events(n, tenants, seed=seed):
        by_tenant.setdefault(e["tenant"], []).append({**e, "recorded_at": e["occurred_at"]})
    queues = list(by_tenant.values())
    out = []
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return write_jsonl(path, out)


def test_kill_9_at_random_moments_then_restart_changes_nothing(env: dict[str, str], tmp_path: Path) -> None:
    folder = unique_cartridge(tmp_path, "finance")
    events = generated(tmp_path / "load.jsonl", 4000, 40, seed=11)
    keel("publish", str(folder), str(events), env=env)
    rng = random.Random(3)
    log = tmp_path / "worker.log"
    kills_under_load = 0
    for _ in range(4):
        before = committed(folder, env)
        if before >= 4000:
            break
        worker = WorkerProcess([folder], env, log, "--batch", "150", "--within", "0.05")
        wait_until(lambda: committed(folder, env) > before or not worker.alive(), 120, "progress",  # noqa: B023
                   interval=0.05, on_timeout=worker.text)
        time.sleep(rng.uniform(0, 0.4))                     # then SIGKILL somewhere in a batch (or between)
        worker.kill()
        kills_under_load += committed(folder, env) < 4000
    assert kills_under_load >= 1
    worker = WorkerProcess([folder], env, log, "--batch", "150")
    try:
        wait_applied(folder, env, 4000, worker)
        expected = embedded_digests(load_cartridge(folder), events)
        assert redis_digests(folder, env, expected) == expected
        assert "Traceback" not in log.read_text()
    finally:
        worker.kill()


def test_sigterm_under_load_writes_and_commits_what_it_planned(env: dict[str, str], tmp_path: Path) -> None:
    folder = unique_cartridge(tmp_path, "finance")
    events = generated(tmp_path / "load.jsonl", 3000, 30, seed=8)
    keel("publish", str(folder), str(events), env=env)
    worker = WorkerProcess([folder], env, tmp_path / "worker.log", "--batch", "100", "--within", "0.05")
    try:
        wait_until(lambda: committed(folder, env) > 0, 120, "progress", interval=0.05, on_timeout=worker.text)
        assert worker.terminate() == 0
    finally:
        worker.kill()
    # Graceful: what Redis holds is exactly what Kafka's committed offsets say (no batch left half done)
    from keel.store.redis import RedisStore
    from keel.wire import partition_for
    name = load_cartridge(folder).name
    doc = status(folder, env)
    store = RedisStore.from_url(env["KEEL_REDIS_URL"], namespace=name)
    try:
        last: dict[int, int] = {}
        for tenant in store.tenants():
            p = partition_for(tenant, len(doc["partitions"]))
            offset = store.applied_offset(tenant, events_topic(name), p)
            if offset is not None:
                last[p] = max(last.get(p, -1), offset)
    finally:
        store.close()
    assert {p["partition"]: p["committed"] for p in doc["partitions"] if p["committed"]} == \
        {p: offset + 1 for p, offset in last.items()}
    assert doc["lag"] > 0                                               # it stopped under load
    worker = WorkerProcess([folder], env, tmp_path / "worker.log", "--batch", "100")
    try:
        wait_applied(folder, env, 3000, worker)
        expected = embedded_digests(load_cartridge(folder), events)
        assert redis_digests(folder, env, expected) == expected
    finally:
        worker.kill()


def test_two_workers_one_killed_the_other_takes_over(env: dict[str, str], tmp_path: Path) -> None:
    folder = unique_cartridge(tmp_path, "finance")
    events = generated(tmp_path / "load.jsonl", 3000, 64, seed=5)
    a = WorkerProcess([folder], env, tmp_path / "a.log", "--batch", "100", "--partitions", "8")
    b = WorkerProcess([folder], env, tmp_path / "b.log", "--batch", "100", "--partitions", "8")
    try:
        def share(w: WorkerProcess) -> list[int] | None:
            lines = [line for line in w.text().splitlines() if "assigned partitions [" in line]
            return json.loads(lines[-1].split("assigned partitions ")[1]) if lines else None
        wait_until(lambda: all(share(w) and len(share(w) or []) < 8 for w in (a, b)), 60,
                   "both workers to share the partitions", on_timeout=lambda: a.text() + b.text())
        keel("publish", str(folder), str(events), env=env)
        wait_until(lambda: committed(folder, env) > 300, 120, "the workers to start applying",
                   on_timeout=lambda: a.text() + b.text())
        a.kill()
        wait_until(lambda: "assigned partitions [0, 1, 2, 3, 4, 5, 6, 7]" in b.text(), 120,   # after the session
                   "b to take a's partitions", on_timeout=b.text)                        # timeout
        wait_applied(folder, env, 3000, b)
        expected = embedded_digests(load_cartridge(folder), events)
        assert redis_digests(folder, env, expected) == expected
    finally:
        a.kill()
        b.kill()
