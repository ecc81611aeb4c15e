"""Shared pieces of the benchmarks: a finance-shaped event generator and percentile helpers."""
from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterator

CREDITORS = ["Banco Andino", "Cooperativa Progreso", "Banco del Valle", "Financiera Sol"]
PRODUCTS = ["Visa", "Mastercard", "Libranza", "Hipoteca", "Vehiculo", "Libre inversion"]


def month_start(i: int) -> str:
    y, m = divmod(i, 12)
    return f"{2000 + y:04d}-{m + 1:02d}-01"


def finance_events(n: int, tenants: int, *, seed: int = 7, debts_per_tenant: int = 4) -> Iterator[dict]:
    """n finance-shaped envelopes spread over tenants: monthly snapshots, scheduled dues, payments."""
    rng = random.Random(seed)
    per_tenant = max(1, n // tenants)
    produced = 0
    for t in range(tenants):
        tenant = f"tenant-{t:05d}"
        month = 0
        while produced < n and (produced < (t + 1) * per_tenant or t == tenants - 1):
            for d in range(debts_per_tenant):
                if produced >= n:
                    break
                debt = f"d{d}"
                kind = produced % 3
                day = month_start(month)
                if kind == 0:
                    yield {"id": f"{tenant}-s-{debt}-{month}", "tenant": tenant, "type": "debt.snapshot",
                           "subject": f"debt:{debt}", "occurred_at": day,
                           "payload": {"creditor": rng.choice(CREDITORS), "product": rng.choice(PRODUCTS),
                                       "balance_cop": rng.randrange(100_000, 50_000_000),
                                       "rate_ea_pct": round(rng.uniform(8, 35), 2),
                                       "installment_cop": rng.randrange(50_000, 2_000_000), "month": day[:7]}}
                elif kind == 1:
                    yield {"id": f"{tenant}-q-{debt}-{month}", "tenant": tenant, "type": "due.scheduled",
                           "subject": f"due:{debt}-{month}", "occurred_at": day,
                           "payload": {"debt_id": debt, "due_on": day[:8] + "05",
                                       "amount_cop": rng.randrange(50_000, 2_000_000)}}
                else:
                    yield {"id": f"{tenant}-p-{debt}-{month}", "tenant": tenant, "type": "due.paid",
                           "subject": f"due:{debt}-{month}", "occurred_at": day[:8] + "04",
                           "payload": {"paid_on": day[:8] + "04", "amount_cop": rng.randrange(50_000, 2_000_000),
                                       "account_id": "nomina", "movement_id": f"m{produced}"}}
                produced += 1
            month += 1


def finance_writes(e: dict) -> list[tuple[str, object]]:
    """(key, value) of each write of one finance event, as cartridges/finance/cartridge.yaml projects it: the
    plain, hand-written projection the peers (bench/peers/) and the reference computation of bench/embedded.py do."""
    p, subject, kind = e["payload"], e["subject"], e["type"]
    sid = subject.partition(":")[2]
    if kind == "debt.snapshot":
        return [(f"l|{subject}|ref", f"{e.get('source') or 'debts'}#{sid}"), (f"l|{subject}|creditor", p["creditor"]),
                (f"l|{subject}|product", p["product"]), (f"r|{subject}|owed_by|household:{e['tenant']}", True),
                (f"f|{subject}|balance_cop", p["balance_cop"]), (f"f|{subject}|rate_ea_pct", p["rate_ea_pct"]),
                (f"f|{subject}|installment_cop", p["installment_cop"])]
    if kind == "due.scheduled":
        return [(f"l|{subject}|ref", f"{e.get('source') or 'dues'}#{sid}"), (f"l|{subject}|debt", p["debt_id"]),
                (f"l|{subject}|due_on", p["due_on"]), (f"r|{subject}|for_debt|debt:{p['debt_id']}", True),
                (f"f|{subject}|status", "pending"), (f"f|{subject}|due_on", p["due_on"]),
                (f"f|{subject}|amount_cop", p["amount_cop"])]
    account = f"account:{p['account_id']}"
    return [(f"l|{account}|ref", f"accounts#{p['account_id']}"), (f"r|{subject}|paid_from|{account}", True),
            (f"f|{subject}|status", "paid"), (f"f|{subject}|paid_on", p["paid_on"]),
            (f"f|{subject}|amount_paid_cop", p["amount_cop"])]


def version_point(e: dict) -> str:
    """The valid-time point of a finance event's writes (a payment counts from the day it was paid)."""
    return e["payload"]["paid_on"] if e["type"] == "due.paid" else e["occurred_at"]


def lines(events: Iterator[dict]) -> list[bytes]:
    return [json.dumps(e, separators=(",", ":")).encode() for e in events]


def percentiles(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """(p50, p99) in milliseconds of `repeat` calls."""
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return p50_p99(samples)


def p50_p99(samples: list[float]) -> tuple[float, float]:
    """(p50, p99) of `samples` (sorted here, in place)."""
    samples.sort()
    return samples[len(samples) // 2], samples[min(len(samples) - 1, int(len(samples) * 0.99))]
