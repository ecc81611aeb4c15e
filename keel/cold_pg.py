"""The cold tier on PostgreSQL (`KEEL_COLD_DSN` / `--cold-dsn`): layout 2's closed segments and the change log's
old chunks, moved out of Redis.

A closed segment (keel/store/redis/segments.py) never changes once closed, so it can live anywhere; the present
(every entity's open segment) and the small indexes stay in Redis. `keel archive` (workers/archive.py) copies a
segment here, then deletes it from Redis in one Lua step that checks its content is unchanged and records it
cold (keel/store/redis/cold.py). Reads that find a closed segment missing from Redis fetch exactly those pieces
here, by primary key, and check each one's content hash.

Two tables, in the DSN's schema (`?options=-csearch_path%3D<schema>` picks another; created when missing):

    keel_cold_segments (namespace, tenant, generation, entity, seg, sha1, body, moved_at)
        primary key (namespace, tenant, generation, entity, seg); entity is escaped as in Redis keys
    keel_cold_changes (namespace, tenant, generation, position, writes, recorded_at, sha1, chunk, moved_at)
        primary key (namespace, tenant, generation, position), index on (..., recorded_at, position): the change
        log's old chunks (keel/store/redis/changelog.py), each as the Redis list held it

An upsert keyed by that primary key makes a repeated copy (a mover killed and run again) a no-op, never a
second row. The connection (opened at first use, again after a failure) and the translation of psycopg's errors
into ColdTierUnavailable (exit 3), naming the operation, never a value (bodies hold a tenant's facts), are
keel/pg.py's.
"""
from __future__ import annotations

import hashlib
import threading
import zlib
from binascii import a2b_base64
from collections.abc import Sequence
from typing import Any

import msgspec
import psycopg

from .errors import ColdTierUnavailable
from .pg import Postgres

_JSON = msgspec.json.encode
COLD_DSN_ENV = "KEEL_COLD_DSN"
TABLE = "keel_cold_segments"
CHANGES_TABLE = "keel_cold_changes"
CONNECT_TIMEOUT_S = 5          # a read that needs cold history while PostgreSQL is down fails within this
Piece = tuple[str, int]        # (escaped entity, segment number)

__all__ = ["CHANGES_TABLE", "COLD_DSN_ENV", "TABLE", "ColdStore", "Piece", "content_hash"]

_SEGMENTS_DDL = ((f"CREATE TABLE IF NOT EXISTS {TABLE} (namespace text NOT NULL, tenant text NOT NULL, "
                  "generation integer NOT NULL, entity text NOT NULL, seg integer NOT NULL, "
                  "sha1 text NOT NULL, body text NOT NULL, moved_at timestamptz NOT NULL DEFAULT now(), "
                  "PRIMARY KEY (namespace, tenant, generation, entity, seg))"),)
_CHANGES_DDL = ((f"CREATE TABLE IF NOT EXISTS {CHANGES_TABLE} (namespace text NOT NULL, tenant text NOT NULL, "
                 "generation integer NOT NULL, position bigint NOT NULL, writes integer NOT NULL, "
                 "recorded_at bigint NOT NULL, sha1 text NOT NULL, chunk text NOT NULL, moved_at timestamptz "
                 "NOT NULL DEFAULT now(), PRIMARY KEY (namespace, tenant, generation, position))"),
                (f"CREATE INDEX IF NOT EXISTS {CHANGES_TABLE}_recorded ON {CHANGES_TABLE} "
                 "(namespace, tenant, generation, recorded_at, position)"))


def content_hash(body: str) -> str:
    """SHA-1 of a segment's UTF-8 bytes, hex: what Redis's `redis.sha1hex` computes of the same string, so the
    Lua step that deletes a segment checks it against the copy's hash without sending the body back."""
    return hashlib.sha1(body.encode()).hexdigest()


class ColdStore:
    """Closed segments in PostgreSQL, shared by every process of a deployment (workers, tools servers, `keel
    archive`, `keel replay`). One connection per process, opened at first use and opened again after a failure,
    so a process started while PostgreSQL is down serves the present and reads cold history once it is back.
    Calls are serialized by a lock (reads of cold history are the rare ones)."""

    def __init__(self, dsn: str, *, connect_timeout: float = CONNECT_TIMEOUT_S) -> None:
        self._pg = Postgres(dsn, what="cold tier (PostgreSQL)", error=ColdTierUnavailable,
                            connect_timeout=connect_timeout, prepare=self._create)
        self._guard = self._pg.guard
        self._connection = self._pg.connection
        self._lock = threading.Lock()

    # ---- connection --------------------------------------------------------------------------

    @staticmethod
    def _create(conn: psycopg.Connection) -> None:
        for table, ddl in ((TABLE, _SEGMENTS_DDL), (CHANGES_TABLE, _CHANGES_DDL)):
            exists = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
            if exists is not None and exists[0] is not None:
                continue
            try:
                for statement in ddl:
                    conn.execute(statement)
            except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateTable):
                pass            # another process created it at the same moment

    def close(self) -> None:
        with self._lock:
            self._pg.close()

    def ping(self) -> None:
        """Raise ColdTierUnavailable unless PostgreSQL answers."""
        with self._lock, self._guard("ping"):
            self._connection().execute("SELECT 1")

    def _upsert(self, what: str, sql: str, rows: list[tuple[Any, ...]]) -> None:
        """Rows written by one statement in one transaction (an interrupted copy leaves none of them)."""
        with self._lock, self._guard(what):
            conn = self._connection()
            with conn.transaction(), conn.cursor() as cur:
                cur.executemany(sql, rows)

    # ---- segments ----------------------------------------------------------------------------

    def put(self, namespace: str, tenant: str, gen: int, pieces: Sequence[tuple[str, int, str, str]]) -> None:
        """Store closed segments `(escaped entity, n, sha1, body)` of one generation, in one transaction; a piece
        already stored is overwritten by the same content (segments are immutable), never doubled."""
        if not pieces:
            return
        self._upsert("copy of closed segments",
                     f"INSERT INTO {TABLE} (namespace, tenant, generation, entity, seg, sha1, body) "
                     "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (namespace, tenant, generation, entity, seg) "
                     "DO UPDATE SET sha1 = EXCLUDED.sha1, body = EXCLUDED.body",
                     [(namespace, tenant, int(gen), e, int(n), sha, body) for e, n, sha, body in pieces])

    def fetch(self, namespace: str, tenant: str, gen: int, pieces: Sequence[Piece]) -> dict[Piece, str]:
        """The bodies of the named pieces of one generation, each checked against its hash; a piece missing here
        (the cold tier lost or restored from an old backup) or altered is ColdTierUnavailable, never a partial
        answer."""
        wanted = list(dict.fromkeys((e, int(n)) for e, n in pieces))
        if not wanted:
            return {}
        with self._lock, self._guard("read of cold history"):
            rows = self._connection().execute(
                f"SELECT entity, seg, sha1, body FROM {TABLE} WHERE namespace = %s AND tenant = %s AND "
                "generation = %s AND (entity, seg) IN (SELECT * FROM unnest(%s::text[], %s::integer[]))",
                (namespace, tenant, int(gen), [e for e, _ in wanted], [n for _, n in wanted])).fetchall()
        out: dict[Piece, str] = {}
        for e, n, sha, body in rows:
            if content_hash(body) != sha:
                raise ColdTierUnavailable(f"cold tier (PostgreSQL): a closed segment of tenant {tenant!r} "
                                          f"(generation {gen}) does not match its hash (altered)", tenant=tenant)
            out[(e, int(n))] = body
        if len(out) != len(wanted):
            raise ColdTierUnavailable(
                f"cold tier (PostgreSQL) lacks {len(wanted) - len(out)} closed segment(s) of tenant {tenant!r} "
                f"(generation {gen}) that Redis says it holds: rebuild with `keel replay <cartridge> --all`",
                tenant=tenant)
        return out

    def forget(self, namespace: str, tenant: str, gen: int, pieces: Sequence[Piece]) -> int:
        """Delete some pieces (a copy whose Redis step found the generation gone); returns rows deleted."""
        if not pieces:
            return 0
        with self._lock, self._guard("delete of closed segments"):
            cur = self._connection().execute(
                f"DELETE FROM {TABLE} WHERE namespace = %s AND tenant = %s AND generation = %s AND "
                "(entity, seg) IN (SELECT * FROM unnest(%s::text[], %s::integer[]))",
                (namespace, tenant, int(gen), [e for e, _ in pieces], [int(n) for _, n in pieces]))
            return cur.rowcount

    # ---- change-log chunks -------------------------------------------------------------------

    def put_changes(self, namespace: str, tenant: str, gen: int, chunks: Sequence[tuple[int, int, int, str]]) -> None:
        """Store change-log chunks `(position, writes, recorded_at, chunk)` of one generation (the chunk as the
        Redis list holds it, `c<position>|...`), in one transaction; a chunk already stored is overwritten by the
        same content (chunks never change), never doubled."""
        if not chunks:
            return
        self._upsert("copy of change-log chunks",
                     f"INSERT INTO {CHANGES_TABLE} (namespace, tenant, generation, position, writes, recorded_at, "
                     "sha1, chunk) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (namespace, tenant, "
                     "generation, position) DO UPDATE SET writes = EXCLUDED.writes, recorded_at = "
                     "EXCLUDED.recorded_at, sha1 = EXCLUDED.sha1, chunk = EXCLUDED.chunk",
                     [(namespace, tenant, int(gen), int(p), int(w), int(r), content_hash(c), c)
                      for p, w, r, c in chunks])

    def changes(self, namespace: str, tenant: str, gen: int, below: int, count: int, *, start: int | None = None,
                since: int | None = None) -> list[str]:
        """The cold chunks one page of the change log needs, in log order: from the chunk holding position
        `start` (with `since` instead: the last chunk whose first write was recorded at or before it, else the
        first), on until they hold `count` writes past the page's start or reach `below` (the first position
        Redis holds). Each chunk is checked against its hash and the run for gaps: a chunk missing or altered is
        ColdTierUnavailable, never a short page. Two indexed queries, at most count + CHUNK_WRITES writes read."""
        key = (namespace, tenant, int(gen))
        where = f"FROM {CHANGES_TABLE} WHERE namespace = %s AND tenant = %s AND generation = %s"
        with self._lock, self._guard("read of cold change log"):
            conn = self._connection()
            if start is not None:
                row = conn.execute(f"SELECT position, writes {where} AND position <= %s ORDER BY position DESC "
                                   "LIMIT 1", (*key, int(start))).fetchone()
                lo, skip = (int(row[0]), int(start) - int(row[0])) if row else (-1, 0)
            else:
                row = conn.execute(f"SELECT position, writes {where} AND recorded_at <= %s ORDER BY recorded_at DESC, "
                                   "position DESC LIMIT 1", (*key, -(2 ** 63) if since is None else int(since))
                                   ).fetchone()
                lo, skip = (int(row[0]), int(row[1])) if row else (0, 0)
            need = int(count) + skip
            rows = [] if lo < 0 else conn.execute(
                f"SELECT position, writes, sha1, chunk FROM (SELECT position, writes, sha1, chunk, "
                f"sum(writes) OVER (ORDER BY position) - writes AS before FROM (SELECT position, writes, sha1, chunk "
                f"{where} AND position >= %s AND position < %s ORDER BY position LIMIT %s) y) x WHERE before < %s "
                f"ORDER BY position", (*key, lo, int(below), need, need)).fetchall()
        out: list[str] = []
        at, held = lo, 0
        for position, writes, sha, chunk in rows:
            if int(position) != at or content_hash(chunk) != sha:
                break
            out.append(chunk)
            at += int(writes)
            held += int(writes)
        if len(out) != len(rows) or not out or (held < need and at != below):
            raise ColdTierUnavailable(
                f"cold tier (PostgreSQL) lacks or altered change-log chunks of tenant {tenant!r} (generation {gen}) "
                f"below position {below} that Redis says it moved: rebuild with `keel replay <cartridge> --all`",
                tenant=tenant)
        return out

    def change_sizes(self, namespace: str) -> tuple[int, int, int]:
        """(chunks, bytes of the chunks as text, bytes on disk after PostgreSQL's compression) of a namespace."""
        with self._lock, self._guard("size query"):
            row = self._connection().execute(
                f"SELECT count(*), coalesce(sum(octet_length(chunk)), 0), coalesce(sum(pg_column_size(chunk)), 0) "
                f"FROM {CHANGES_TABLE} WHERE namespace = %s", (namespace,)).fetchone()
        assert row is not None
        return int(row[0]), int(row[1]), int(row[2])

    # ---- generations, tenants, namespaces ----------------------------------------------------

    def drop_generation(self, namespace: str, tenant: str, gen: int) -> int:
        """Delete a generation's rows (its Redis keys are dropped next); returns rows deleted."""
        with self._lock, self._guard("drop of a generation"):
            conn = self._connection()
            with conn.transaction():
                return sum(conn.execute(f"DELETE FROM {t} WHERE namespace = %s AND tenant = %s AND generation = %s",
                                        (namespace, tenant, int(gen))).rowcount for t in (TABLE, CHANGES_TABLE))

    def drop_tenant(self, namespace: str, tenant: str) -> int:
        """Delete every row of a tenant (offboarding, a tenant dropped)."""
        with self._lock, self._guard("drop of a tenant"):
            conn = self._connection()
            with conn.transaction():
                return sum(conn.execute(f"DELETE FROM {t} WHERE namespace = %s AND tenant = %s",
                                        (namespace, tenant)).rowcount for t in (TABLE, CHANGES_TABLE))

    def drop_namespace(self, namespace: str) -> int:
        with self._lock, self._guard("drop of a namespace"):
            conn = self._connection()
            with conn.transaction():
                return sum(conn.execute(f"DELETE FROM {t} WHERE namespace = %s", (namespace,)).rowcount
                           for t in (TABLE, CHANGES_TABLE))

    def generations(self, namespace: str) -> list[tuple[str, int]]:
        """(tenant, generation) pairs holding rows: what the mover checks against Redis for orphans."""
        with self._lock, self._guard("list of generations"):
            return [(t, int(g)) for t, g in self._connection().execute(
                f"SELECT tenant, generation FROM {TABLE} WHERE namespace = %s UNION "
                f"SELECT tenant, generation FROM {CHANGES_TABLE} WHERE namespace = %s ORDER BY 1, 2",
                (namespace, namespace)).fetchall()]

    def sizes(self, namespace: str) -> tuple[int, int, int]:
        """(rows, bytes of the bodies as text, bytes on disk after PostgreSQL's compression) of a namespace."""
        with self._lock, self._guard("size query"):
            row = self._connection().execute(
                f"SELECT count(*), coalesce(sum(octet_length(body)), 0), coalesce(sum(pg_column_size(body)), 0) "
                f"FROM {TABLE} WHERE namespace = %s", (namespace,)).fetchone()
        assert row is not None
        return int(row[0]), int(row[1]), int(row[2])

    def values_like(self, namespace: str, text: str) -> int:
        """How many rows of a namespace hold `text` (an erasure check: the count, never the rows): segments
        by `strpos`, change-log chunks (compressed) decompressed here, one at a time."""
        with self._lock, self._guard("scan"):
            conn = self._connection()
            row = conn.execute(f"SELECT count(*) FROM {TABLE} WHERE namespace = %s AND strpos(body, %s) > 0",
                               (namespace, text)).fetchone()
            found = int(row[0]) if row else 0
            quoted = _JSON(text).decode()[1:-1]          # as JSON writes it inside a string
            for (chunk,) in conn.execute(f"SELECT chunk FROM {CHANGES_TABLE} WHERE namespace = %s", (namespace,)):
                body = zlib.decompress(a2b_base64(chunk.split("|", 3)[3]), -15).decode()
                found += text in body or quoted in body
        return found
