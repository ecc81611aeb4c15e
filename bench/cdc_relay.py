"""`keel cdc relay` against `keel outbox relay` on the same rows: changes/s and CPU per change.

The rows are the household sample's debt snapshots (examples/household), N of them over T tenants. The cdc side
gets them as Debezium's PostgreSQL connector writes them (the JSON converter without schemas, numerics as text,
dates as days; the shape tests/test_cdc_debezium.py captures from the real connector), pre-filled on a fresh
change topic; the outbox side gets the very envelopes the mapping makes of them, pre-filled in a fresh outbox
table. Each relay then runs in this process with `once` until its input is relayed to a fresh events topic:
the wall time and this process's CPU time (time.process_time: the relay's decoding, mapping, checking and
producing; the broker's and PostgreSQL's CPU are not counted) are printed per change.

    eval "$(deploy/local/services up)"
    .venv/bin/python bench/cdc_relay.py                    # 100,000 rows
    .venv/bin/python bench/cdc_relay.py --rows 20000       # scaled down
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from keel.cartridge import load_cartridge
from keel.ingress.cdc import CdcOptions, ChangeEncoder, ChangeSource, relay_changes
from keel.ingress.outbox import OutboxTables, init_outbox
from keel.ingress.producer import KafkaSink
from keel.ingress.relay import RelayOptions, run_relay
from keel.ingress.source import OutboxSource

EPOCH_DAY_2026 = 20454          # 2026-01-01 as days since 1970-01-01


def fresh_cartridge(workdir: Path) -> Path:
    folder = workdir / "household"
    folder.mkdir(parents=True)
    text = (ROOT / "examples" / "household" / "cartridge.yaml").read_text()
    (folder / "cartridge.yaml").write_text(text.replace("name: household", f"name: bench{uuid.uuid4().hex[:8]}", 1))
    return folder


def changes(rows: int, tenants: int, prefix: str) -> list[tuple[bytes, bytes]]:
    """(key, value) of N Debezium insert events of `debts`, as the connector writes them."""
    out = []
    ts = 1796421095045
    for i in range(rows):
        after = {"id": i + 1, "household_id": f"hogar-{i % tenants:04d}", "creditor_id": "banco-andino",
                 "account_id": "nomina", "debt_key": f"debt-{(i // tenants) % 4}", "product": "Visa",
                 "month": EPOCH_DAY_2026 + 30 * (i // (tenants * 4)), "balance_cop": f"{1000000 + 37 * i}.00",
                 "rate_ea_pct": "24.50", "installment_cop": "380000.00"}
        lsn = 22_000_000 + 100 * i
        source = {"version": "3.6.1.Final", "connector": "postgresql", "name": prefix, "ts_ms": ts + i,
                  "snapshot": "false", "db": "app", "sequence": json.dumps([str(lsn - 40), str(lsn)]),
                  "ts_us": (ts + i) * 1000, "ts_ns": (ts + i) * 1_000_000, "schema": "public", "table": "debts",
                  "txId": 1000 + i, "lsn": lsn, "xmin": None, "origin": None, "origin_lsn": None}
        value = {"before": None, "after": after, "source": source, "transaction": None, "op": "c",
                 "ts_ms": ts + i + 3, "ts_us": (ts + i + 3) * 1000, "ts_ns": (ts + i + 3) * 1_000_000}
        out.append((json.dumps({"id": i + 1}, separators=(",", ":")).encode(),
                    json.dumps(value, separators=(",", ":")).encode()))
    return out


async def prefill_topic(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    from aiokafka import AIOKafkaProducer
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=8, replication_factor=1)])
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20, max_batch_size=512 * 1024)
    await producer.start()
    try:
        futures = [await producer.send(topic, value=v, key=k) for k, v in records]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


def measure(run) -> tuple[float, float, object]:
    wall, cpu = time.perf_counter(), time.process_time()
    result = run()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def line(name: str, n: int, wall: float, cpu: float) -> str:
    return (f"{name:<14} {n:>9,} changes in {wall:6.2f}s = {n / wall:>9,.0f} changes/s; "
            f"CPU {cpu:6.2f}s = {cpu / n * 1e6:6.1f} µs per change")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", default=os.environ.get("KEEL_POSTGRES_DSN"), help="env KEEL_POSTGRES_DSN")
    parser.add_argument("--kafka", default=os.environ.get("KEEL_KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--batch", type=int, default=2000, help="rows (changes) per relay step, both relays")
    args = parser.parse_args()
    if not args.dsn:
        raise SystemExit("set KEEL_POSTGRES_DSN or pass --dsn (the outbox relay's database)")
    workdir = Path(tempfile.mkdtemp(prefix="keel-bench-cdc-"))
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    try:
        prefix = f"bench{uuid.uuid4().hex[:8]}"
        records = changes(args.rows, args.tenants, prefix)
        print(f"cpus {os.cpu_count()}, kafka {args.kafka}; {args.rows:,} debt snapshot rows over {args.tenants} "
              f"tenants, batch {args.batch}")

        cdc = load_cartridge(fresh_cartridge(workdir / "a"))
        asyncio.run(prefill_topic(args.kafka, f"{prefix}.public.debts", records))
        options = CdcOptions(prefix=prefix, name=cdc.name, batch=args.batch, progress_s=3600, once=True)
        log: list[str] = []
        wall, cpu, stats = measure(lambda: asyncio.run(relay_changes(
            cdc, ChangeSource(args.kafka, [f"{prefix}.public.debts"], options.group), KafkaSink(args.kafka),
            options, log.append, asyncio.Event())))
        assert stats.relayed == args.rows, (stats.line(), log)
        print(line("keel cdc", args.rows, wall, cpu))

        outbox = load_cartridge(fresh_cartridge(workdir / "b"))
        encoder = ChangeEncoder(outbox, None)
        tables = OutboxTables(schema=schema)
        init_outbox(args.dsn, tables)
        with psycopg.connect(args.dsn) as conn, conn.cursor() as cur:
            with cur.copy(f"COPY {tables} (envelope) FROM STDIN") as copy:
                for _, value in records:
                    [envelope], _ = encoder.explain(value)
                    copy.write_row((json.dumps(envelope, separators=(",", ":")),))
            conn.commit()
            conn.execute(f"ANALYZE {tables}")
        relay = RelayOptions(name=outbox.name, batch=args.batch, once=True, progress_s=3600)
        wall, cpu, stats = measure(lambda: asyncio.run(run_relay(
            outbox, lambda: OutboxSource(args.dsn, tables), lambda: KafkaSink(args.kafka), relay, log.append,
            asyncio.Event())))
        assert stats.relayed == args.rows, (stats.line(), log)
        print(line("outbox relay", args.rows, wall, cpu))
        print("(both include connecting and creating the events topics; the same envelopes on both topics)")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if args.dsn:
            with psycopg.connect(args.dsn, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


if __name__ == "__main__":
    main()
