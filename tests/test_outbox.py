"""The Postgres outbox and its relay: table creation, row encoding, dead letters, the late-commit trap (a
transaction that took its position early and commits late is never skipped), the xmin wait log, the lock."""
from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.outbox import (
    ROOT,
    committed_rows,
    fresh_schema,
    ids_of,
    ingress_cli,
    ingress_env,
    insert,
    insert_all,
    read_topic,
    sample_envelopes,
    services,
    unique_cartridge,
)

from keel.cartridge import load_cartridge
from keel.errors import UsageError
from keel.ingress.encode import RowEncoder
from keel.ingress.errors import OutboxUnavailable
from keel.ingress.outbox import OutboxTables
from keel.ingress.producer import KafkaSink
from keel.ingress.relay import RelayOptions, run_relay
from keel.ingress.source import Cursor, OutboxRow, OutboxSource
from keel.times import parse_time
from keel.wire import REASON
from keel.wire import keel_headers as headers_of

# ---- without services ---------------------------------------------------------------------------


class FakeSink(KafkaSink):
    def __init__(self, max_record_bytes: int = 1_000_000) -> None:
        super().__init__("unused:9092", max_record_bytes=max_record_bytes)


def row(envelope: dict[str, Any] | str, position: int = 1, created: str = "2026-11-30T10:00:00Z") -> OutboxRow:
    text = envelope if isinstance(envelope, str) else json.dumps(envelope)
    return OutboxRow(xid=700, position=position, created_at_us=parse_time(created), envelope=text)


def test_table_names_are_checked() -> None:
    assert str(OutboxTables()) == "keel_outbox"
    assert str(OutboxTables(table="orders_outbox", schema="shop")) == "shop.orders_outbox"
    for bad in ("Outbox", "x; drop table y", "1abc", ""):
        with pytest.raises(UsageError):
            OutboxTables(table=bad)


def test_cursor_orders_by_xid_then_position() -> None:
    assert Cursor(5, 100) < Cursor(6, 1) < Cursor(6, 2)
    assert str(Cursor(6, 2)) == "6:2"


def test_valid_rows_become_canonical_envelopes_keyed_by_tenant() -> None:
    cartridge = load_cartridge(ROOT / "cartridges" / "finance")
    env = sample_envelopes()[0]
    encoded = RowEncoder(cartridge, FakeSink(), "keel_outbox").encode([row(env)])
    [record] = encoded.records
    assert (encoded.relayed, encoded.dead) == (1, 0)
    assert record.topic == cartridge.topic and record.key == env["tenant"].encode()
    value = json.loads(record.value)
    assert value["recorded_at"] == "2026-11-30T10:00:00Z"          # the row's created_at when absent
    assert value["source"] == "debts" and value["payload"] == env["payload"]
    kept = RowEncoder(cartridge, FakeSink(), "t").encode([row({**env, "recorded_at": "2026-09-02"})]).records[0]
    assert json.loads(kept.value)["recorded_at"] == "2026-09-02T00:00:00Z"


def test_invalid_rows_become_dead_letters_with_reason_and_origin() -> None:
    cartridge = load_cartridge(ROOT / "cartridges" / "finance")
    env = sample_envelopes()[0]
    bad = [row({**env, "type": "debt.vanished"}, 7), row({"id": "x", "tenant": "acme"}, 8), row("[1, 2]", 9),
           row({**env, "tenant": "no spaces allowed"}, 10)]
    encoded = RowEncoder(cartridge, FakeSink(), "shop.keel_outbox").encode(bad)
    assert (encoded.relayed, encoded.dead) == (0, 4)
    first, second, third, fourth = encoded.records
    assert all(r.topic == cartridge.dlq_topic for r in encoded.records)
    assert first.value == bad[0].envelope.encode() and first.key == env["tenant"].encode()
    h = headers_of(first.headers)
    assert "unknown event type 'debt.vanished'" in h[REASON]
    assert h["keel.source"] == "outbox" and h["keel.source.table"] == "shop.keel_outbox"
    assert (h["keel.source.xid"], h["keel.source.position"]) == ("700", "7")
    assert h["keel.event_id"] == env["id"] and h["keel.cartridge"] == cartridge.name
    assert "required field missing" in headers_of(second.headers)[REASON]
    assert "JSON object" in headers_of(third.headers)[REASON] and third.key is None
    assert fourth.key is None and "keel.tenant" not in headers_of(fourth.headers)     # unreadable tenant


def test_an_envelope_too_large_for_kafka_is_dead_lettered_without_its_bytes() -> None:
    cartridge = load_cartridge(ROOT / "cartridges" / "finance")
    env = sample_envelopes()[0]
    big = {**env, "payload": {**env["payload"], "product": "x" * 5000}}
    [letter] = RowEncoder(cartridge, FakeSink(max_record_bytes=2000), "t").encode([row(big)]).records
    h = headers_of(letter.headers)
    assert letter.topic == cartridge.dlq_topic and letter.value is None
    assert "exceeds the Kafka record limit" in h[REASON] and int(h["keel.source.value_omitted"]) > 5000


# ---- with PostgreSQL and Kafka ------------------------------------------------------------------

@pytest.fixture
def env() -> dict[str, str]:
    return ingress_env()


@pytest.fixture
def schema(env: dict[str, str]) -> Iterator[str]:
    yield from fresh_schema(env["KEEL_POSTGRES_DSN"])


def relay_once(folder: Path, schema: str, env: dict[str, str], **options: Any) -> tuple[Any, list[str]]:
    """Run the relay in-process until nothing is relayable; returns its stats and log lines."""
    cartridge = load_cartridge(folder)
    lines: list[str] = []
    opts = RelayOptions(name=options.pop("name", cartridge.name), once=True, **options)
    tables = OutboxTables(schema=schema)
    stats = asyncio.run(run_relay(cartridge, lambda: OutboxSource(env["KEEL_POSTGRES_DSN"], tables),
                                  lambda: KafkaSink(env["KEEL_KAFKA_BOOTSTRAP"]), opts, lines.append,
                                  asyncio.Event()))
    return stats, lines


@services
def test_init_is_idempotent_and_the_table_takes_a_bare_envelope(env: dict[str, str], schema: str) -> None:
    for _ in range(2):
        out = ingress_cli("outbox", "init", "--schema", schema, env=env)
        assert out.stdout.strip() == f"outbox ready: {schema}.keel_outbox and {schema}.keel_outbox_cursor"
    threads = [threading.Thread(target=ingress_cli, args=("outbox", "init", "--schema", schema),
                                kwargs={"env": env}) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with psycopg.connect(env["KEEL_POSTGRES_DSN"], autocommit=True) as conn:
        insert(conn, schema, sample_envelopes()[0])       # every column but envelope has a default
        xid, position, current = conn.execute(
            f"SELECT xid::text::bigint, position, pg_current_xact_id()::text::bigint FROM {schema}.keel_outbox"
        ).fetchone()
        assert position == 1 and 0 < xid < current


@services
def test_init_reports_a_table_of_another_shape(env: dict[str, str], schema: str) -> None:
    with psycopg.connect(env["KEEL_POSTGRES_DSN"], autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.keel_outbox (position bigserial primary key, envelope text)")
    out = ingress_cli("outbox", "init", "--schema", schema, env=env, check=False)
    assert out.returncode == 2
    assert "keel_outbox.envelope: expected jsonb, found text" in out.stderr
    assert "keel_outbox.xid: expected xid8, found no such column" in out.stderr


@services
def test_relay_without_init_says_so(env: dict[str, str], schema: str, tmp_path: Path) -> None:
    out = ingress_cli("outbox", "relay", str(ROOT / "cartridges" / "finance"), "--schema", schema, "--once",
                      env=env, check=False)
    assert out.returncode == 2 and "keel outbox init" in out.stderr


@services
def test_a_late_commit_below_a_visible_row_is_waited_for_not_skipped(env: dict[str, str], schema: str,
                                                                     tmp_path: Path) -> None:
    folder = unique_cartridge(tmp_path)
    cartridge = load_cartridge(folder)
    ingress_cli("outbox", "init", "--schema", schema, env=env)
    early, late = sample_envelopes()[:2]
    dsn = env["KEEL_POSTGRES_DSN"]
    with psycopg.connect(dsn) as slow, psycopg.connect(dsn, autocommit=True) as fast:
        insert(slow, schema, early)                      # takes position 1 and stays open
        insert(fast, schema, late)                       # position 2, committed
        naive = fast.execute(f"SELECT envelope->>'id' FROM {schema}.keel_outbox WHERE position > 0").fetchall()
        assert naive == [(late["id"],)]                  # a position cursor would now move past position 1
        stats, lines = relay_once(folder, schema, env)
        assert stats.relayed == 0                        # the committed row waits for the open transaction
        assert any("1 committed row(s) wait for transactions older than them" in line for line in lines)
        slow.commit()
    stats, _ = relay_once(folder, schema, env)
    assert stats.relayed == 2
    records = read_topic(env["KEEL_KAFKA_BOOTSTRAP"], cartridge.topic, until=lambda r: len(r) >= 2)
    assert ids_of(records) == [early["id"], late["id"]]  # (xid, position) order
    assert {r.key for r in records} == {early["tenant"].encode()}


@services
def test_a_long_open_transaction_is_named_in_the_log(env: dict[str, str], schema: str, tmp_path: Path) -> None:
    folder = unique_cartridge(tmp_path)
    cartridge = load_cartridge(folder)
    ingress_cli("outbox", "init", "--schema", schema, env=env)
    dsn = env["KEEL_POSTGRES_DSN"]
    lines: list[str] = []
    with psycopg.connect(dsn) as blocker, psycopg.connect(dsn, autocommit=True) as fast:
        blocker.execute("SELECT pg_current_xact_id()")       # holds an xid, as a long business transaction does
        pid = blocker.info.backend_pid
        insert(fast, schema, sample_envelopes()[0])

        async def go() -> None:
            stop = asyncio.Event()
            tables = OutboxTables(schema=schema)
            task = asyncio.create_task(run_relay(
                cartridge, lambda: OutboxSource(dsn, tables), lambda: KafkaSink(env["KEEL_KAFKA_BOOTSTRAP"]),
                RelayOptions(name=cartridge.name, xmin_warn_s=0.5, interval_s=0.05), lines.append, stop))
            for _ in range(100):
                if any("waiting on xmin" in line for line in lines):
                    break
                await asyncio.sleep(0.1)
            stop.set()
            await task
        asyncio.run(go())
        blocker.rollback()
    [warning] = [line for line in lines if "waiting on xmin" in line][:1]
    assert f"pid {pid}" in warning and "1 committed row(s)" in warning and "delays the relay" in warning


@services
def test_bad_rows_go_to_the_dead_letter_topic_and_never_block(env: dict[str, str], schema: str,
                                                              tmp_path: Path) -> None:
    folder = unique_cartridge(tmp_path)
    cartridge = load_cartridge(folder)
    ingress_cli("outbox", "init", "--schema", schema, env=env)
    good = sample_envelopes()
    bad = [{**good[0], "id": "bad-type", "type": "debt.vanished"}, {"id": "bad-shape", "tenant": "hogar-demo"},
           {**good[1], "id": "bad-payload", "payload": {**good[1]["payload"], "balance_cop": "a lot"}}]
    insert_all(env["KEEL_POSTGRES_DSN"], schema, good[:3] + bad + good[3:])
    out = ingress_cli("outbox", "relay", str(folder), "--schema", schema, "--once", "--batch", "4", env=env)
    assert f"relayed {len(good)} event(s), 3 dead letter(s)" in out.stderr
    events = read_topic(env["KEEL_KAFKA_BOOTSTRAP"], cartridge.topic, until=lambda r: len(r) >= len(good))
    assert ids_of(events) == [e["id"] for e in good]
    letters = read_topic(env["KEEL_KAFKA_BOOTSTRAP"], cartridge.dlq_topic, until=lambda r: len(r) >= 3)
    by_id = {headers_of(r.headers)["keel.event_id"]: (r, headers_of(r.headers)) for r in letters}
    assert sorted(by_id) == ["bad-payload", "bad-shape", "bad-type"]
    assert json.loads(by_id["bad-type"][0].value) == bad[0]       # the row's envelope (jsonb text form)
    assert "payload.balance_cop: expected number" in by_id["bad-payload"][1][REASON]
    with psycopg.connect(env["KEEL_POSTGRES_DSN"]) as conn:
        assert conn.execute(f"SELECT relayed, dead_lettered FROM {schema}.keel_outbox_cursor").fetchone() == \
            (len(good), 3)
    again = ingress_cli("outbox", "relay", str(folder), "--schema", schema, "--once", env=env)
    assert "relayed 0 event(s), 0 dead letter(s)" in again.stderr       # the cursor was stored


@services
def test_one_relay_per_name_runs_at_a_time(env: dict[str, str], schema: str, tmp_path: Path) -> None:
    folder = unique_cartridge(tmp_path)
    ingress_cli("outbox", "init", "--schema", schema, env=env)
    name = load_cartridge(folder).name
    with psycopg.connect(env["KEEL_POSTGRES_DSN"], autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))",
                       (f"keel-outbox-relay:{schema}.keel_outbox:{name}",))
        out = ingress_cli("outbox", "relay", str(folder), "--schema", schema, "--once", env=env, check=False)
        assert out.returncode == 1 and f"another relay named {name!r} is running" in out.stderr
        other = ingress_cli("outbox", "relay", str(folder), "--schema", schema, "--once", "--name", "second",
                            env=env)
        assert "as 'second'" in other.stderr


@services
def test_prune_deletes_only_what_every_relay_has_relayed(env: dict[str, str], schema: str, tmp_path: Path) -> None:
    folder = unique_cartridge(tmp_path)
    ingress_cli("outbox", "init", "--schema", schema, env=env)
    envelopes = sample_envelopes()
    insert_all(env["KEEL_POSTGRES_DSN"], schema, envelopes)
    ingress_cli("outbox", "relay", str(folder), "--schema", schema, "--once", "--name", "a", "--batch", "5", env=env)
    ingress_cli("outbox", "relay", str(folder), "--schema", schema, "--once", "--name", "b", "--batch", "5",
                "--prune", env=env)
    assert len(committed_rows(env["KEEL_POSTGRES_DSN"], schema)) == 0       # both relays are past every row
    insert_all(env["KEEL_POSTGRES_DSN"], schema, [{**e, "id": e["id"] + "-2"} for e in envelopes[:3]])
    ingress_cli("outbox", "relay", str(folder), "--schema", schema, "--once", "--name", "b", "--prune", env=env)
    assert len(committed_rows(env["KEEL_POSTGRES_DSN"], schema)) == 3       # relay a has not relayed them yet


class CrashAfterAck(OutboxSource):
    """A relay that dies after Kafka acknowledged a batch and before its cursor is stored."""

    async def store_cursor(self, relay: str, cursor: Cursor, relayed: int, dead_lettered: int) -> None:
        raise OutboxUnavailable("injected: connection lost before the cursor write")


@services
def test_a_crash_between_the_ack_and_the_cursor_write_resends_never_loses(env: dict[str, str], schema: str,
                                                                          tmp_path: Path) -> None:
    folder = unique_cartridge(tmp_path)
    cartridge = load_cartridge(folder)
    ingress_cli("outbox", "init", "--schema", schema, env=env)
    envelopes = sample_envelopes()
    insert_all(env["KEEL_POSTGRES_DSN"], schema, envelopes)
    tables = OutboxTables(schema=schema)
    with pytest.raises(OutboxUnavailable):
        asyncio.run(run_relay(cartridge, lambda: CrashAfterAck(env["KEEL_POSTGRES_DSN"], tables),
                              lambda: KafkaSink(env["KEEL_KAFKA_BOOTSTRAP"]),
                              RelayOptions(name=cartridge.name, batch=5, once=True), lambda line: None,
                              asyncio.Event()))
    stats, _ = relay_once(folder, schema, env, batch=5)
    assert stats.relayed == len(envelopes)                      # from the start again: the cursor was not stored
    all_ids = [e["id"] for e in envelopes]
    records = read_topic(env["KEEL_KAFKA_BOOTSTRAP"], cartridge.topic,
                         until=lambda r: len(r) > len(all_ids) and ids_of(r)[-len(all_ids):] == all_ids)
    ids = ids_of(records)
    sent_before = len(ids) - len(all_ids)        # the crashed run's steps: the first, and the one overlapping it
    assert sent_before in (5, 10) and ids == all_ids[:sent_before] + all_ids
    assert records[0].value == records[sent_before].value      # a byte-identical duplicate
