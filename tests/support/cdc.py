"""Helpers of the cdc tests (no tests here): Debezium-shaped change records made by hand, producing them to change
topics, the relay as a command, and what a cartridge's events topic builds embedded."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HOUSEHOLD = ROOT / "examples" / "household"


def change(table: str, op: str, before: dict | None, after: dict | None, *, lsn: int, commit: int | None = None,
           tx: int = 7, ts_ms: int = 1788912000000, schema: bool = False) -> bytes:
    """A Debezium change event as the JSON converter writes it (schemas.enable=false unless `schema`)."""
    body = {"before": before, "after": after, "op": op, "ts_ms": ts_ms + 5, "transaction": None,
            "source": {"version": "3.6.1.Final", "connector": "postgresql", "name": "product", "ts_ms": ts_ms,
                       "snapshot": "true" if op == "r" else "false", "db": "product", "schema": "public",
                       "table": table, "txId": tx, "lsn": lsn,
                       "sequence": json.dumps([str(commit if commit is not None else lsn - 1), str(lsn)]),
                       "xmin": None}}
    if schema:
        body = {"schema": {"type": "struct", "fields": [], "optional": False, "name": "x.Envelope"}, "payload": body}
    return json.dumps(body).encode()


def days(iso: str) -> int:
    from datetime import date
    return (date.fromisoformat(iso) - date(1970, 1, 1)).days


def debt_row(i: int, key: str, month: str, balance: int, rate: str = "29.22", installment: int = 380000) -> dict:
    return {"id": i, "household_id": "hogar-demo", "creditor_id": "banco-andino", "account_id": "nomina",
            "debt_key": key, "product": key.title(), "month": days(month), "balance_cop": f"{balance}.00",
            "rate_ea_pct": rate, "installment_cop": f"{installment}.00"}


def due_row(ident: str, key: str, due_on: str, amount: int, **paid: Any) -> dict:
    row = {"id": ident, "household_id": "hogar-demo", "debt_key": key, "due_on": days(due_on),
           "amount_cop": f"{amount}.00", "status": "pending", "paid_on": None, "paid_cop": None, "account_id": None,
           "movement_id": None}
    return {**row, **paid}


def sample_changes() -> list[tuple[str, bytes, bytes]]:
    """The finance story as Debezium would capture examples/household/sample.sql: (topic suffix, key, value)."""
    visa9, lib9 = debt_row(1, "visa", "2026-09-01", 4200000), debt_row(2, "libranza", "2026-09-01", 12600000,
                                                                        "14.5", 520000)
    visa10, lib10 = debt_row(3, "visa", "2026-10-01", 3870000), debt_row(4, "libranza", "2026-10-01", 12180000,
                                                                          "14.5", 520000)
    due_v, due_l = due_row("visa-2026-09", "visa", "2026-09-05", 380000), \
        due_row("libranza-2026-09", "libranza", "2026-09-10", 520000)
    paid_l = {**due_l, "status": "paid", "paid_on": days("2026-09-10"), "paid_cop": "520000.00",
              "account_id": "nomina", "movement_id": "mov-0910-1"}
    mov = {"id": "mov-0910-1", "household_id": "hogar-demo", "account_id": "nomina", "booked_on": days("2026-09-10"),
           "amount_cop": "-520000.00", "description": "PAGO LIBRANZA"}
    dup = {**mov, "id": "mov-1001-dup", "booked_on": days("2026-10-01"), "amount_cop": "-380000.00"}
    t = 1788912000000
    out = [("debts", visa9["id"], change("debts", "c", None, visa9, lsn=100, tx=1, ts_ms=t)),
           ("debts", lib9["id"], change("debts", "c", None, lib9, lsn=110, tx=1, ts_ms=t)),
           ("dues", due_v["id"], change("dues", "c", None, due_v, lsn=120, tx=1, ts_ms=t)),
           ("dues", due_l["id"], change("dues", "c", None, due_l, lsn=130, tx=1, ts_ms=t)),
           ("movements", mov["id"], change("movements", "c", None, mov, lsn=200, tx=2, ts_ms=t + 1000)),
           ("dues", due_l["id"], change("dues", "u", due_l, paid_l, lsn=210, tx=2, ts_ms=t + 1000)),
           ("debts", visa10["id"], change("debts", "c", None, visa10, lsn=300, tx=3, ts_ms=t + 2000)),
           ("debts", lib10["id"], change("debts", "c", None, lib10, lsn=310, tx=3, ts_ms=t + 2000)),
           ("debts", lib10["id"], change("debts", "u", lib10, {**lib10, "balance_cop": "12150000.00"}, lsn=400,
                                         tx=4, ts_ms=t + 3000)),
           ("movements", dup["id"], change("movements", "c", None, dup, lsn=500, tx=5, ts_ms=t + 4000)),
           ("movements", dup["id"], change("movements", "d", dup, None, lsn=600, tx=6, ts_ms=t + 5000))]
    return [(table, json.dumps({"id": key}).encode(), value) for table, key, value in out]


def produce(bootstrap: str, records: Sequence[tuple[str, bytes | None, bytes | None]]) -> None:
    """Produce (topic, key, value) records in order, acks=all."""
    from aiokafka import AIOKafkaProducer

    async def go() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            for topic, key, value in records:
                await producer.send_and_wait(topic, value=value, key=key)
        finally:
            await producer.stop()
    asyncio.run(go())


def keel(*args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess:
    import os
    return subprocess.run([sys.executable, "-m", "keel.cli", *args], check=False, capture_output=True, text=True,
                          env={**os.environ, **env}, cwd=ROOT, timeout=timeout)


def envelopes_file(records: Sequence[Any], path: Path) -> Path:
    """The values of an events topic's records as a JSONL events file (what the embedded build reads)."""
    path.write_text("".join(r.value.decode() + "\n" for r in records))
    return path


def balance_at(folder: Path, events: Path, entity: str, at: str, env: dict[str, str]) -> Any:
    proc = keel("context", str(folder), str(events), entity, "--at", at, "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    facts = {f["predicate"]: f["value"] for f in json.loads(proc.stdout)["facts"]}
    return facts.get("balance_cop")


def digest(folder: Path, events: Path, env: dict[str, str]) -> str:
    proc = keel("digest", str(folder), "--events", str(events), env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()
