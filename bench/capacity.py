"""Capacity figures for the runbook (docs/operations.md), on a private Redis with the append-only file on:

    .venv/bin/python bench/capacity.py [--events 200000] [--tenants 200] [--kafka-data DIR]

Needs KEEL_KAFKA_BOOTSTRAP (or --kafka) and `redis-server` on PATH. On a fresh cartridge name: publishes
finance-shaped events, starts a private `redis-server --appendonly yes --appendfsync everysec` on a free
port, runs one `keel worker` into it until lag 0, then measures
  * Redis: used_memory and keys per event, AOF bytes per event;
  * `keel replay --all` (every tenant rebuilt, the Redis-loss recovery): seconds, and per million events;
  * AOF load time: the private Redis restarted, seconds until it answers, per million keys;
  * Kafka disk per event: the topic's partition folders under --kafka-data (the broker's log.dirs), if given.
Prints one JSON document. The private Redis and its files are removed at the end.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import redis
from common import finance_events

from keel.cartridge import load_cartridge

KEEL = [sys.executable, "-m", "keel.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(folder: Path, port: int) -> tuple[subprocess.Popen, float]:
    """A private redis-server (AOF on); returns it and the seconds until it answered PING."""
    started = time.monotonic()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder),
                             "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
                             "--logfile", str(folder / "redis.log")])
    client = redis.Redis(port=port)
    while True:
        try:
            if client.ping():
                return proc, time.monotonic() - started
        except (redis.ConnectionError, redis.BusyLoadingError):
            time.sleep(0.01)
        if proc.poll() is not None:
            raise SystemExit(f"redis-server exited: {(folder / 'redis.log').read_text()[-2000:]}")


def cartridge_copy(tmp: Path) -> Path:
    folder = tmp / "finance"
    shutil.copytree(ROOT / "cartridges" / "finance", folder)
    spec = folder / "cartridge.yaml"
    spec.write_text(spec.read_text().replace("name: finance", f"name: cap{uuid.uuid4().hex[:8]}", 1))
    return folder


def wait_lag_zero(folder: Path, env: dict[str, str], total: int, worker: subprocess.Popen) -> None:
    while True:
        out = subprocess.run([*KEEL, "status", str(folder), "--json"], check=False, env=env, capture_output=True,
                             text=True)
        doc = json.loads(out.stdout) if out.stdout.startswith("{") else {}
        if doc.get("lag") == 0 and sum(p["end"] for p in doc.get("partitions", [])) >= total:
            return
        if worker.poll() is not None:
            raise SystemExit("the worker exited")
        time.sleep(1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--tenants", type=int, default=200)
    p.add_argument("--kafka", default=os.environ.get("KEEL_KAFKA_BOOTSTRAP", "127.0.0.1:9092"))
    p.add_argument("--kafka-data", type=Path, help="the broker's log.dirs, to measure the topic's disk use")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="keel-capacity-"))
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    env = {**os.environ, "KEEL_KAFKA_BOOTSTRAP": args.kafka, "KEEL_REDIS_URL": url}
    out: dict[str, object] = {"events": args.events, "tenants": args.tenants}
    proc, _ = start_redis(tmp, port)
    try:
        folder = cartridge_copy(tmp)
        name = load_cartridge(folder).name
        events = tmp / "events.jsonl"
        with events.open("w") as f:
            for e in finance_events(args.events, args.tenants, seed=3):
                f.write(json.dumps(e) + "\n")
        subprocess.run([*KEEL, "publish", str(folder), str(events), "--quiet"], env=env, check=True)
        started = time.monotonic()
        worker = subprocess.Popen([*KEEL, "worker", str(folder), "--quiet", "-l", "warn"], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_lag_zero(folder, env, args.events, worker)
            out["worker_ingest_s"] = round(time.monotonic() - started, 1)
        finally:
            worker.terminate()
            worker.wait(30)
        client = redis.Redis(port=port)
        client.execute_command("BGREWRITEAOF")
        time.sleep(0.5)
        while client.info("persistence").get("aof_rewrite_in_progress"):
            time.sleep(0.2)
        info = client.info("memory")
        keys = client.dbsize()
        aof = sum(f.stat().st_size for f in (tmp / "appendonlydir").iterdir())     # base (RDB preamble) + incr
        out.update(redis_used_memory_bytes_per_event=round(info["used_memory"] / args.events),
                   redis_keys=keys, redis_keys_per_event=round(keys / args.events, 3),
                   aof_bytes_per_event=round(aof / args.events))
        started = time.monotonic()
        subprocess.run([*KEEL, "replay", str(folder), "--all", "--quiet"], env=env, check=True)
        took = time.monotonic() - started
        out.update(replay_all_s=round(took, 1), replay_all_s_per_million_events=round(took * 1e6 / args.events))
        client.shutdown(nosave=False)
        proc.wait(30)
        proc, load = start_redis(tmp, port)
        keys = redis.Redis(port=port).dbsize()
        out.update(aof_load_s=round(load, 2), aof_load_s_per_million_keys=round(load * 1e6 / max(keys, 1), 1))
        if args.kafka_data:
            topic = f"keel.{name}.events-"
            size = sum(f.stat().st_size for d in args.kafka_data.iterdir() if d.name.startswith(topic)
                       for f in d.iterdir() if f.suffix == ".log")
            out.update(kafka_bytes_per_event=round(size / args.events))
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
