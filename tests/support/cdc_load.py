"""A load generator that writes like the household-finance product (examples/household/schema.sql) and the ground
truth computed by SQL from its tables, compared with Keel's answers (no tests here).

Writes: concurrent transactions over several households (tenants), a debt's monthly snapshot row inserted then
corrected (updates of the same row), dues scheduled then paid (the update `sources:` maps to due.paid),
movements imported and some deleted again (retractions), a long transaction that commits late, and a column
added to a table mid-stream. Truth: a debt's balance at a date is its snapshot row valid then (the latest month
not after the date); a due's status and amounts are its row's; a movement holds its amount while its row exists.
"""
from __future__ import annotations

import random
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg

HOUSEHOLDS = ("hogar-a", "hogar-b", "hogar-c")
DEBTS = ("visa", "libranza", "carro")
MONTHS = [date(2026, m, 1) for m in range(1, 13)]


@dataclass
class ProductLoad:
    dsn: str
    seed: int = 42
    movements: set[str] = field(default_factory=set)     # every movement id ever inserted
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _n: int = 0

    def setup(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO creditors VALUES ('banco-andino', 'Banco Andino') ON CONFLICT DO NOTHING")
            for h in HOUSEHOLDS:
                conn.execute("INSERT INTO households VALUES (%s, %s) ON CONFLICT DO NOTHING", (h, h))
                conn.execute("INSERT INTO accounts VALUES (%s, %s, 'Banco Andino') ON CONFLICT DO NOTHING",
                             (f"{h}-nomina", h))

    def _next(self) -> int:
        with self._lock:
            self._n += 1
            return self._n

    def transaction(self, conn: psycopg.Connection, rng: random.Random) -> None:
        """One product transaction: a few writes of one household."""
        h = rng.choice(HOUSEHOLDS)
        with conn.transaction():
            for _ in range(rng.randint(1, 4)):
                kind = rng.random()
                if kind < 0.35:
                    key, month = rng.choice(DEBTS), rng.choice(MONTHS[:6])
                    conn.execute(
                        "INSERT INTO debts (household_id, creditor_id, account_id, debt_key, product, month, "
                        "balance_cop, rate_ea_pct, installment_cop) VALUES (%s, 'banco-andino', %s, %s, %s, %s, %s, "
                        "%s, %s) ON CONFLICT (household_id, debt_key, month) DO UPDATE SET "
                        "balance_cop = EXCLUDED.balance_cop",
                        (h, f"{h}-nomina", key, key.title(), month, rng.randrange(1_000_000, 20_000_000, 1000),
                         Decimal("24.5"), 400000))
                elif kind < 0.5:
                    conn.execute("UPDATE debts SET balance_cop = balance_cop - %s WHERE id = (SELECT id FROM debts "
                                 "WHERE household_id = %s ORDER BY random() LIMIT 1)", (rng.randrange(1000, 90000, 1000), h))
                elif kind < 0.65:
                    key, month = rng.choice(DEBTS), rng.choice(MONTHS[:6])
                    conn.execute("INSERT INTO dues (id, household_id, debt_key, due_on, amount_cop) VALUES "
                                 "(%s, %s, %s, %s, 400000) ON CONFLICT DO NOTHING",
                                 (f"{h}-{key}-{month:%Y-%m}", h, key, month + timedelta(days=4)))
                elif kind < 0.75:
                    n = self._next()
                    conn.execute("UPDATE dues SET status = 'paid', paid_on = due_on, paid_cop = amount_cop, "
                                 "account_id = %s, movement_id = %s WHERE id = (SELECT id FROM dues WHERE "
                                 "household_id = %s AND status = 'pending' ORDER BY random() LIMIT 1)",
                                 (f"{h}-nomina", f"pay-{n}", h))
                elif kind < 0.92:
                    ident = f"mov-{self._next()}"
                    conn.execute("INSERT INTO movements (id, household_id, account_id, booked_on, amount_cop, "
                                 "description) VALUES (%s, %s, %s, %s, %s, 'MOV')",
                                 (ident, h, f"{h}-nomina", rng.choice(MONTHS[:6]) + timedelta(days=rng.randint(0, 27)),
                                  -rng.randrange(10000, 900000, 100)))
                    with self._lock:
                        self.movements.add(ident)
                else:
                    conn.execute("DELETE FROM movements WHERE id = (SELECT id FROM movements WHERE household_id = %s "
                                 "ORDER BY random() LIMIT 1)", (h,))

    def run(self, transactions: int, threads: int = 3, seed: int | None = None) -> None:
        """`transactions` product transactions on `threads` concurrent connections."""
        base = self.seed if seed is None else seed
        errors: list[BaseException] = []

        def worker(i: int) -> None:
            rng = random.Random(base * 100 + i)
            try:
                with psycopg.connect(self.dsn, autocommit=True) as conn:
                    for _ in range(transactions // threads):
                        self.transaction(conn, rng)
            except BaseException as e:  # noqa: BLE001 - reported by the caller
                errors.append(e)
        pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        if errors:
            raise errors[0]

    def long_transaction(self) -> tuple[psycopg.Connection, list[str]]:
        """A transaction left open (committed later by the caller): its rows arrive at its commit."""
        conn = psycopg.connect(self.dsn)
        ids = []
        for i in range(5):
            ident = f"mov-long-{self._next()}-{i}"
            conn.execute("INSERT INTO movements (id, household_id, account_id, booked_on, amount_cop, description) "
                         "VALUES (%s, 'hogar-a', 'hogar-a-nomina', '2026-03-03', -1000, 'LONG')", (ident,))
            ids.append(ident)
        with self._lock:
            self.movements.update(ids)
        return conn, ids

    def add_column(self) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("ALTER TABLE movements ADD COLUMN IF NOT EXISTS note text DEFAULT 'added mid-stream'")


def _number(value: Any) -> float | None:
    return None if value is None else float(value)


def _plain(value: Any) -> Any:
    """Numbers compared as numbers (SQL numerics, JSON integers), the rest as they are."""
    return float(value) if isinstance(value, int | float | Decimal) and not isinstance(value, bool) else value


def truth_problems(dsn: str, folder: Path, events: Path, movements: Iterable[str]) -> list[str]:
    """Where Keel's answers (the embedded build of `events`) differ from the SQL ground truth; [] when equal."""
    import keel
    problems: list[str] = []
    with psycopg.connect(dsn) as conn, keel.open(folder, events=events) as graph:
        debts = conn.execute("SELECT DISTINCT household_id, debt_key FROM debts").fetchall()
        for h, key in debts:
            tools = graph.tools(tenant=h)
            for month in MONTHS[:7]:
                at = month + timedelta(days=14)
                row = conn.execute("SELECT balance_cop FROM debts WHERE household_id = %s AND debt_key = %s AND "
                                   "month <= %s ORDER BY month DESC LIMIT 1", (h, key, at)).fetchone()
                want = _number(row[0]) if row else None
                got = _fact(tools, f"debt:{key}", at.isoformat(), "balance_cop")
                if want != _number(got):
                    problems.append(f"{h} debt:{key} at {at}: SQL {want}, Keel {got}")
        for h, ident, status, amount, paid in conn.execute(
                "SELECT household_id, id, status, amount_cop, paid_cop FROM dues").fetchall():
            tools = graph.tools(tenant=h)
            for predicate, want in (("status", status), ("amount_cop", _number(amount)),
                                    ("amount_paid_cop", _number(paid))):
                got = _fact(tools, f"due:{ident}", "2027-12-31", predicate)
                if _plain(got) != _plain(want):
                    problems.append(f"{h} due:{ident} {predicate}: SQL {want}, Keel {got}")
        rows = {i: (h, a) for i, h, a in conn.execute("SELECT id, household_id, amount_cop FROM movements").fetchall()}
        for ident in sorted(set(movements) | set(rows)):
            h, amount = rows.get(ident, (None, None))
            tenants = [h] if h else list(HOUSEHOLDS)
            got = [_fact(graph.tools(tenant=t), f"movement:{ident}", "2027-12-31", "amount_cop") for t in tenants]
            got = [g for g in got if g is not None]
            want = [_number(amount)] if amount is not None else []
            if [_number(g) for g in got] != want:
                problems.append(f"movement:{ident}: SQL {want}, Keel {got}")
    return problems


def _fact(tools: Any, entity: str, at: str, predicate: str) -> Any:
    from keel.errors import KeelError
    try:
        result = tools.context(entity, at=at)
    except KeelError:
        return None                       # an entity Keel never heard of (or a tenant it does not hold)
    return next((f["value"] for f in result["facts"] if f["predicate"] == predicate), None)
