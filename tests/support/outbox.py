"""Helpers for the ingress tests (no tests here): service variables, a fresh schema and cartridge per test,
the relay and the webhook as subprocesses, outbox writers, and reading a topic back."""
from __future__ import annotations

import atexit
import json
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from support.workers import KeelProcess, wait_until  # noqa: F401 - shared with the outbox tests
from support.workers import keel as ingress_cli  # noqa: F401 - `keel outbox …`, `keel webhook …`
from support.workers import read_until as read_topic  # noqa: F401
from support.workers import unique_cartridge as _unique_cartridge

ROOT = Path(__file__).resolve().parents[2]
services = pytest.mark.services


def ingress_env() -> dict[str, str]:
    """KEEL_POSTGRES_DSN and KEEL_KAFKA_BOOTSTRAP (skip, or fail under KEEL_REQUIRE_SERVICES=1); the PostgreSQL
    server is this process's own (`outbox_dsn`)."""
    from support.services import service_env
    return {"KEEL_POSTGRES_DSN": outbox_dsn(service_env("KEEL_POSTGRES_DSN")),
            "KEEL_KAFKA_BOOTSTRAP": service_env("KEEL_KAFKA_BOOTSTRAP")}


_outbox_server: list[str] = []


def outbox_dsn(shared: str) -> str:
    """A PostgreSQL server of this pytest process, started at its first call and stopped at its exit (the shared
    server `shared` where PostgreSQL's binaries are absent). The relay waits for the oldest transaction running
    anywhere in the cluster (keel/ingress/xmin.py): on the shared server, a transaction that a test on another
    pytest-xdist worker held open made this worker's relays relay nothing."""
    if not _outbox_server:
        from support.private_pg import _bin, private_postgres
        if _bin("initdb") is None or _bin("pg_ctl") is None:
            _outbox_server.append(shared)
        else:
            server = private_postgres()
            _outbox_server.append(server.__enter__().dsn)
            atexit.register(server.__exit__, None, None, None)
    return _outbox_server[0]


def unique_cartridge(tmp_path: Path, name: str = "finance") -> Path:
    """A copy of cartridges/<name> under a unique cartridge name, so its topics are fresh."""
    return _unique_cartridge(tmp_path, name, prefix="ing")


def sample_envelopes(name: str = "finance") -> list[dict[str, Any]]:
    return [json.loads(line) for line in (ROOT / "cartridges" / name / "events.jsonl").read_text().splitlines()
            if line.strip()]


def fresh_schema(dsn: str) -> Iterator[str]:
    """A unique schema, dropped afterwards (a generator for fixtures)."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    yield schema
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


class Background(KeelProcess):
    """A keel ingress command (`keel outbox relay …`, `keel webhook …`) as a subprocess, logging to a file."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        super().__init__("keel.cli", args, env, log)

    def wait_for_line(self, pattern: str, timeout: float = 60) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.text())
            if found:
                return found
            if not self.alive():
                raise AssertionError(f"exited {self.proc.returncode} before logging {pattern!r}:\n{self.text()}")
            time.sleep(0.1)
        raise AssertionError(f"no line matching {pattern!r} within {timeout}s:\n{self.text()}")


def relay_process(folder: Path, schema: str, env: dict[str, str], log: Path, *extra: str) -> Background:
    return Background(["outbox", "relay", str(folder), "--schema", schema, "--interval", "0.05", *extra], env, log)


def insert(conn: psycopg.Connection, schema: str, envelope: dict[str, Any] | str) -> None:
    text = envelope if isinstance(envelope, str) else json.dumps(envelope)
    conn.execute(f"INSERT INTO {schema}.keel_outbox (envelope) VALUES (%s::jsonb)", (text,))


def insert_all(dsn: str, schema: str, envelopes: list[dict[str, Any] | str], *, timeout: float = 120.0) -> None:
    """Each envelope in an outbox row of its own transaction (autocommit), in order; then waits (at most `timeout`
    seconds) until every row is below the cluster's snapshot xmin. The relay takes only those
    (keel/ingress/source.py), and on a suite's shared PostgreSQL another test's open transaction can hold xmin for
    a moment: a `relay --once` run meanwhile rightly relays none of them (it says they wait for a later run)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for envelope in envelopes:
            insert(conn, schema, envelope)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            row = conn.execute(f"SELECT count(*) FROM {schema}.keel_outbox "
                               "WHERE xid >= pg_snapshot_xmin(pg_current_snapshot())").fetchone()
            if row is not None and row[0] == 0:
                return
            time.sleep(0.05)


def committed_rows(dsn: str, schema: str) -> list[dict[str, Any]]:
    """Every envelope in the outbox in relay order, (xid, position)."""
    with psycopg.connect(dsn) as conn:
        return [row[0] for row in conn.execute(
            f"SELECT envelope FROM {schema}.keel_outbox ORDER BY xid, position").fetchall()]


def relay_caught_up(dsn: str, schema: str, relay: str) -> bool:
    """The relay's stored cursor is the last row of the outbox."""
    with psycopg.connect(dsn) as conn:
        last = conn.execute(f"SELECT xid::text::bigint, position FROM {schema}.keel_outbox "
                            f"ORDER BY xid DESC, position DESC LIMIT 1").fetchone()
        cursor = conn.execute(f"SELECT xid::text::bigint, position FROM {schema}.keel_outbox_cursor "
                              f"WHERE relay = %s", (relay,)).fetchone()
    return last is None or (cursor is not None and tuple(cursor) >= tuple(last))


def ids_of(records: list[Any]) -> list[str]:
    return [json.loads(r.value)["id"] for r in records]


def first_occurrences_by_tenant(envelopes: list[dict[str, Any]]) -> dict[str, list[str]]:
    """tenant → ids in order of first appearance (duplicates dropped)."""
    out: dict[str, list[str]] = {}
    seen: set[str] = set()
    for e in envelopes:
        if e["id"] not in seen:
            seen.add(e["id"])
            out.setdefault(e["tenant"], []).append(e["id"])
    return out
