"""Personal fields benchmark (docs/privacy.md): the embedded build of a clear events file against the same file
sealed by `keel seal`, side by side in one process.

    .venv/bin/python bench/privacy.py [--events 20000] [--subjects 2000] [--rounds 3]

A self-contained cartridge (clients with a name and a phone, visits with a remark: 1.5 personal fields per
event) and a generated stream. Printed: CPU microseconds per event (`process_time`, median of alternating
rounds) of `keel.open(events=…)` on the clear file (the cartridge with `personal: {accept_clear: true}`: without
it the clear lines are refused) and of `keel.open(events=…, keys=…)` on the sealed one, their
ratio, the CPU cost per event of `keel seal`, and whether both graphs have one digest (they must).
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import secrets
import statistics
import tempfile
import time
from pathlib import Path

import keel
from keel.cli import main as keel_main
from keel.digest import digest

CARTRIDGE = """\
name: privacy_bench
entities:
  client: {}
  visit: {}
relations:
  visit_of: {from: visit, to: client}
events:
  client.registered:
    subject: client
    owner: crm
    payload: {name: string, phone: string}
    project:
      - upsert: {labels: {name: "{name}", phone: "{phone}"}}
  visit.completed:
    subject: visit
    owner: pos
    payload: {client: string, remark: string, price: number}
    project:
      - upsert: {labels: {remark: "{remark}"}}
      - link: {relation: visit_of, to: "{client}"}
      - facts: {set: {price: "{price}"}}
personal:
  client.registered: {fields: [name, phone]}
  visit.completed: {fields: [remark], of: payload.client}
"""


def write_stream(path: Path, n: int, subjects: int) -> None:
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            client = f"client:c{i % subjects}"
            if i % 2 == 0:
                e = {"id": f"e{i}", "tenant": "t1", "type": "client.registered", "subject": client,
                     "occurred_at": "2026-01-01T00:00:00Z", "payload": {"name": f"Name {i}", "phone": f"+57 300 {i:07d}"}}
            else:
                e = {"id": f"e{i}", "tenant": "t1", "type": "visit.completed", "subject": f"visit:v{i}",
                     "occurred_at": "2026-01-02T00:00:00Z", "payload": {"client": client, "remark": f"remark {i}",
                                                                       "price": i}}
            f.write(json.dumps(e, ensure_ascii=False) + "\n")


def build(folder: Path, events: Path, keys: Path | None = None) -> tuple[float, str]:
    start = time.process_time()
    with keel.open(folder, events=events, keys=keys) as graph:
        spent = time.process_time() - start
        return spent, digest(graph.store, "t1")


def run() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--subjects", type=int, default=2_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("KEEL_MASTER_KEY", base64.b64encode(secrets.token_bytes(32)).decode())
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        folder, accepting = d / "cartridge", d / "accepting"
        folder.mkdir()
        (folder / "cartridge.yaml").write_text(CARTRIDGE, encoding="utf-8")
        accepting.mkdir()       # the clear file's build: the same cartridge, accepting personal fields in clear
        (accepting / "cartridge.yaml").write_text(CARTRIDGE + "  accept_clear: true\n", encoding="utf-8")
        clear, sealed, keys = d / "clear.jsonl", d / "sealed.jsonl", d / "keys.json"
        write_stream(clear, args.events, args.subjects)
        start = time.process_time()
        if keel_main(["seal", str(folder), str(clear), str(sealed), "--keys", str(keys)]) != 0:
            raise SystemExit("keel seal failed")
        seal_cpu = time.process_time() - start
        plain_runs, sealed_runs, digests = [], [], set()
        for _ in range(args.rounds):
            spent, a = build(accepting, clear)
            plain_runs.append(spent)
            spent, b = build(folder, sealed, keys)
            sealed_runs.append(spent)
            digests |= {a, b}
    per = 1e6 / args.events
    plain, sealed_cpu = statistics.median(plain_runs), statistics.median(sealed_runs)
    print(f"events: {args.events}, data subjects: {args.subjects}, rounds: {args.rounds}")
    print(f"embedded build, clear file:            {plain * per:7.1f} CPU us/event")
    print(f"embedded build, sealed file + keys:    {sealed_cpu * per:7.1f} CPU us/event  "
          f"(x{sealed_cpu / plain:.2f}, +{(sealed_cpu - plain) * per:.1f} us/event)")
    print(f"keel seal (keys created):              {seal_cpu * per:7.1f} CPU us/event")
    print(f"one digest for both graphs:            {len(digests) == 1}")


if __name__ == "__main__":
    run()
