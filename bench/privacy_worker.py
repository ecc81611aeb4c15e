"""Worker events/s with and without sealed personal fields, side by side in one run: Kafka → `keel worker` → Redis.

    .venv/bin/python bench/privacy_worker.py [--events 20000] [--subjects 2000] [--tenants 20] [--rounds 2]

Needs KEEL_KAFKA_BOOTSTRAP and KEEL_REDIS_URL (e.g. from `deploy/local/services up`). The key store is
PostgreSQL when KEEL_POSTGRES_DSN is set (a fresh schema, dropped afterwards), else a key file. The cartridge
and stream of bench/privacy.py (1.5 personal fields per event), over --tenants tenants. Two modes, alternating
in each round, each on a fresh cartridge name (fresh topics and Redis namespace):
  clear   the cartridge without `personal:`, the stream published as it is;
  sealed  the cartridge with `personal:`, the stream published by `keel publish` with the key store (sealed),
          the worker revealing every personal field with the same store.
Printed per mode (medians over rounds): events/s from the moment the worker holds its partitions to lag 0, the
worker's CPU µs per event and Redis's, and the sealed/clear ratios.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from ingest import run_workers
from privacy import CARTRIDGE

CLEAR = CARTRIDGE.split("personal:")[0]


def write_stream(path: Path, n: int, subjects: int, tenants: int) -> None:
    """Client registrations (name, phone) and visits (remark) of `subjects` clients per tenant, round-robin."""
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            tenant = f"t{i % tenants}"
            client = f"client:c{(i // tenants) % subjects}"
            if (i // tenants) % 2 == 0:
                e = {"id": f"e{i}", "tenant": tenant, "type": "client.registered", "subject": client,
                     "occurred_at": "2026-01-01T00:00:00Z",
                     "payload": {"name": f"Name {i}", "phone": f"+57 300 {i:07d}"}}
            else:
                e = {"id": f"e{i}", "tenant": tenant, "type": "visit.completed", "subject": f"visit:v{i}",
                     "occurred_at": "2026-01-02T00:00:00Z",
                     "payload": {"client": client, "remark": f"remark {i}", "price": i}}
            f.write(json.dumps(e, ensure_ascii=False) + "\n")


def cartridge(base: Path, text: str) -> Path:
    folder = base / f"c{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    name = f"pw{uuid.uuid4().hex[:10]}"
    (folder / "cartridge.yaml").write_text(text.replace("name: privacy_bench", f"name: {name}", 1), encoding="utf-8")
    return folder


def key_env(tmp: Path) -> tuple[dict[str, str], str | None]:
    """The key store's environment: a fresh PostgreSQL schema when KEEL_POSTGRES_DSN is set, else a key file."""
    env = {"KEEL_MASTER_KEY": base64.b64encode(secrets.token_bytes(32)).decode(), "KEEL_MASTER_KEY_FILE": ""}
    dsn = os.environ.get("KEEL_POSTGRES_DSN")
    if not dsn:
        return {**env, "KEEL_KEYS_FILE": str(tmp / "keys.json"), "KEEL_KEYS_DSN": ""}, None
    import psycopg
    schema = f"pw_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in dsn else "?"
    return {**env, "KEEL_KEYS_DSN": f"{dsn}{sep}options=-csearch_path%3D{schema}", "KEEL_KEYS_FILE": ""}, schema


def run_mode(mode: str, tmp: Path, events: Path, total: int, env: dict[str, str], batch: int) -> dict[str, float]:
    folder = cartridge(tmp, CARTRIDGE if mode == "sealed" else CLEAR)
    subprocess.run([sys.executable, "-m", "keel.cli", "publish", str(folder), str(events), "--quiet"],
                   env={**os.environ, **env}, cwd=ROOT, check=True)
    seconds, _, worker_cpu, redis_cpu = run_workers(folder, env, total, batch, [tmp / f"{folder.name}.log"])
    return {"rate": total / seconds, "worker_us": 1e6 * (worker_cpu or float("nan")) / total,
            "redis_us": 1e6 * redis_cpu / total}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--subjects", type=int, default=2_000)
    ap.add_argument("--tenants", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=5000)
    args = ap.parse_args()
    for name in ("KEEL_KAFKA_BOOTSTRAP", "KEEL_REDIS_URL"):
        if not os.environ.get(name):
            raise SystemExit(f"set {name} (e.g. `deploy/local/services up`)")
    with tempfile.TemporaryDirectory(prefix="keel-privacy-worker-") as t:
        tmp = Path(t)
        events = tmp / "events.jsonl"
        write_stream(events, args.events, args.subjects, args.tenants)
        keys, schema = key_env(tmp)
        env = {"KEEL_KAFKA_BOOTSTRAP": os.environ["KEEL_KAFKA_BOOTSTRAP"],
               "KEEL_REDIS_URL": os.environ["KEEL_REDIS_URL"], **keys}
        print(f"worker with and without sealed personal fields: {args.events} events, {args.tenants} tenants, "
              f"key store {'PostgreSQL' if schema else 'key file'}, load average {os.getloadavg()[0]:.1f}",
              flush=True)
        results: dict[str, list[dict[str, float]]] = {"clear": [], "sealed": []}
        try:
            for r in range(args.rounds):
                for mode in ("clear", "sealed") if r % 2 == 0 else ("sealed", "clear"):
                    res = run_mode(mode, tmp, events, args.events, env, args.batch)
                    results[mode].append(res)
                    print(f"  round {r + 1} {mode:6} {res['rate']:8.0f} events/s  worker {res['worker_us']:6.1f} "
                          f"µs/event  Redis {res['redis_us']:5.1f} µs/event", flush=True)
        finally:
            if schema:
                import psycopg
                with psycopg.connect(os.environ["KEEL_POSTGRES_DSN"], autocommit=True) as conn:
                    conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    med = {m: {k: statistics.median(x[k] for x in rs) for k in ("rate", "worker_us", "redis_us")}
           for m, rs in results.items()}
    print(f"\nmedians (load average now {os.getloadavg()[0]:.1f}):")
    for m, v in med.items():
        print(f"{m:6} {v['rate']:8.0f} events/s  worker {v['worker_us']:6.1f} µs/event  Redis {v['redis_us']:5.1f} "
              f"µs/event")
    print(f"sealed / clear: events/s {med['sealed']['rate'] / med['clear']['rate']:.2f}, worker CPU per event "
          f"{med['sealed']['worker_us'] / med['clear']['worker_us']:.2f}")


if __name__ == "__main__":
    main()
