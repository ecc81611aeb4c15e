"""The relay's side of PostgreSQL: read outbox rows past a cursor that never skips a late commit, store the
cursor, hold the per-relay lock, explain what holds the relay back, prune relayed rows.

The cursor is (xid8 of the writing transaction, position). A row is read only when its transaction id is
below `pg_snapshot_xmin(pg_current_snapshot())`, the oldest transaction still running in the cluster: every
transaction below it has committed or aborted, so no row can ever appear below the cursor later. Reading by
`position` alone would skip the rows of a transaction that took its positions early and committed late.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import psycopg
from psycopg import sql

from .outbox import OutboxTables, pg_guard


class Cursor(NamedTuple):
    """A point in outbox order: rows with a greater (xid, position) are still to relay."""
    xid: int
    position: int

    def __str__(self) -> str:
        return f"{self.xid}:{self.position}"


START = Cursor(0, 0)


@dataclass(frozen=True, slots=True)
class OutboxRow:
    """One outbox row as the relay reads it: the envelope as text (jsonb normalizes it) and its origin."""
    xid: int
    position: int
    created_at_us: int
    envelope: str

    @property
    def cursor(self) -> Cursor:
        return Cursor(self.xid, self.position)


@dataclass(frozen=True)
class HeldBack:
    """Committed rows past the cursor that wait for the oldest running transaction (the snapshot xmin)."""
    rows: int
    xmin: int


@dataclass(frozen=True)
class Blocker:
    """The oldest transaction holding an xid: what keeps xmin, hence the relay, from advancing."""
    xid: str
    pid: int | None
    database: str | None
    user: str | None
    state: str | None
    open_s: float | None
    query: str | None

    def describe(self) -> str:
        if self.pid is None:
            return f"prepared transaction {self.query!r} (xid {self.xid}, database {self.database})"
        age = f", open {self.open_s:.0f}s" if self.open_s is not None else ""
        query = f", last query {self.query[:80]!r}" if self.query else ""
        return (f"transaction xid {self.xid} (pid {self.pid}, database {self.database}, user {self.user}, "
                f"{self.state}{age}{query})")


class OutboxSource:
    """An async connection to the outbox database with the relay's statements (autocommit: every statement
    is its own transaction, so the relay itself never holds xmin back)."""

    def __init__(self, dsn: str, tables: OutboxTables) -> None:
        self.dsn = dsn
        self.tables = tables
        self._conn: psycopg.AsyncConnection | None = None
        t, c = tables.outbox, tables.cursor
        self._read = sql.SQL(
            "SELECT o.xid::text::bigint AS xid_n, o.position, "
            "(extract(epoch FROM o.created_at) * 1000000)::bigint AS created_us, o.envelope::text AS text "
            "FROM {t} o WHERE (o.xid, o.position) > (%s::xid8, %s::bigint) "
            "AND o.xid < pg_snapshot_xmin(pg_current_snapshot()) "
            "ORDER BY o.xid, o.position LIMIT %s").format(t=t)      # by the column: the index order, no sort
        self._held = sql.SQL(
            "SELECT count(*), pg_snapshot_xmin(pg_current_snapshot())::text::bigint FROM ("
            " SELECT 1 FROM {t} WHERE (xid, position) > (%s::xid8, %s::bigint)"
            " AND xid >= pg_snapshot_xmin(pg_current_snapshot()) LIMIT 100000) held").format(t=t)
        self._load = sql.SQL("SELECT xid::text::bigint, position FROM {c} WHERE relay = %s").format(c=c)
        self._store = sql.SQL(
            "INSERT INTO {c} AS cur (relay, xid, position, relayed, dead_lettered, updated_at) "
            "VALUES (%s, %s::xid8, %s, %s, %s, now()) ON CONFLICT (relay) DO UPDATE SET "
            "xid = EXCLUDED.xid, position = EXCLUDED.position, relayed = cur.relayed + EXCLUDED.relayed, "
            "dead_lettered = cur.dead_lettered + EXCLUDED.dead_lettered, updated_at = now() "
            "WHERE (cur.xid, cur.position) < (EXCLUDED.xid, EXCLUDED.position)").format(c=c)
        self._slowest = sql.SQL("SELECT c.xid::text::bigint AS xid_n, c.position FROM {c} c "
                                "ORDER BY c.xid, c.position LIMIT 1").format(c=c)
        self._prune = sql.SQL("DELETE FROM {t} WHERE (xid, position) > (%s::xid8, %s::bigint) "
                              "AND (xid, position) <= (%s::xid8, %s::bigint)").format(t=t)

    @property
    def conn(self) -> psycopg.AsyncConnection:
        if self._conn is None:
            raise RuntimeError("OutboxSource used before open()")
        return self._conn

    async def open(self) -> None:
        with pg_guard("connect", self.tables):
            self._conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True, connect_timeout=10,
                                                               application_name="keel-outbox-relay")
        with pg_guard("check the outbox", self.tables):      # fail early, with the init hint, when missing
            await self.conn.execute(sql.SQL("SELECT 1 FROM {t} LIMIT 0").format(t=self.tables.outbox))
            await self.conn.execute(sql.SQL("SELECT 1 FROM {c} LIMIT 0").format(c=self.tables.cursor))

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.close()
            except (psycopg.Error, OSError):
                return          # the connection is already gone; nothing left to release

    async def try_lock(self, relay: str) -> bool:
        """Take the session lock of this relay name on this table; one relay per name runs at a time (the
        lock is released when the session ends, also on kill -9)."""
        with pg_guard("advisory lock", self.tables):
            cur = await self.conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))",
                                          (f"keel-outbox-relay:{self.tables}:{relay}",))
            row = await cur.fetchone()
        return bool(row and row[0])

    async def load_cursor(self, relay: str) -> Cursor:
        with pg_guard("read the relay cursor", self.tables):
            cur = await self.conn.execute(self._load, (relay,))
            row = await cur.fetchone()
        return Cursor(int(row[0]), int(row[1])) if row else START

    async def read(self, after: Cursor, limit: int) -> list[OutboxRow]:
        """Up to `limit` rows past `after` in (xid, position) order, from finished transactions only."""
        with pg_guard("read the outbox", self.tables):
            cur = await self.conn.execute(self._read, (str(after.xid), after.position, limit))
            rows = await cur.fetchall()
        return [OutboxRow(int(x), int(p), int(c), e) for x, p, c, e in rows]

    async def store_cursor(self, relay: str, cursor: Cursor, relayed: int, dead_lettered: int) -> None:
        """Record progress; a cursor never moves backwards (a stale relay cannot rewind it)."""
        with pg_guard("store the relay cursor", self.tables):
            await self.conn.execute(self._store, (relay, str(cursor.xid), cursor.position, relayed, dead_lettered))

    async def held_back(self, after: Cursor) -> HeldBack:
        """Committed rows past the cursor that the relay may not read yet (up to 100,000 counted)."""
        with pg_guard("count held-back rows", self.tables):
            cur = await self.conn.execute(self._held, (str(after.xid), after.position))
            row = await cur.fetchone()
        assert row is not None
        return HeldBack(int(row[0]), int(row[1]))

    async def blocker(self) -> Blocker | None:
        """The oldest transaction holding an xid in any database of the cluster, prepared ones included."""
        with pg_guard("find the oldest transaction", self.tables):
            cur = await self.conn.execute(
                "SELECT xid, pid, datname, usename, state, open_s, query FROM ("
                " SELECT backend_xid AS x, backend_xid::text AS xid, pid, datname::text, usename::text, state,"
                "  extract(epoch FROM now() - xact_start)::float8 AS open_s, query FROM pg_stat_activity"
                "  WHERE backend_xid IS NOT NULL AND pid <> pg_backend_pid()"
                " UNION ALL"
                " SELECT transaction, transaction::text, NULL, database::text, owner::text, 'prepared',"
                "  extract(epoch FROM now() - prepared)::float8, gid FROM pg_prepared_xacts"
                ") s ORDER BY age(x) DESC LIMIT 1")
            row = await cur.fetchone()
        return Blocker(*row) if row is not None else None

    async def prune(self, after: Cursor) -> Cursor | None:
        """Delete rows every relay of this table has relayed, from `after` up to the slowest relay's cursor.
        Returns the new prune point (None when nothing was deleted)."""
        with pg_guard("prune the outbox", self.tables):
            cur = await self.conn.execute(self._slowest)
            row = await cur.fetchone()
            if row is None:
                return None
            slowest = Cursor(int(row[0]), int(row[1]))
            if slowest <= after:
                return None
            await self.conn.execute(self._prune, (str(after.xid), after.position, str(slowest.xid),
                                                  slowest.position))
        return slowest
