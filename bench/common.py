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


def lines(events: Iterator[dict]) -> list[bytes]:
    return [json.dumps(e, separators=(",", ":")).encode() for e in events]


def percentiles(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """(p50, p99) in milliseconds of `repeat` calls."""
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    samples.sort()
    return samples[len(samples) // 2], samples[min(len(samples) - 1, int(len(samples) * 0.99))]
