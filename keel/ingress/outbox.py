"""The outbox tables in PostgreSQL: names, creation (`keel outbox init`) and the shape check.

A product writes `INSERT INTO keel_outbox (envelope) VALUES ($1::jsonb)` in the same transaction as its
business change; `position`, `xid` (the writing transaction's id, `pg_current_xact_id()`) and `created_at`
have defaults. The cursor table holds, per relay name, the last (xid, position) relayed and acknowledged.
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg
from psycopg import sql

from . import DEFAULT_TABLE
from .errors import OutboxMissing, OutboxUnavailable

_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,55}$")
EXPECTED_COLUMNS = {"position": "bigint", "envelope": "jsonb", "xid": "xid8",
                    "created_at": "timestamp with time zone"}


@dataclass(frozen=True)
class OutboxTables:
    """Where the outbox lives: an optional schema, the outbox table and its cursor table `<table>_cursor`."""
    table: str = DEFAULT_TABLE
    schema: str | None = None

    def __post_init__(self) -> None:
        for what, name in (("table", self.table), ("schema", self.schema)):
            if name is not None and not _NAME.match(name):
                raise OutboxMissing(f"outbox {what} name {name!r}: use lower-case letters, digits and _ "
                                    f"(at most 56 characters, not starting with a digit)")

    @property
    def cursor_table(self) -> str:
        return f"{self.table}_cursor"

    def ident(self, name: str) -> sql.Composable:
        return sql.Identifier(self.schema, name) if self.schema else sql.Identifier(name)

    @property
    def outbox(self) -> sql.Composable:
        return self.ident(self.table)

    @property
    def cursor(self) -> sql.Composable:
        return self.ident(self.cursor_table)

    def __str__(self) -> str:
        return f"{self.schema}.{self.table}" if self.schema else self.table


@contextmanager
def pg_guard(what: str, tables: OutboxTables) -> Iterator[None]:
    """Translate psycopg errors into OutboxMissing (no table) or OutboxUnavailable, naming the operation."""
    try:
        yield
    except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName) as e:
        raise OutboxMissing(f"outbox table {tables} or its cursor table is missing ({e.diag.message_primary}); "
                            f"run `keel outbox init` with the same --schema/--table") from e
    except psycopg.Error as e:
        raise OutboxUnavailable(f"PostgreSQL {what} failed: {type(e).__name__}: {_first_line(e)}") from e
    except OSError as e:
        raise OutboxUnavailable(f"PostgreSQL {what} failed: {type(e).__name__}: {e}") from e


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else "no detail"


def create_table(tables: OutboxTables) -> list[sql.Composable]:
    """The statements creating the outbox itself when missing."""
    out: list[sql.Composable] = []
    if tables.schema:
        out.append(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(tables.schema)))
    out.append(sql.SQL(
        "CREATE TABLE IF NOT EXISTS {t} ("
        " position bigserial PRIMARY KEY,"
        " envelope jsonb NOT NULL,"
        " xid xid8 NOT NULL DEFAULT pg_current_xact_id(),"
        " created_at timestamptz NOT NULL DEFAULT now())").format(t=tables.outbox))
    return out


def create_rest(tables: OutboxTables) -> list[sql.Composable]:
    """The relay's index on the outbox, a comment for whoever finds the table, and the cursor table."""
    return [
        sql.SQL("CREATE INDEX IF NOT EXISTS {i} ON {t} (xid, position)").format(
            i=sql.Identifier(f"{tables.table}_xid_position"), t=tables.outbox),
        sql.SQL("COMMENT ON TABLE {t} IS {c}").format(t=tables.outbox, c=sql.Literal(
            "Keel transactional outbox: INSERT INTO this table (envelope) VALUES ($1::jsonb) in the same "
            "transaction as the business change; `keel outbox relay` publishes it to Kafka.")),
        sql.SQL(
            "CREATE TABLE IF NOT EXISTS {c} ("
            " relay text PRIMARY KEY,"
            " xid xid8 NOT NULL,"
            " position bigint NOT NULL,"
            " relayed bigint NOT NULL DEFAULT 0,"
            " dead_lettered bigint NOT NULL DEFAULT 0,"
            " updated_at timestamptz NOT NULL DEFAULT now())").format(c=tables.cursor)]


def init_outbox(dsn: str, tables: OutboxTables) -> list[str]:
    """Create the outbox and cursor tables when missing (idempotent, safe to run concurrently). An existing
    outbox of another shape is left alone and its problems returned (empty list: all is well)."""
    with pg_guard("outbox init", tables), psycopg.connect(dsn, connect_timeout=10) as conn:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('keel-outbox-init', 0))")
            for statement in create_table(tables):
                conn.execute(statement)
            problems = shape_problems(conn, tables)
            if problems:
                return problems
            for statement in create_rest(tables):
                conn.execute(statement)
        return []


def shape_problems(conn: psycopg.Connection, tables: OutboxTables) -> list[str]:
    """Columns of the outbox that differ from what the relay reads (a table made by hand, an old version)."""
    rows = conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
        "WHERE a.attrelid = %s::regclass AND a.attnum > 0 AND NOT a.attisdropped",
        (str(tables),)).fetchall()
    found = dict(rows)
    return [f"{tables}.{col}: expected {kind}, found {found.get(col) or 'no such column'}"
            for col, kind in EXPECTED_COLUMNS.items() if found.get(col) != kind]
