"""The durable key store on PostgreSQL (`KEEL_KEYS_DSN` / `--keys-dsn`), the shared backend of the `KeyStore`
interface (keel/privacy.py) for the Kafka -> workers -> Redis path; the key file is the embedded one.

Tables (in an optional schema, created when missing):

* `keel_keys (kid, tenant, subject, wrapped, created_at)`: one current data key per (tenant, data subject),
  wrapped by the master key exactly as in the key file (AES-256-GCM, 12-byte IV first, the associated data
  naming tenant, subject and key id).
* `keel_keys_erased (kid, erased_at)`: the ids of erased keys (no key material), so an erased id reads as the
  mask and an id never held is an error.
* `keel_keys_erasures (tenant, subject, at, keys)`: one row per erasure (the answer to a second `keel erase`).
* `keel_keys_offboarded (tenant, at, keys)`: one row per offboarded tenant (keel offboard): no key is created
  for it afterwards.
* `keel_keys_meta (fingerprint)`: a fingerprint of the master key; a store written under another master key
  is refused.

Erasure deletes the key rows in one transaction; what that means for PostgreSQL's own copies (dead tuples
until VACUUM, the WAL, backups) is in docs/privacy.md. The connection (opened when the store is, again after a
failure) and the translation of psycopg's errors into `KeyStoreUnavailable` (exit 3), naming the operation,
never a key or a personal value, are keel/pg.py's.
"""
from __future__ import annotations

import hashlib
import re
import secrets
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from psycopg import sql

from .cartridge import Cartridge
from .config import Settings
from .errors import StoreUnavailable, UsageError
from .keystore import FileKeyStore, KeyStore, master_key, open_key_file, refuse_offboarded
from .pg import Postgres
from .privacy import Privacy
from .times import format_time, now_micros

KEYS_DSN_ENV = "KEEL_KEYS_DSN"
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,55}$")
CACHE_SECONDS = 5.0         # how long a process reuses an unwrapped key before asking the store again
CONNECT_TIMEOUT_S = 10


class KeyStoreUnavailable(StoreUnavailable):
    """The key store's database (PostgreSQL) could not be reached or refused a statement (exit 3). A
    StoreUnavailable, like the outbox's: a worker waits and retries it as an outage."""
    service = "PostgreSQL"


class PostgresKeyStore:
    """Data keys in PostgreSQL, wrapped by the master key. Several processes may share one store: a key is
    created with INSERT … ON CONFLICT (one per tenant and subject), an erasure is one transaction. A process
    keeps an unwrapped key (for reading and for sealing) at most `cache_seconds` before asking again, so an
    erasure by another process is seen within that time (the erasing process sees it at once)."""

    def __init__(self, dsn: str, master: bytes, *, schema: str | None = None,
                 cache_seconds: float = CACHE_SECONDS) -> None:
        if schema is not None and not _NAME.match(schema):
            raise UsageError(f"key store schema {schema!r}: use lower-case letters, digits and _")
        self._master = AESGCM(master)
        self._fingerprint = hashlib.sha256(b"keel.master/v1\0" + master).hexdigest()[:16]
        self._schema = schema
        self._cache_seconds = cache_seconds
        self._unwrapped: dict[str, tuple[bytes, float]] = {}     # key id -> (data key, until when it is reused)
        self._current: dict[tuple[str, str], str] = {}            # (tenant, subject) -> its key id
        self.where = "the key store (PostgreSQL)"
        self._pg = Postgres(dsn, what="key store (PostgreSQL)", error=KeyStoreUnavailable,
                            connect_timeout=CONNECT_TIMEOUT_S, prepare=self._create)
        self._guard = self._pg.guard
        with self._guard("connect"):        # at once: a wrong DSN or master key is refused when the store opens
            self._pg.connection()

    def _t(self, name: str) -> sql.Composable:
        return sql.Identifier(self._schema, name) if self._schema else sql.Identifier(name)

    def _create(self, conn: psycopg.Connection) -> None:
        """Create the tables when missing and check the master key's fingerprint (on each new connection)."""
        keys, erased, erasures, meta = (self._t(n) for n in ("keel_keys", "keel_keys_erased", "keel_keys_erasures",
                                                              "keel_keys_meta"))
        with self._guard("create its tables"), conn.transaction():
            if self._schema:
                conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(self._schema)))
            conn.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (kid text PRIMARY KEY, tenant text NOT NULL, subject text NOT NULL, "
                "wrapped bytea NOT NULL, created_at text NOT NULL, UNIQUE (tenant, subject))").format(keys))
            conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (kid text PRIMARY KEY, erased_at text NOT NULL)"
                                       ).format(erased))
            conn.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (n bigserial PRIMARY KEY, tenant text NOT NULL, subject text NOT NULL, "
                "at text NOT NULL, keys integer NOT NULL)").format(erasures))
            conn.execute(sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (tenant text PRIMARY KEY, at text NOT NULL, keys integer NOT NULL)"
            ).format(self._t("keel_keys_offboarded")))
            conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (one boolean PRIMARY KEY DEFAULT true "
                                       "CHECK (one), fingerprint text NOT NULL)").format(meta))
            conn.execute(sql.SQL("INSERT INTO {} (fingerprint) VALUES (%s) ON CONFLICT DO NOTHING"
                                       ).format(meta), (self._fingerprint,))
            row = conn.execute(sql.SQL("SELECT fingerprint FROM {}").format(meta)).fetchone()
        if row is None or row[0] != self._fingerprint:
            raise UsageError(f"{self.where} was written under another master key (check KEEL_MASTER_KEY / "
                             f"KEEL_MASTER_KEY_FILE)")

    @property
    def _conn(self) -> psycopg.Connection:
        """The open connection, reopened after a failure (call it inside `_guard`). A failed statement raises at
        once, so the statements of one method (one transaction) all run on one connection."""
        return self._pg.connection()

    def close(self) -> None:
        self._pg.close()

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Every key is stored when it is created; a block of work needs nothing more (the key file's API)."""
        yield

    @staticmethod
    def _wrap_ad(tenant: str, subject: str, kid: str) -> bytes:
        return FileKeyStore._wrap_ad(tenant, subject, kid)

    def _unwrap(self, kid: str, tenant: str, subject: str, wrapped: bytes) -> bytes:
        try:
            key = self._master.decrypt(wrapped[:12], wrapped[12:], self._wrap_ad(tenant, subject, kid))
        except (ValueError, InvalidTag):
            raise UsageError(f"{self.where}: key {kid!r} does not unwrap (altered)") from None
        self._unwrapped[kid] = (key, time.monotonic() + self._cache_seconds)
        return key

    def key_for(self, tenant: str, subject: str) -> tuple[str, bytes]:
        kid = self._current.get((tenant, subject))
        if kid is not None:
            known = self._unwrapped.get(kid)
            if known is not None and known[1] > time.monotonic():
                return kid, known[0]
        keys = self._t("keel_keys")
        with self._guard("key lookup"):
            row = self._conn.execute(sql.SQL("SELECT kid, wrapped FROM {} WHERE tenant = %s AND subject = %s"
                                             ).format(keys), (tenant, subject)).fetchone()
            if row is None:
                refuse_offboarded(self._offboarding(tenant))
                kid, key = secrets.token_hex(16), AESGCM.generate_key(bit_length=256)
                iv = secrets.token_bytes(12)
                wrapped = iv + self._master.encrypt(iv, key, self._wrap_ad(tenant, subject, kid))
                self._conn.execute(sql.SQL("INSERT INTO {} (kid, tenant, subject, wrapped, created_at) "
                                           "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (tenant, subject) DO NOTHING"
                                           ).format(keys), (kid, tenant, subject, wrapped, format_time(now_micros())))
                row = self._conn.execute(sql.SQL("SELECT kid, wrapped FROM {} WHERE tenant = %s AND subject = %s"
                                                 ).format(keys), (tenant, subject)).fetchone()
        if row is None:         # erased between the insert and the select: ask again
            return self.key_for(tenant, subject)
        self._current[(tenant, subject)] = row[0]
        return row[0], self._unwrap(row[0], tenant, subject, bytes(row[1]))

    def key(self, kid: str) -> bytes | None:
        known = self._unwrapped.get(kid)
        if known is not None and known[1] > time.monotonic():
            return known[0]
        with self._guard("key lookup"):
            row = self._conn.execute(sql.SQL("SELECT tenant, subject, wrapped FROM {} WHERE kid = %s"
                                             ).format(self._t("keel_keys")), (kid,)).fetchone()
            if row is None:
                self._unwrapped.pop(kid, None)
                gone = self._conn.execute(sql.SQL("SELECT 1 FROM {} WHERE kid = %s").format(
                    self._t("keel_keys_erased")), (kid,)).fetchone()
                if gone is not None:
                    return None
                raise UsageError(f"key {kid!r} is not in {self.where} (another key store?)")
        return self._unwrap(kid, row[0], row[1], bytes(row[2]))

    def prefetch(self, kids: Iterable[str]) -> None:
        now = time.monotonic()
        wanted = [k for k in kids if (known := self._unwrapped.get(k)) is None or known[1] <= now]
        if not wanted:
            return
        with self._guard("key lookup"):
            rows = self._conn.execute(sql.SQL("SELECT kid, tenant, subject, wrapped FROM {} WHERE kid = ANY(%s)"
                                              ).format(self._t("keel_keys")), (wanted,)).fetchall()
        for kid, tenant, subject, wrapped in rows:
            self._unwrap(kid, tenant, subject, bytes(wrapped))

    def erase(self, tenant: str, subject: str, *, reason: str | None = None) -> int:
        at = format_time(now_micros())
        with self._guard("erasure"), self._conn.transaction():
            kids = [r[0] for r in self._conn.execute(sql.SQL(
                "DELETE FROM {} WHERE tenant = %s AND subject = %s RETURNING kid").format(self._t("keel_keys")),
                (tenant, subject)).fetchall()]
            for kid in kids:
                self._conn.execute(sql.SQL("INSERT INTO {} (kid, erased_at) VALUES (%s, %s) ON CONFLICT DO NOTHING"
                                           ).format(self._t("keel_keys_erased")), (kid, at))
            if kids:
                self._conn.execute(sql.SQL("INSERT INTO {} (tenant, subject, at, keys) VALUES (%s, %s, %s, %s)"
                                           ).format(self._t("keel_keys_erasures")), (tenant, subject, at, len(kids)))
        for kid in kids:
            self._unwrapped.pop(kid, None)
        self._current.pop((tenant, subject), None)
        return len(kids)

    def erasure(self, tenant: str, subject: str) -> dict[str, Any] | None:
        with self._guard("erasure lookup"):
            row = self._conn.execute(sql.SQL("SELECT at, keys FROM {} WHERE tenant = %s AND subject = %s "
                                             "ORDER BY n DESC LIMIT 1").format(self._t("keel_keys_erasures")),
                                     (tenant, subject)).fetchone()
        return None if row is None else {"tenant": tenant, "subject": subject, "at": row[0], "keys": row[1]}

    def offboard(self, tenant: str, *, reason: str | None = None) -> dict[str, Any]:
        at = format_time(now_micros())
        with self._guard("offboarding"), self._conn.transaction():
            known = self._offboarding(tenant, lock=True)
            if known is not None:
                return known
            kids = [r[0] for r in self._conn.execute(sql.SQL(
                "DELETE FROM {} WHERE tenant = %s RETURNING kid").format(self._t("keel_keys")), (tenant,)).fetchall()]
            for kid in kids:
                self._conn.execute(sql.SQL("INSERT INTO {} (kid, erased_at) VALUES (%s, %s) ON CONFLICT DO NOTHING"
                                           ).format(self._t("keel_keys_erased")), (kid, at))
            self._conn.execute(sql.SQL("INSERT INTO {} (tenant, at, keys) VALUES (%s, %s, %s)").format(
                self._t("keel_keys_offboarded")), (tenant, at, len(kids)))
        for kid in kids:
            self._unwrapped.pop(kid, None)
        for pair in [p for p in self._current if p[0] == tenant]:
            del self._current[pair]
        return {"tenant": tenant, "at": at, "keys": len(kids)}

    def offboarding(self, tenant: str) -> dict[str, Any] | None:
        with self._guard("offboarding lookup"):
            return self._offboarding(tenant)

    def _offboarding(self, tenant: str, *, lock: bool = False) -> dict[str, Any] | None:
        if lock:        # one offboarding per tenant: a concurrent second call waits, then finds the first
            self._conn.execute(sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(self._t("keel_keys_offboarded")))
        row = self._conn.execute(sql.SQL("SELECT at, keys FROM {} WHERE tenant = %s").format(
            self._t("keel_keys_offboarded")), (tenant,)).fetchone()
        return None if row is None else {"tenant": tenant, "at": row[0], "keys": row[1]}


def open_key_store(*, keys_file: str | Path | None = None, keys_dsn: str | None = None,
                   master_file: str | Path | None = None, create: bool = False) -> KeyStore | None:
    """The key store a command was given: `--keys FILE` (the key file), else `--keys-dsn` (PostgreSQL); None
    when neither. Both at once is a usage error."""
    if keys_file and keys_dsn:
        raise UsageError("give one key store: --keys FILE or --keys-dsn (KEEL_KEYS_DSN), not both")
    if keys_file:
        return open_key_file(keys_file, create=create, master_file=master_file)
    if keys_dsn:
        return PostgresKeyStore(keys_dsn, master_key(file=master_file))
    return None


def privacy_of(cartridge: Cartridge, settings: Settings, *, create: bool = False) -> Privacy | None:
    """The Privacy of a cartridge over the key store of the settings (`--keys FILE` / KEEL_KEYS_FILE, or
    `--keys-dsn` / KEEL_KEYS_DSN); None for a cartridge without `personal:` fields. A cartridge with personal
    fields and no key store is a usage error: its sealed fields could be neither written nor read."""
    if not cartridge.spec.personal:
        return None
    require_key_store([cartridge], settings)
    keys = open_key_store(keys_file=settings.keys_file, keys_dsn=settings.keys_dsn,
                          master_file=settings.master_key_file, create=create)
    return Privacy(cartridge, keys)


def require_key_store(cartridges: list[Cartridge], settings: Settings) -> None:
    """Refuse (usage error) when a cartridge declares personal fields and no key store is given."""
    personal = [c.name for c in cartridges if c.spec.personal]
    if personal and not (settings.keys_file or settings.keys_dsn):
        raise UsageError(f"cartridge {personal[0]!r} declares personal fields (`personal:` in cartridge.yaml): give "
                         f"the key store, --keys-dsn DSN ({KEYS_DSN_ENV}) or --keys FILE (KEEL_KEYS_FILE), and the "
                         f"master key (KEEL_MASTER_KEY or KEEL_MASTER_KEY_FILE)")
