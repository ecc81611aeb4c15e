"""The cdc tier: a product's database, changed only by ordinary SQL, drives Keel's answers through the real chain:
PostgreSQL (a private server, wal_level=logical) -> the Debezium PostgreSQL connector in Kafka Connect (standalone,
Apache Kafka's own connect-runtime; deploy/local/connect) -> the shared broker -> `keel cdc relay` -> the
cartridge's events topic, whose envelopes build the graph embedded.

The fault scenario writes like the product (tests/support/cdc_load.py) while the relay and Kafka Connect are
killed with SIGKILL, PostgreSQL is restarted and the connector re-snapshots; after each, with the writes done,
every tenant's answers equal the ground truth computed by SQL from the product's tables, a second copy of every
envelope (the re-deliveries) leaves the digest unchanged, and `keel worker` applying the relay's envelopes to
Redis gives every tenant the digest of their embedded build: nothing lost, nothing counted twice."""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from support.cdc import balance_at, keel
from support.cdc_load import HOUSEHOLDS, ProductLoad, truth_problems
from support.debezium import HOUSEHOLD, Connect, logical_postgres, product_database
from support.services import service_env
from support.workers import KeelProcess, WorkerProcess, read_until, unique_cartridge, wait_applied, wait_until

pytestmark = pytest.mark.services


@pytest.fixture
def kafka() -> str:
    return service_env("KEEL_KAFKA_BOOTSTRAP")


@pytest.fixture
def database() -> Iterator[object]:
    with logical_postgres() as server:
        product_database(server.dsn)
        yield server


def cartridge_name(folder: Path) -> str:
    return folder.joinpath("cartridge.yaml").read_text().split("name: ", 1)[1].split("\n", 1)[0]


def topic_count(kafka: str, topic: str) -> int:
    """How many records a topic holds (its partitions' end offsets; 0 before it exists)."""
    import asyncio

    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def go() -> int:
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka, enable_auto_commit=False)
        await consumer.start()
        try:
            parts = consumer.partitions_for_topic(topic)
            if not parts:
                await consumer._client.force_metadata_update()
                parts = consumer.partitions_for_topic(topic) or set()
            ends = await consumer.end_offsets([TopicPartition(topic, p) for p in parts]) if parts else {}
            return sum(ends.values())
        finally:
            await consumer.stop()
    return asyncio.run(go())


def read_all(kafka: str, topic: str) -> list:
    expected = topic_count(kafka, topic)
    return read_until(kafka, topic, until=lambda out: len(out) >= expected, timeout=120)


def events_file(kafka: str, topic: str, path: Path) -> tuple[Path, int]:
    records = read_all(kafka, topic)
    path.write_text("".join(r.value.decode() + "\n" for r in records))
    return path, len(records)


def slot_flushed(dsn: str, slot: str) -> bool:
    """Whether Debezium confirmed every WAL position written so far (its changes are on Kafka)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_logical_emit_message(false, 'keel-test', 'mark')")   # moves the WAL on
        row = conn.execute("SELECT confirmed_flush_lsn >= pg_current_wal_lsn() - 200 FROM pg_replication_slots "
                           "WHERE slot_name = %s", (slot,)).fetchone()
    return bool(row and row[0])


def changes_on_kafka(kafka: str, connect: Connect) -> int:
    return sum(topic_count(kafka, t) for t in connect.topics())


def settled(kafka: str, connect: Connect, dsn: str, timeout: float = 120) -> int:
    """Wait until the change topics stop growing and the slot confirmed what was written; their record count."""
    last = [-1]

    def still() -> bool:
        now = changes_on_kafka(kafka, connect)
        done = now == last[0] and slot_flushed(dsn, connect.slot)
        last[0] = now
        return done
    wait_until(still, timeout, "Debezium to capture every write", interval=2.0, on_timeout=connect.tail)
    return last[0]


def test_ordinary_sql_drives_keel_answers_through_debezium(tmp_path: Path, kafka: str, database) -> None:
    folder = unique_cartridge(tmp_path, HOUSEHOLD, prefix="cdc")
    connect = Connect(tmp_path / "connect", kafka, database.port)
    connect.start()
    try:
        wait_until(lambda: topic_count(kafka, connect.heartbeat_topic) > 0, 120, "Debezium to stream (its first "
                   "heartbeat)", interval=1.0, on_timeout=connect.tail)      # the snapshot (of no rows) is over
        with psycopg.connect(database.dsn, autocommit=True) as conn:
            conn.execute((HOUSEHOLD / "sample.sql").read_text())
        assert settled(kafka, connect, database.dsn) == 11      # 6 inserts, 2 updates, 2 more inserts, 1 delete
        proc = keel("cdc", "relay", str(folder), "--prefix", connect.prefix, "--once",
                    env={"KEEL_KAFKA_BOOTSTRAP": kafka})
        assert proc.returncode == 0, proc.stderr
        assert "11 change(s): relayed 11 event(s), 0 dead letter(s), 0 mapped to nothing" in proc.stderr
        events, count = events_file(kafka, f"keel.{cartridge_name(folder)}.events", tmp_path / "events.jsonl")
        assert count == 11
        env = {"KEEL_KAFKA_BOOTSTRAP": kafka}
        assert balance_at(folder, events, "debt:visa", "2026-09-15", env) == 4200000
        assert balance_at(folder, events, "debt:visa", "2026-10-15", env) == 3870000
        assert balance_at(folder, events, "debt:libranza", "2026-10-15", env) == 12150000   # the corrected row
        context = json.loads(keel("context", str(folder), str(events), "due:libranza-2026-09", "--json",
                                  env=env).stdout)
        assert {f["predicate"]: f["value"] for f in context["facts"]}["status"] == "paid"
        assert truth_problems(database.dsn, folder, events, ["mov-0910-1", "mov-1001-dup"]) == []
    finally:
        connect.stop()


def test_embedded_schemas_and_a_dropped_column(tmp_path: Path, kafka: str, database) -> None:
    """The JSON converter with schemas.enable=true ({schema, payload}) maps alike; a mapped column dropped by the
    product makes its table's next changes dead letters naming the column, and the relay goes on."""
    folder = unique_cartridge(tmp_path, HOUSEHOLD, prefix="cdc")
    name = cartridge_name(folder)
    env = {"KEEL_KAFKA_BOOTSTRAP": kafka}
    connect = Connect(tmp_path / "connect", kafka, database.port, schemas=True)
    connect.start()
    try:
        wait_until(lambda: topic_count(kafka, connect.heartbeat_topic) > 0, 120, "Debezium to stream",
                   interval=1.0, on_timeout=connect.tail)
        with psycopg.connect(database.dsn, autocommit=True) as conn:
            conn.execute((HOUSEHOLD / "sample.sql").read_text())
            conn.execute("ALTER TABLE movements DROP COLUMN description")
            conn.execute("INSERT INTO movements VALUES ('mov-after-drop', 'hogar-demo', 'nomina', '2026-10-02', -1)")
            conn.execute("INSERT INTO debts (household_id, creditor_id, debt_key, product, month, balance_cop, "
                         "rate_ea_pct, installment_cop) VALUES ('hogar-demo', 'banco-andino', 'visa', 'Visa', "
                         "'2026-11-01', 3500000, 29.22, 380000)")
        assert settled(kafka, connect, database.dsn) == 13
        first = read_all(kafka, f"{connect.prefix}.public.debts")[0]
        assert set(json.loads(first.value)) == {"schema", "payload"}
        proc = keel("cdc", "relay", str(folder), "--prefix", connect.prefix, "--once", env=env)
        assert proc.returncode == 0, proc.stderr
        assert "13 change(s): relayed 12 event(s), 1 dead letter(s), 0 mapped to nothing" in proc.stderr
        [letter] = read_all(kafka, f"keel.{name}.dlq")
        reason = dict(letter.headers)["keel.reason"].decode()
        assert reason == "sources.movements: column description is missing from the after row (a schema change?)"
        events, _ = events_file(kafka, f"keel.{name}.events", tmp_path / "events.jsonl")
        assert balance_at(folder, events, "debt:visa", "2026-09-15", env) == 4200000
        assert balance_at(folder, events, "debt:visa", "2026-11-15", env) == 3500000     # after the dead letter
    finally:
        connect.stop()


@pytest.mark.timeout(900)          # five faults, each waited out, on a shared machine
def test_faults_end_with_every_tenant_equal_to_the_sql_truth(tmp_path: Path, kafka: str, database) -> None:
    folder = unique_cartridge(tmp_path, HOUSEHOLD, prefix="cdc")
    name = cartridge_name(folder)
    env = {"KEEL_KAFKA_BOOTSTRAP": kafka}
    load = ProductLoad(database.dsn)
    load.setup()
    load.run(30)                                          # rows before the connector starts: its first snapshot
    connect = Connect(tmp_path / "connect", kafka, database.port)
    relay: KeelProcess | None = None
    logs = tmp_path / "relay.log"

    def start_relay() -> KeelProcess:
        return KeelProcess("keel.cli", ["cdc", "relay", str(folder), "--prefix", connect.prefix,
                                        "--progress", "1"], env, logs)

    def check(stage: str) -> None:
        settled(kafka, connect, database.dsn)
        proc = keel("cdc", "status", str(folder), "--prefix", connect.prefix, "--json", env=env)
        assert proc.returncode == 0, proc.stderr
        wait_until(lambda: json.loads(keel("cdc", "status", str(folder), "--prefix", connect.prefix, "--json",
                                           env=env).stdout)["lag"] == 0, 120, f"the relay to catch up ({stage})",
                   interval=1.0, on_timeout=lambda: logs.read_text()[-3000:])
        events, _ = events_file(kafka, f"keel.{name}.events", tmp_path / f"{stage}.jsonl")
        problems = truth_problems(database.dsn, folder, events, load.movements)
        assert problems == [], f"{stage}: {len(problems)} answer(s) differ from SQL, e.g. {problems[:5]}"

    try:
        connect.start()
        relay = start_relay()
        load.run(60, seed=1)
        check("first")

        # kill -9 of the relay mid-stream: what it produced but had not committed is produced again
        load.add_column()                                     # a table gains a column mid-stream
        late, _ = load.long_transaction()                     # a long transaction, open across the faults (and
        writes = _background(load, 90, seed=2)                # holding a lock no ALTER TABLE could wait out)
        relay.kill()
        relay = start_relay()
        writes.join()
        load.run(30, seed=3)
        check("relay-killed")

        # kill -9 of Kafka Connect mid-stream: it re-delivers what it had not stored offsets for
        writes = _background(load, 90, seed=4)
        connect.kill()
        writes.join()
        connect.start()
        late.commit()                                         # the long transaction commits late
        late.close()
        check("connect-killed")

        # PostgreSQL restarted under the connector
        database.stop()
        database.start()
        load.run(30, seed=5)
        wait_until(lambda: connect.state() == "RUNNING", 120, "the connector after PostgreSQL's restart",
                   interval=1.0, on_timeout=connect.tail)
        load.run(30, seed=6)
        check("postgres-restarted")

        # the connector re-snapshots every row (its offsets and slot lost): the same envelopes, or the same values
        # again. Writes wait until it streams again: a row deleted while no slot exists is in neither the
        # snapshot nor the stream (docs/ingress.md, "Re-snapshots")
        connect.stop()
        connect.drop_slot(database.dsn)
        connect.resnapshot()
        beats = topic_count(kafka, connect.heartbeat_topic)
        connect.start()
        wait_until(lambda: topic_count(kafka, connect.heartbeat_topic) > beats, 120, "Debezium to stream after "
                   "its snapshot", interval=1.0, on_timeout=connect.tail)
        load.run(30, seed=7)
        check("resnapshot")

        # a second copy of every envelope (any re-delivery, again) leaves the graph as it is
        events = tmp_path / "resnapshot.jsonl"
        twice = tmp_path / "twice.jsonl"
        twice.write_text(events.read_text() * 2)
        for tenant in HOUSEHOLDS:
            one = keel("digest", str(folder), "--events", str(events), "--tenant", tenant, env=env)
            two = keel("digest", str(folder), "--events", str(twice), "--tenant", tenant, env=env)
            assert one.returncode == 0 and one.stdout == two.stdout, one.stderr + two.stderr
        dead = topic_count(kafka, f"keel.{name}.dlq")
        assert dead == 0, f"{dead} change(s) dead-lettered: {logs.read_text()[-2000:]}"

        # the workers apply the relay's envelopes to Redis: every tenant's digest equals the embedded build's
        stream = {**env, "KEEL_REDIS_URL": service_env("KEEL_REDIS_URL")}
        worker = WorkerProcess([folder], stream, tmp_path / "worker.log")
        try:
            events, count = events_file(kafka, f"keel.{name}.events", tmp_path / "final.jsonl")
            wait_applied(folder, stream, count, worker)
            for tenant in HOUSEHOLDS:
                from_redis = keel("digest", str(folder), "--tenant", tenant, "--redis", stream["KEEL_REDIS_URL"],
                                  env=stream)
                embedded = keel("digest", str(folder), "--tenant", tenant, "--events", str(events), env=stream)
                assert from_redis.returncode == 0 and from_redis.stdout == embedded.stdout, \
                    from_redis.stderr + embedded.stderr
        finally:
            worker.terminate()
    finally:
        if relay is not None:
            relay.terminate()
        connect.stop()
        connect.drop_slot(database.dsn)


def _background(load: ProductLoad, transactions: int, seed: int):
    import threading
    t = threading.Thread(target=load.run, args=(transactions,), kwargs={"seed": seed}, daemon=True)
    t.start()
    return t
