"""Ingress throughput against real PostgreSQL and Kafka:

* relay: rows/s of `keel outbox relay --once` over a pre-filled outbox (default 100,000 rows);
* webhook: events/s of `keel webhook` with signed 100-event batches from concurrent clients, and the
  p50/p99 request latency.

    export $(deploy/local/services up)
    .venv/bin/python bench/ingress.py                      # full size
    .venv/bin/python bench/ingress.py --rows 10000 --events 10000   # scaled down

Each run uses a fresh schema and a fresh cartridge name (so fresh topics); the schema is dropped after.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import finance_events

from keel.cartridge import load_cartridge
from keel.ingress.auth import sign
from keel.ingress.outbox import OutboxTables, init_outbox
from keel.ingress.producer import KafkaSink
from keel.ingress.relay import RelayOptions, run_relay
from keel.ingress.source import OutboxSource


def fresh_cartridge(workdir: Path) -> Path:
    folder = workdir / "finance"
    shutil.copytree(ROOT / "cartridges" / "finance", folder)
    text = (folder / "cartridge.yaml").read_text()
    (folder / "cartridge.yaml").write_text(text.replace("name: finance", f"name: bench{uuid.uuid4().hex[:8]}", 1))
    return folder


def prefill(dsn: str, tables: OutboxTables, rows: int, tenants: int) -> float:
    started = time.perf_counter()
    with psycopg.connect(dsn) as conn, conn.cursor() as cur:
        with cur.copy(f"COPY {tables} (envelope) FROM STDIN") as copy:
            for e in finance_events(rows, tenants, seed=5):
                copy.write_row((json.dumps(e, separators=(",", ":")),))
        conn.commit()
        conn.execute(f"ANALYZE {tables}")
    return time.perf_counter() - started


def bench_relay(args: argparse.Namespace, folder: Path) -> None:
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    tables = OutboxTables(schema=schema)
    init_outbox(args.dsn, tables)
    try:
        took = prefill(args.dsn, tables, args.rows, args.tenants)
        print(f"outbox pre-filled with {args.rows:,} rows ({args.tenants} tenants) in {took:.1f}s")
        cartridge = load_cartridge(folder)
        lines: list[str] = []
        options = RelayOptions(name=cartridge.name, batch=args.relay_batch, once=True, progress_s=3600)
        started = time.perf_counter()
        stats = asyncio.run(run_relay(cartridge, lambda: OutboxSource(args.dsn, tables),
                                      lambda: KafkaSink(args.kafka), options, lines.append, asyncio.Event()))
        seconds = time.perf_counter() - started
        assert stats.relayed == args.rows, (stats.line(), lines)
        print(f"relay: {stats.relayed:,} rows in {seconds:.2f}s = {stats.relayed / seconds:,.0f} rows/s "
              f"(batch {args.relay_batch}, acks=all, cursor stored per batch; includes connecting and "
              f"creating the topics)")
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def bench_webhook(args: argparse.Namespace, folder: Path, workdir: Path) -> None:
    import aiohttp

    secret = "bench-secret-0123456789"
    tenants = [f"tenant-{t:05d}" for t in range(args.tenants)]
    secrets = workdir / "secrets.yaml"
    secrets.write_text("".join(f"{t}: {secret}\n" for t in tenants))
    secrets.chmod(0o600)
    by_tenant: dict[str, list[dict]] = {}
    for e in finance_events(args.events, args.tenants, seed=9):
        by_tenant.setdefault(e["tenant"], []).append(e)
    bodies: list[tuple[str, bytes]] = []
    for tenant, events in by_tenant.items():
        for i in range(0, len(events), args.batch_size):
            chunk = events[i:i + args.batch_size]
            bodies.append((tenant, "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in chunk).encode()))
    log = workdir / "webhook.log"
    with open(log, "wb") as out:
        server = subprocess.Popen([sys.executable, "-m", "keel.cli", "webhook", str(folder), "--port", "0",
                                   "--secrets", str(secrets), "--kafka", args.kafka, "--max-batch",
                                   str(max(args.batch_size, 1000))], stdout=out, stderr=subprocess.STDOUT,
                                  cwd=ROOT, env={**os.environ})
    try:
        port = wait_port(log, server)
        name = load_cartridge(folder).name
        url = f"http://127.0.0.1:{port}/events/{name}"
        latencies: list[float] = []
        accepted = 0

        async def client(queue: asyncio.Queue[tuple[str, bytes]], session: aiohttp.ClientSession) -> None:
            nonlocal accepted
            while True:
                try:
                    tenant, body = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                headers = {"Content-Type": "application/x-ndjson", "X-Keel-Tenant": tenant,
                           "X-Keel-Signature": sign(secret, body)}
                t0 = time.perf_counter()
                async with session.post(url, data=body, headers=headers) as response:
                    doc = await response.json()
                    if response.status != 202:
                        raise AssertionError(f"{response.status}: {doc}")
                latencies.append((time.perf_counter() - t0) * 1000)
                accepted += len(doc["accepted"])

        async def run_clients(items: list[tuple[str, bytes]]) -> float:
            queue: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()
            for item in items:
                queue.put_nowait(item)
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=args.concurrency)) as session:
                t0 = time.perf_counter()
                await asyncio.gather(*(client(queue, session) for _ in range(args.concurrency)))
                return time.perf_counter() - t0

        asyncio.run(run_clients(bodies[: max(1, len(bodies) // 20)]))      # warm-up: connections, JIT of paths
        latencies.clear()
        accepted = 0
        seconds = asyncio.run(run_clients(bodies))
        latencies.sort()
        p50 = latencies[len(latencies) // 2]
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
        print(f"webhook: {accepted:,} events in {len(bodies):,} requests of {args.batch_size} in {seconds:.2f}s = "
              f"{accepted / seconds:,.0f} events/s ({len(bodies) / seconds:,.0f} requests/s); request latency "
              f"p50 {p50:.1f} ms, p99 {p99:.1f} ms ({args.concurrency} concurrent clients, acks=all before 202)")
    finally:
        server.terminate()
        server.wait(60)


def wait_port(log: Path, server: subprocess.Popen) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", log.read_text(errors="replace"))
        if found:
            return int(found.group(1))
        if server.poll() is not None:
            raise SystemExit(f"keel webhook exited:\n{log.read_text()}")
        time.sleep(0.1)
    raise SystemExit(f"keel webhook did not start:\n{log.read_text()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dsn", default=os.environ.get("KEEL_POSTGRES_DSN"), help="env KEEL_POSTGRES_DSN")
    parser.add_argument("--kafka", default=os.environ.get("KEEL_KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    parser.add_argument("--rows", type=int, default=100_000, help="outbox rows for the relay run")
    parser.add_argument("--relay-batch", type=int, default=2000, help="relay rows per step")
    parser.add_argument("--events", type=int, default=100_000, help="events for the webhook run")
    parser.add_argument("--batch-size", type=int, default=100, help="events per webhook request")
    parser.add_argument("--concurrency", type=int, default=8, help="concurrent webhook clients")
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--skip-relay", action="store_true")
    parser.add_argument("--skip-webhook", action="store_true")
    args = parser.parse_args()
    if not args.skip_relay and not args.dsn:
        raise SystemExit("set KEEL_POSTGRES_DSN or pass --dsn (or --skip-relay)")
    workdir = Path(tempfile.mkdtemp(prefix="keel-bench-ingress-"))
    try:
        folder = fresh_cartridge(workdir)
        print(f"cpus {os.cpu_count()}, kafka {args.kafka}")
        if not args.skip_relay:
            bench_relay(args, folder)
        if not args.skip_webhook:
            bench_webhook(args, folder, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
