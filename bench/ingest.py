"""Ingest benchmark: Kafka → `keel worker` → Redis, against the plain-consumer ceiling of the same topic.

    .venv/bin/python bench/ingest.py [--events 200000] [--tenants 1000] [--partitions 8] [--batch 5000]
                                     [--order interleaved|grouped] [--workers 1] [--faust-probe] [--keep]
    (quick run: --events 20000 --tenants 100)

Needs KEEL_KAFKA_BOOTSTRAP and KEEL_REDIS_URL (or --kafka/--redis), e.g. from `deploy/local/services up`.
Steps, in one run, on a fresh cartridge name (fresh topics and Redis namespace):
  1. generate finance-shaped events over the tenants and `keel publish` them (8-partition topic);
  2. (a) ceiling: a plain aiokafka consumer reads the whole topic without processing;
  3. (b) a `keel worker` process starts on the published topic; its rate is the records over the time
     from the moment it holds its partitions (ready) to lag 0, i.e. everything published and applied
     (the wall time from process start, which adds Python/faust start-up and the group join, is printed too);
  4. bytes per fact version: Redis INFO used_memory delta over the fact versions of the embedded build
     of the same events (and per timeline version of any kind);
  optionally (--faust-probe) the rate of a bare faust agent (`stream.noack_take`, acks only) on the same
  topic: the reason the worker consumes with aiokafka inside a faust service rather than a faust agent.
Goals: worker >= 15,000 events/s, and >= 0.3 of the ceiling.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from common import finance_events

from keel.cartridge import load_cartridge
from keel.config import resolve
from keel.embedded import build_embedded
from keel.kafka import TopicSpec, admin_client, bootstrap_list
from keel.wire import dlq_topic, events_topic, group_id
from workers.publish import prepare, publish_prepared

GOAL_RATE = 15_000
GOAL_RATIO = 0.3


def write_events(path: Path, n: int, tenants: int, order: str) -> None:
    """finance_events, interleaved round-robin over tenants (a realistic log) or grouped by tenant."""
    by_tenant: dict[str, list[dict]] = {}
    for e in finance_events(n, tenants):
        by_tenant.setdefault(e["tenant"], []).append(e)
    if order == "grouped":
        out = [e for events in by_tenant.values() for e in events]
    else:
        queues = [list(reversed(v)) for v in by_tenant.values()]
        out = []
        while queues:
            queues = [q for q in queues if q]
            out += [q.pop() for q in queues]
    with path.open("w") as f:
        for e in out:
            f.write(json.dumps(e, separators=(",", ":")) + "\n")


def cartridge_copy(base: Path) -> Path:
    folder = base / "finance"
    folder.mkdir()
    for f in (ROOT / "cartridges" / "finance").iterdir():
        if f.is_file():
            (folder / f.name).write_bytes(f.read_bytes())
    name = f"bench{uuid.uuid4().hex[:8]}"
    text = (folder / "cartridge.yaml").read_text().replace("name: finance", f"name: {name}", 1)
    (folder / "cartridge.yaml").write_text(text)
    return folder


async def plain_consumer_rate(bootstrap: str, topic: str, total: int) -> float:
    """(a) the ceiling: records/s of a plain consumer reading every partition from the start, no processing."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap_list(bootstrap), enable_auto_commit=False,
                                max_partition_fetch_bytes=4 << 20, fetch_max_bytes=64 << 20)
    await consumer.start()
    try:
        parts = consumer.partitions_for_topic(topic) or set()
        if not parts:
            await consumer._client.force_metadata_update()
            parts = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        n = 0
        started = time.perf_counter()
        while n < total:
            fetched = await consumer.getmany(timeout_ms=1000, max_records=10_000)
            n += sum(len(r) for r in fetched.values())
        return n / (time.perf_counter() - started)
    finally:
        await consumer.stop()


def redis_used_memory(url: str) -> int:
    import redis
    client = redis.Redis.from_url(url)
    try:
        return int(client.info("memory")["used_memory"])
    finally:
        client.close()


def version_counts(folder: Path, events: Path) -> tuple[int, int]:
    """(fact versions, timeline versions of any kind) of the embedded build of the same events."""
    with open(os.devnull, "w") as quiet:
        projector, report = build_embedded(load_cartridge(folder), events, stream=quiet)
    facts = versions = 0
    for tenant in report.tenants:
        for key, assertions in projector.store.dump(tenant):
            versions += len(assertions)
            if key[0] == "f":
                facts += len(assertions)
    return facts, versions


def redis_cpu_seconds(url: str) -> float:
    """User + system CPU seconds of the Redis server so far (INFO cpu)."""
    import redis
    client = redis.Redis.from_url(url)
    try:
        info = client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    finally:
        client.close()


def cpu_seconds(pids: list[int]) -> float | None:
    """User + system CPU seconds the processes used so far (Linux /proc; None elsewhere)."""
    try:
        ticks = 0
        for pid in pids:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])      # utime, stime
        return ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


async def wait_applied(bootstrap: str, group: str, total: int, procs: list[subprocess.Popen], logs: list[Path],
                       ready: float | None, redis_url: str) -> tuple[float, float | None, tuple[Any, ...]]:
    """Poll the group's committed offsets until they add up to `total` (the topic is fresh: its end offsets
    add up to what was published); returns (done, ready, (workers' CPU seconds, Redis CPU seconds) at ready
    and at done). One admin client for the whole wait: a client per poll cost the benchmark process a third
    of a core on the workers' machine."""
    pids = [p.pid for p in procs]
    at_ready = None if ready is None else (cpu_seconds(pids), redis_cpu_seconds(redis_url))
    async with admin_client(bootstrap) as admin:
        while True:
            for proc, log in zip(procs, logs):
                if proc.poll() is not None:
                    raise SystemExit(f"worker exited with {proc.returncode}; see {log}")
            if ready is None and "assigned partitions [" in logs[0].read_text(errors="replace"):
                ready = time.perf_counter()
                at_ready = (cpu_seconds(pids), redis_cpu_seconds(redis_url))
            try:
                committed = await admin.list_consumer_group_offsets(group)
            except KafkaError:          # e.g. the group coordinator is not there yet
                committed = {}
            if sum(m.offset for m in committed.values() if m.offset > 0) >= total:
                return time.perf_counter(), ready, (at_ready, (cpu_seconds(pids), redis_cpu_seconds(redis_url)))
            await asyncio.sleep(0.2)


def run_workers(folder: Path, env: dict[str, str], total: int, batch: int,
                logs: list[Path]) -> tuple[float, float, float | None, float]:
    """(b) start `keel worker` process(es) in one group; returns (seconds from ready to lag 0, seconds from
    process start to lag 0, the workers' and the Redis server's CPU seconds from ready to lag 0). With
    several processes "ready" is the start (they rebalance while working)."""
    settings = resolve({"kafka": env["KEEL_KAFKA_BOOTSTRAP"], "redis": env["KEEL_REDIS_URL"]})
    name = load_cartridge(folder).name
    procs = []
    started = time.perf_counter()
    for log in logs:
        with log.open("wb") as out:
            procs.append(subprocess.Popen([sys.executable, "-m", "keel.cli", "worker", str(folder), "--quiet",
                                           "--batch", str(batch)], stdout=out, stderr=subprocess.STDOUT,
                                          env={**os.environ, **env}, cwd=ROOT))
    try:
        done, ready, cpu = asyncio.run(wait_applied(settings.kafka_bootstrap, group_id(name), total, procs, logs,
                                                    None if len(procs) == 1 else started, env["KEEL_REDIS_URL"]))
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:       # the figures are taken; say so and do not leave it running
                print(f"worker {proc.pid} did not stop within 60 s of SIGTERM; killed", file=sys.stderr)
                proc.kill()
                proc.wait()
    (workers_ready, redis_ready), (workers_done, redis_done) = cpu
    workers = None if workers_ready is None or workers_done is None else workers_done - workers_ready
    return done - (ready or started), done - started, workers, redis_done - redis_ready


FAUST_PROBE = textwrap.dedent('''
    import os, sys, time
    import faust
    total = int(sys.argv[3])
    app = faust.App("keel-bench-probe-" + sys.argv[2], broker="kafka://" + sys.argv[1], web_enabled=False,
                    value_serializer="raw", key_serializer="raw", consumer_auto_offset_reset="earliest",
                    datadir=sys.argv[4], stream_buffer_maxsize=65536, broker_max_poll_records=5000)
    topic = app.topic(sys.argv[2], value_type=bytes, key_type=bytes)
    seen = {"n": 0, "t": None}

    @app.agent(topic, concurrency=1)
    async def probe(stream):
        async for events in stream.noack_take(5000, within=0.2):
            seen["t"] = seen["t"] or time.perf_counter()
            for e in events:
                await stream.ack(e)
            seen["n"] += len(events)
            if seen["n"] >= total:
                os.write(1, f"RATE {seen['n'] / (time.perf_counter() - seen['t']):.0f}\\n".encode())
                os._exit(0)

    sys.argv = [sys.argv[0], "worker", "-l", "error"]
    app.main()
''')


def faust_probe_rate(bootstrap: str, topic: str, total: int, tmp: Path) -> float | None:
    script = tmp / "probe.py"
    script.write_text(FAUST_PROBE)
    proc = subprocess.run([sys.executable, str(script), bootstrap_list(bootstrap)[0], topic, str(total),
                           str(tmp / "faust-data")], capture_output=True, text=True, timeout=900, check=False)
    m = re.search(r"RATE (\d+)", proc.stdout)
    return float(m.group(1)) if m else None


async def cleanup(bootstrap: str, url: str, folder: Path, tenants: list[str]) -> None:
    from keel.store.redis import RedisStore
    name = load_cartridge(folder).name
    store = RedisStore.from_url(url, namespace=name)
    try:
        for t in tenants:
            store.drop_tenant(t)
        store.client.delete(f"keel:{{{name}}}:dlq:seen", f"keel:{{{name}}}:dlq:count")
    finally:
        store.close()
    async with admin_client(bootstrap) as admin:
        await admin.delete_topics([events_topic(name), dlq_topic(name)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--tenants", type=int, default=1000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--batch", type=int, default=5000, help="worker --batch")
    ap.add_argument("--workers", type=int, default=1, help="worker processes in the group (default 1: the goal "
                    "is per process)")
    ap.add_argument("--order", choices=("interleaved", "grouped"), default="interleaved",
                    help="tenants interleaved in the log (default), or each tenant's events together")
    ap.add_argument("--kafka", default=os.environ.get("KEEL_KAFKA_BOOTSTRAP"))
    ap.add_argument("--redis", default=os.environ.get("KEEL_REDIS_URL"))
    ap.add_argument("--faust-probe", action="store_true", help="also measure a bare faust agent on the topic")
    ap.add_argument("--keep", action="store_true", help="keep the topics and the Redis namespace")
    args = ap.parse_args()
    if not args.kafka or not args.redis:
        raise SystemExit("set KEEL_KAFKA_BOOTSTRAP and KEEL_REDIS_URL (eval \"$(deploy/local/services up)\") "
                         "or pass --kafka and --redis")
    env = {"KEEL_KAFKA_BOOTSTRAP": args.kafka, "KEEL_REDIS_URL": args.redis}
    with tempfile.TemporaryDirectory(prefix="keel-bench-") as tmp_name:
        tmp = Path(tmp_name)
        folder = cartridge_copy(tmp)
        cartridge = load_cartridge(folder)
        topic = events_topic(cartridge.name)
        events = tmp / "events.jsonl"
        write_events(events, args.events, args.tenants, args.order)
        prepared = prepare(cartridge, events)
        t0 = time.perf_counter()
        report = asyncio.run(publish_prepared(cartridge, prepared, args.kafka, TopicSpec(args.partitions)))
        print(f"published {report.sent:,} events of {report.tenants} tenants to {topic} ({report.partitions} "
              f"partitions, {args.order}) in {time.perf_counter() - t0:.1f}s")
        ceiling = asyncio.run(plain_consumer_rate(args.kafka, topic, report.sent))
        print(f"(a) ceiling, plain aiokafka consumer, no processing: {ceiling:,.0f} events/s")
        before = redis_used_memory(args.redis)
        logs = [tmp / f"worker{i}.log" for i in range(args.workers)]
        ready_s, wall_s, cpu_s, redis_s = run_workers(folder, env, report.sent, args.batch, logs)
        rate = report.sent / ready_s
        after = redis_used_memory(args.redis)
        who = "keel worker" if args.workers == 1 else f"{args.workers} keel worker processes (from start)"
        print(f"(b) {who}, ready to lag 0: {report.sent:,} events in {ready_s:.1f}s = {rate:,.0f} events/s "
              f"(goal >= {GOAL_RATE:,}: {'met' if rate >= GOAL_RATE else 'NOT met'}); "
              f"from process start: {wall_s:.1f}s = {report.sent / wall_s:,.0f} events/s")
        if cpu_s is not None:
            print(f"worker CPU, ready to lag 0: {cpu_s:.1f}s = {cpu_s / report.sent * 1e6:,.0f} µs/event "
                  f"({cpu_s / ready_s:.2f} cores busy); Redis server CPU: {redis_s / report.sent * 1e6:,.0f} µs/event "
                  f"({redis_s / ready_s:.2f} cores)")
        ratio = rate / ceiling
        print(f"ratio worker/ceiling: {ratio:.2f} (goal >= {GOAL_RATIO}: {'met' if ratio >= GOAL_RATIO else 'NOT met'})")
        facts, versions = version_counts(folder, events)
        delta = after - before
        print(f"Redis used_memory delta {delta / 1e6:,.1f} MB over {facts:,} fact versions = {delta / facts:,.0f} "
              f"bytes/fact version ({delta / versions:,.0f} bytes per timeline version of any kind, {versions:,})")
        if args.faust_probe:
            probe = faust_probe_rate(args.kafka, topic, report.sent, tmp)
            print(f"bare faust agent (noack_take 5000, acks only, no processing): "
                  f"{'failed' if probe is None else f'{probe:,.0f} events/s'}")
        if not args.keep:
            asyncio.run(cleanup(args.kafka, args.redis, folder, sorted(prepared.tenants)))
        else:
            print(f"kept: topic {topic}, Redis namespace {cartridge.name!r}")


if __name__ == "__main__":
    main()
