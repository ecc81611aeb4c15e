"""Personal fields on the Kafka path (docs/privacy.md): what `keel publish` spends sealing and what a worker or
`keel replay` spends revealing, side by side with the clear stream in one process (no Kafka, no Redis: the
records `keel publish` would send, judged by the worker's and the replay's code on its in-memory mirror).

    .venv/bin/python bench/privacy_stream.py [--events 20000] [--subjects 2000] [--rounds 3]

The stream and cartridge of bench/privacy.py (1.5 personal fields per event). The key store is the key file,
and also PostgreSQL when KEEL_POSTGRES_DSN is set (a fresh schema, dropped afterwards). Printed per store: CPU
microseconds per event (`process_time`, median of alternating rounds) of publish's check-and-encode of the clear
stream and of the same with sealing, and of judging the clear records against judging the sealed ones with
their keys (the worker's path: `workers.replay_build.PartitionBuild`), with ratios; and whether every record
was applied in both (it must).
"""
from __future__ import annotations

import argparse
import base64
import os
import secrets
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from privacy import CARTRIDGE, write_stream

from keel.cartridge import load_cartridge
from keel.keystore import FileKeyStore, KeyStore
from keel.privacy import Privacy
from workers.publish import Prepared, checked_records
from workers.records import Record
from workers.replay_build import PartitionBuild


def cpu(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.process_time()
    out = fn()
    return time.process_time() - start, out


def encode(cartridge, events: Path, privacy: Privacy | None) -> list[tuple[bytes, bytes]]:
    return list(checked_records(cartridge, events, Prepared(), privacy=privacy))


def judge_all(cartridge, records: list[tuple[bytes, bytes]], privacy: Privacy | None) -> int:
    build = PartitionBuild(cartridge, lambda t: True, reveal=None if privacy is None else privacy.reveal_line)
    build.feed(Record("keel.b.events", 0, i, None, k, v) for i, (k, v) in enumerate(records))
    return sum(p.applied for p in build.tenants.values())


def measure(name: str, cartridge, events: Path, keys: KeyStore, n: int, rounds: int) -> None:
    privacy = Privacy(cartridge, keys)
    encode(cartridge, events, privacy)          # keys created once, outside the rounds (publish's first run)
    enc_clear, enc_sealed, judge_clear, judge_sealed, applied = [], [], [], [], set()
    for _ in range(rounds):
        spent, clear = cpu(lambda: encode(cartridge, events, None))
        enc_clear.append(spent)
        spent, sealed = cpu(lambda: encode(cartridge, events, privacy))
        enc_sealed.append(spent)
        spent, a = cpu(lambda clear=clear: judge_all(cartridge, clear, None))
        judge_clear.append(spent)
        spent, b = cpu(lambda sealed=sealed: judge_all(cartridge, sealed, Privacy(cartridge, keys)))
        judge_sealed.append(spent)
        applied |= {a, b}
    per = 1e6 / n
    ec, es = statistics.median(enc_clear), statistics.median(enc_sealed)
    jc, js = statistics.median(judge_clear), statistics.median(judge_sealed)
    print(f"[{name}]")
    print(f"  publish check+encode, clear:     {ec * per:7.1f} CPU us/event")
    print(f"  publish check+encode+seal:       {es * per:7.1f} CPU us/event  (x{es / ec:.2f}, +{(es - ec) * per:.1f})")
    print(f"  worker judge, clear records:     {jc * per:7.1f} CPU us/event")
    print(f"  worker judge, sealed + reveal:   {js * per:7.1f} CPU us/event  (x{js / jc:.2f}, +{(js - jc) * per:.1f})")
    print(f"  every record applied in both:    {applied == {n}}")


def run() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--subjects", type=int, default=2_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    master = secrets.token_bytes(32)
    os.environ["KEEL_MASTER_KEY"] = base64.b64encode(master).decode()
    print(f"events: {args.events}, data subjects: {args.subjects}, rounds: {args.rounds}")
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        folder = d / "cartridge"
        folder.mkdir()
        (folder / "cartridge.yaml").write_text(CARTRIDGE, encoding="utf-8")
        events = d / "clear.jsonl"
        write_stream(events, args.events, args.subjects)
        cartridge = load_cartridge(folder)
        measure("key file", cartridge, events, FileKeyStore(d / "keys.json", master), args.events, args.rounds)
        dsn = os.environ.get("KEEL_POSTGRES_DSN")
        if dsn:
            import psycopg

            from keel.keystore_pg import PostgresKeyStore
            schema = f"bench_{uuid.uuid4().hex[:10]}"
            store = PostgresKeyStore(dsn, master, schema=schema)
            try:
                measure("PostgreSQL", cartridge, events, store, args.events, args.rounds)
            finally:
                store.close()
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


if __name__ == "__main__":
    run()
