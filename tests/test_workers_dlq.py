"""Issue 10: dead letters an operator can see and re-drive without backdating knowledge, and a status that
names the partitions' owner and counts open dead letters (so an alert on them can clear)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.workers import (
    WorkerProcess,
    keel,
    produce_raw,
    read_topic,
    services,
    services_env,
    status,
    unique_cartridge,
    wait_applied,
)

from keel.cartridge import load_cartridge
from keel.times import now_micros, parse_time
from keel.wire import REDRIVE_OF, events_topic

pytestmark = [services, pytest.mark.timeout(600)]


def test_list_show_and_redrive_stamp_now_and_close_the_letter(tmp_path: Path) -> None:
    env = services_env()
    folder = unique_cartridge(tmp_path, "finance")
    name = load_cartridge(folder).name
    good = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    tenant = good[0]["tenant"]
    misrouted = {**good[0], "id": "late-1", "payload": {**good[0]["payload"], "balance_cop": 1}}
    records = [(tenant.encode(), json.dumps(e).encode()) for e in good] + \
              [(b"someone-else", json.dumps(misrouted).encode()), (tenant.encode(), b'{"id": "broken"')]
    produce_raw(env, events_topic(name), records)
    worker = WorkerProcess([folder], env, tmp_path / "worker.log")
    try:
        wait_applied(folder, env, len(records), worker)
        doc = status(folder, env)
        [member] = doc["members"]
        assert member["client_id"].startswith("keel-worker-") and sorted(member["partitions"]) == list(range(8))
        assert {p["owner"]["client_id"] for p in doc["partitions"]} == {member["client_id"]}
        listed = [json.loads(line) for line in keel("dlq", "list", str(folder), "--json", env=env).stdout.splitlines()]
        assert len(listed) == 2 and doc["dead_letters"]["open"] == 2
        [keyed] = [x for x in listed if x["event_id"] == "late-1"]
        assert "is not the envelope's tenant" in keyed["reason"] and keyed["writer"] == "worker"
        shown = json.loads(keel("dlq", "show", str(folder), keyed["ref"], env=env).stdout)
        assert json.loads(shown["value"])["id"] == "late-1" and shown["key"] == "someone-else"
        assert keel("dlq", "list", str(folder), "--reason", "NOT THE ENVELOPE", env=env).stdout.count("\n") == 2

        before = now_micros()
        out = keel("dlq", "redrive", str(folder), "--reason", "not the envelope's tenant", env=env)
        assert "redriven 1 dead letter(s)" in out.stdout
        again = keel("dlq", "redrive", str(folder), env=env, check=False)   # the broken one cannot be
        assert again.returncode == 2 and "redriven 0" in again.stdout and "not a JSON envelope" in again.stdout
        wait_applied(folder, env, len(records) + 1, worker)
        from keel.store.redis import RedisStore
        store = RedisStore.from_url(env["KEEL_REDIS_URL"], namespace=name)
        try:
            assert "late-1" in store.event_ids(tenant)
        finally:
            store.close()
        [sent] = [r for r in read_topic(env, events_topic(name), len(records) + 1)
                  if dict(r.headers or ()).get(REDRIVE_OF)]
        assert dict(sent.headers)[REDRIVE_OF].decode().endswith(keyed["ref"]) and sent.key == tenant.encode()
        assert parse_time(json.loads(sent.value)["recorded_at"]) >= before      # knowledge is not backdated
        doc = status(folder, env)
        assert (doc["dead_letters"]["open"], doc["dead_letters"]["redriven"], doc["dead_letters"]["total"]) == (1, 1, 2)
        assert "redriven" in keel("dlq", "list", str(folder), "--all", env=env).stdout
        closed = keel("dlq", "close", str(folder), "--reason", "not valid JSON", env=env).stdout  # fixed by hand
        assert closed.startswith("closed 1 dead letter(s)")
        assert status(folder, env)["dead_letters"]["open"] == 0
        assert keel("dlq", "list", str(folder), env=env).stdout.strip() == "no dead letters match"
    finally:
        worker.kill()


def test_publish_recorded_at_now_does_not_backdate(tmp_path: Path) -> None:
    env = services_env()
    folder = unique_cartridge(tmp_path, "finance")
    name = load_cartridge(folder).name
    line = (folder / "events.jsonl").read_text().splitlines()[0]
    fixed = tmp_path / "fixed.jsonl"
    fixed.write_text(line + "\n")
    before = now_micros()
    keel("publish", str(folder), str(fixed), "--recorded-at", "now", env=env)
    [sent] = read_topic(env, events_topic(name), 1)
    assert parse_time(json.loads(sent.value)["recorded_at"]) >= before > parse_time(json.loads(line)["occurred_at"])
