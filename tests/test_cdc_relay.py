"""`keel cdc relay` against the real Kafka broker, fed Debezium-shaped change records made by hand (the tier with
PostgreSQL, Kafka Connect and the Debezium connector is tests/test_cdc_debezium.py): the changes become the
cartridge's envelopes, a change read twice becomes the same envelope, one that cannot map is dead-lettered with
its position and the relay goes on, and `keel cdc status` shows its position and lag."""
from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from support.cdc import (
    HOUSEHOLD,
    balance_at,
    change,
    debt_row,
    digest,
    envelopes_file,
    keel,
    produce,
    sample_changes,
)
from support.services import service_env
from support.workers import read_until, unique_cartridge

from keel.wire import keel_headers

pytestmark = pytest.mark.services


@pytest.fixture
def env() -> dict[str, str]:
    return {"KEEL_KAFKA_BOOTSTRAP": service_env("KEEL_KAFKA_BOOTSTRAP")}


def relay_once(folder: Path, prefix: str, env: dict[str, str], *extra: str) -> str:
    proc = keel("cdc", "relay", str(folder), "--prefix", prefix, "--once", *extra, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


def read_all(env: dict[str, str], topic: str, expected: int) -> list:
    return read_until(env["KEEL_KAFKA_BOOTSTRAP"], topic, until=lambda out: len(out) >= expected, timeout=60)


def test_changes_become_envelopes_once_whatever_is_read_twice(tmp_path: Path, env: dict[str, str]) -> None:
    folder = unique_cartridge(tmp_path, HOUSEHOLD, prefix="cdc")
    name = folder.joinpath("cartridge.yaml").read_text().split("name: ", 1)[1].split("\n", 1)[0]
    prefix = f"cdc{uuid.uuid4().hex[:10]}"
    records = [(f"{prefix}.public.{table}", key, value) for table, key, value in sample_changes()]
    produce(env["KEEL_KAFKA_BOOTSTRAP"], records)
    log = relay_once(folder, prefix, env)
    assert "11 change(s): relayed 11 event(s), 0 dead letter(s), 0 mapped to nothing" in log

    first = read_all(env, f"keel.{name}.events", 11)
    assert len(first) == 11
    envelopes = [json.loads(r.value) for r in first]
    assert {r.key for r in first} == {b"hogar-demo"}
    assert sorted(e["type"] for e in envelopes).count("keel.retracted") == 1
    events = envelopes_file(first, tmp_path / "first.jsonl")
    assert balance_at(folder, events, "debt:visa", "2026-09-15", env) == 4200000
    assert balance_at(folder, events, "debt:libranza", "2026-10-15", env) == 12150000    # the corrected row

    # the relay again: its offsets are committed, nothing is produced twice
    assert "0 change(s)" in relay_once(folder, prefix, env)
    # Connect re-delivering every change (a crash before its offsets were stored): the same envelopes again
    produce(env["KEEL_KAFKA_BOOTSTRAP"], records)
    assert "11 change(s): relayed 11 event(s)" in relay_once(folder, prefix, env)
    both = read_all(env, f"keel.{name}.events", 22)
    assert len(both) == 22
    assert [r.value for r in both[11:]] == [r.value for r in first]       # byte for byte
    twice = envelopes_file(both, tmp_path / "both.jsonl")
    assert digest(folder, twice, env) == digest(folder, events, env)      # dedupe: counted once


def test_a_change_that_cannot_map_is_dead_lettered_and_the_relay_goes_on(tmp_path: Path,
                                                                       env: dict[str, str]) -> None:
    folder = unique_cartridge(tmp_path, HOUSEHOLD, prefix="cdc")
    name = folder.joinpath("cartridge.yaml").read_text().split("name: ", 1)[1].split("\n", 1)[0]
    prefix = f"cdc{uuid.uuid4().hex[:10]}"
    topic = f"{prefix}.public.debts"
    bad = debt_row(9, "visa", "2026-11-01", 0)
    bad["balance_cop"] = "not-a-number"
    produce(env["KEEL_KAFKA_BOOTSTRAP"], [
        (topic, b'{"id":9}', change("debts", "c", None, bad, lsn=900, tx=90)),
        (topic, b'{"id":9}', None),                                      # a tombstone
        (topic, b'{"id":9}', b"{not json"),
        (topic, b'{"id":1}', change("debts", "c", None, debt_row(1, "visa", "2026-09-01", 4200000), lsn=100,
                                    schema=True)),
    ])
    log = relay_once(folder, prefix, env)
    assert "4 change(s): relayed 1 event(s), 2 dead letter(s), 1 mapped to nothing" in log
    [event] = read_all(env, f"keel.{name}.events", 1)
    assert json.loads(event.value)["subject"] == "debt:visa"
    letters = read_all(env, f"keel.{name}.dlq", 2)
    assert len(letters) == 2
    letters.sort(key=lambda r: keel_headers(r.headers)["keel.source.offset"])     # partitions: any order
    first = keel_headers(letters[0].headers)
    assert first["keel.source"] == "cdc" and first["keel.source.lsn"] == "900" and first["keel.source.tx_id"] == "90"
    assert first["keel.source.topic"] == topic and first["keel.source.offset"] == "0"
    assert first["keel.reason"].startswith("sources.debts: column balance_cop: a text")
    assert letters[0].value == b""                  # the change (clear row values) stays on its own topic
    second = keel_headers(letters[1].headers)
    assert second["keel.reason"].startswith("not a Debezium change event: not JSON") and second["keel.source.offset"] == "2"

    status = keel("cdc", "status", str(folder), "--prefix", prefix, "--json", env=env)
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    assert doc["lag"] == 0 and doc["group"] == f"keel-cdc-{name}"
    assert sorted(doc["missing_topics"]) == [f"{prefix}.public.dues", f"{prefix}.public.movements"]
    assert sum(p["end"] for p in doc["partitions"]) == 4
    produce(env["KEEL_KAFKA_BOOTSTRAP"], [(topic, b'{"id":1}', change("debts", "c", None,
                                                                       debt_row(1, "visa", "2026-09-01", 1), lsn=1))])
    doc = json.loads(keel("cdc", "status", str(folder), "--prefix", prefix, "--json", env=env).stdout)
    assert doc["lag"] == 1


def test_the_relay_serves_health_readiness_and_metrics(tmp_path: Path, env: dict[str, str]) -> None:
    from support.mcp_sessions import free_port
    from support.probes import get, samples
    from support.workers import KeelProcess, wait_until

    folder = unique_cartridge(tmp_path, HOUSEHOLD, prefix="cdc")
    name = folder.joinpath("cartridge.yaml").read_text().split("name: ", 1)[1].split("\n", 1)[0]
    prefix = f"cdc{uuid.uuid4().hex[:10]}"
    produce(env["KEEL_KAFKA_BOOTSTRAP"], [(f"{prefix}.public.{t}", k, v) for t, k, v in sample_changes()])
    port = free_port()
    relay = KeelProcess("keel.cli", ["cdc", "relay", str(folder), "--prefix", prefix, "--metrics-port", str(port)],
                        env, tmp_path / "relay.log")
    try:
        def caught_up() -> bool:
            proc = keel("cdc", "status", str(folder), "--prefix", prefix, "--json", env=env)
            return proc.returncode == 0 and json.loads(proc.stdout)["lag"] == 0 and \
                sum(p["end"] for p in json.loads(proc.stdout)["partitions"]) == 11
        wait_until(caught_up, 120, "the relay to commit every change", on_timeout=relay.text)
        wait_until(lambda: get(f"http://127.0.0.1:{port}/readyz")[0] == 200, 60, "relay ready")
        status = keel("status", str(folder), "--json", env=env)      # `keel status` shows the relay's position
        cdc = json.loads(status.stdout)["cdc"]
        assert cdc["group"] == f"keel-cdc-{name}" and cdc["lag"] == 0
        assert sum(p["end"] for p in cdc["partitions"]) == 11
        assert f"cdc relay keel-cdc-{name}: lag 0 change(s)" in keel("status", str(folder), env=env).stdout
        got = samples(get(f"http://127.0.0.1:{port}/metrics")[1])
        assert got[("keel_cdc_changes_total", (("cartridge", name),))] == 11
        assert got[("keel_cdc_events_relayed_total", (("cartridge", name),))] == 11
        assert got[("keel_cdc_dead_lettered_total", (("cartridge", name),))] == 0
        assert get(f"http://127.0.0.1:{port}/healthz")[0] == 200
        assert relay.terminate() == 0
        assert " INFO keel.cdc: " in relay.text() and "11 change(s): relayed 11 event(s)" in relay.text()
    finally:
        if relay.alive():
            relay.kill()
