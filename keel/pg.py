"""One PostgreSQL connection of a process, opened at first use and again after a failure, its errors translated.

The cold tier (cold_pg.py) and the durable key store (keystore_pg.py) each hold one `Postgres`: `connection()`
gives the open connection (autocommit), or opens a new one when there is none or the last one broke (so a
process that met PostgreSQL down serves again once it is back), running the owner's `prepare` (create the
tables, check them) on each new connection. `guard(what)` is the boundary: psycopg's errors (and the socket's
OSError) inside it become the owner's StoreUnavailable subclass (exit 3), naming the service and the
operation and psycopg's first line of text, never a statement's values (they hold a tenant's facts or keys).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg

from .errors import StoreUnavailable

__all__ = ["Postgres"]


class Postgres:
    """A lazily opened, reopened PostgreSQL connection. `what` names the service in error messages ("cold tier
    (PostgreSQL)"), `error` is the StoreUnavailable subclass raised by `guard`. Not thread-safe by itself: an
    owner shared by threads serializes its calls (ColdStore holds a lock)."""

    def __init__(self, dsn: str, *, what: str, error: type[StoreUnavailable], connect_timeout: float,
                 prepare: Callable[[psycopg.Connection], None] | None = None) -> None:
        self._dsn = dsn
        self._what = what
        self._error = error
        self._timeout = max(1, int(connect_timeout))
        self._prepare = prepare
        self._conn: psycopg.Connection | None = None

    def connection(self) -> psycopg.Connection:
        """The open connection, or a new one (prepared) when there is none or it broke. psycopg's errors pass
        through: call it inside `guard`."""
        conn = self._conn
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        self._conn = None
        conn = psycopg.connect(self._dsn, autocommit=True, connect_timeout=self._timeout)
        try:
            if self._prepare is not None:
                self._prepare(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    @contextmanager
    def guard(self, operation: str) -> Iterator[None]:
        """Translate psycopg's errors (and OSError) raised inside into `error`, naming `operation`."""
        try:
            yield
        except psycopg.Error as e:
            text = str(e).strip().splitlines()
            raise self._error(f"{self._what} {operation} failed: {type(e).__name__}: "
                              f"{text[0] if text else 'no detail'}") from e
        except OSError as e:
            raise self._error(f"{self._what} {operation} failed: {type(e).__name__}: {e}") from e
