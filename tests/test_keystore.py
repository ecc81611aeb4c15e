"""The KeyStore contract (keel/privacy.py), run against both backends: the key file and PostgreSQL
(keel/keystore_pg.py, services tier: KEEL_POSTGRES_DSN)."""
from __future__ import annotations

import base64
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from keel.errors import UsageError

MASTER = bytes(range(32))
OTHER = bytes(32)


def _file_backend(tmp_path: Path) -> Iterator[tuple[Callable, Callable[[], bytes]]]:
    from keel.keystore import FileKeyStore
    path = tmp_path / "keys.json"
    yield (lambda master=MASTER: FileKeyStore(path, master)), path.read_bytes


def _postgres_backend(tmp_path: Path) -> Iterator[tuple[Callable, Callable[[], bytes]]]:
    import psycopg
    from support.services import service_env

    from keel.keystore_pg import PostgresKeyStore
    dsn = service_env("KEEL_POSTGRES_DSN")
    schema = f"k_{uuid.uuid4().hex[:12]}"
    opened: list[PostgresKeyStore] = []

    def open_store(master: bytes = MASTER) -> PostgresKeyStore:
        store = PostgresKeyStore(dsn, master, schema=schema)
        opened.append(store)
        return store

    def contents() -> bytes:       # every row of every table, as text (what a dump of the store holds)
        with psycopg.connect(dsn) as conn:
            out = []
            for table in ("keel_keys", "keel_keys_erased", "keel_keys_erasures", "keel_keys_meta"):
                out += [repr(r) for r in conn.execute(f"SELECT t::text FROM {schema}.{table} t").fetchall()]
            out += [bytes(r[0]).hex() for r in conn.execute(f"SELECT wrapped FROM {schema}.keel_keys").fetchall()]
        return "\n".join(out).encode()

    try:
        yield open_store, contents
    finally:
        for store in opened:
            store.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@pytest.fixture(params=[pytest.param("file"), pytest.param("postgres", marks=pytest.mark.services)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Callable, Callable[[], bytes]]]:
    maker = _file_backend if request.param == "file" else _postgres_backend
    yield from maker(tmp_path)


class TestKeyStoreContract:
    def test_a_key_is_created_once_kept_and_only_wrapped(self, backend) -> None:
        open_store, contents = backend
        keys = open_store()
        kid, key = keys.key_for("t1", "client:c1")
        assert len(key) == 32 and keys.key_for("t1", "client:c1") == (kid, key)
        other_kid, other_key = keys.key_for("t1", "client:c2")
        assert other_kid != kid and other_key != key
        assert keys.key_for("t2", "client:c1")[0] not in (kid, other_kid)      # per (tenant, subject)
        text = contents()
        assert base64.b64encode(key) not in text and key.hex().encode() not in text and key not in text
        again = open_store()
        assert again.key(kid) == key and again.key_for("t1", "client:c1") == (kid, key)

    def test_prefetch_makes_keys_ready_and_leaves_erased_and_unknown_ids_to_key(self, backend) -> None:
        open_store, _ = backend
        keys = open_store()
        made = dict(keys.key_for("t1", f"client:c{i}") for i in range(5))
        erased_kid, _ = keys.key_for("t1", "client:gone")
        keys.erase("t1", "client:gone")
        reader = open_store()                        # another process: nothing unwrapped yet
        reader.prefetch([*made, erased_kid, "0" * 32])
        assert {kid: reader.key(kid) for kid in made} == made
        assert reader.key(erased_kid) is None
        with pytest.raises(UsageError, match="not in"):
            reader.key("0" * 32)

    def test_another_master_key_and_an_unknown_id_are_refused(self, backend) -> None:
        open_store, _ = backend
        keys = open_store()
        keys.key_for("t1", "client:c1")
        with pytest.raises(UsageError, match="another master key"):
            open_store(OTHER)
        with pytest.raises(UsageError, match="not in"):
            keys.key("0" * 32)

    def test_erase_deletes_the_keys_once_and_a_new_key_cannot_read_the_old(self, backend) -> None:
        open_store, contents = backend
        keys = open_store()
        kid, key = keys.key_for("t1", "client:c1")
        kept_kid, kept = keys.key_for("t1", "client:c2")
        assert keys.erasure("t1", "client:c1") is None
        assert keys.erase("t1", "client:c1", reason="request 7") == 1
        assert keys.key(kid) is None                    # erased: the mask, not an error
        assert open_store().key(kid) is None            # and for a process opening the store afterwards
        assert keys.key(kept_kid) == kept
        assert keys.erase("t1", "client:c1") == 0      # idempotent
        done = keys.erasure("t1", "client:c1")
        assert done is not None and done["keys"] == 1 and done["at"]
        assert keys.erasure("t2", "client:c1") is None
        text = contents()
        assert base64.b64encode(key) not in text and key.hex().encode() not in text
        new_kid, new_key = keys.key_for("t1", "client:c1")
        assert new_kid != kid and new_key != key


def test_an_unreachable_postgres_is_an_outage_not_a_crash() -> None:
    from keel.errors import ServiceUnavailable
    from keel.keystore_pg import PostgresKeyStore
    with pytest.raises(ServiceUnavailable, match="key store .PostgreSQL. connect failed") as e:
        PostgresKeyStore("postgresql://keel@127.0.0.1:1/keel", MASTER)
    assert base64.b64encode(MASTER).decode() not in str(e.value)


@pytest.mark.services
def test_the_key_store_reconnects_once_postgres_is_back() -> None:
    """A key store whose PostgreSQL went down refuses as an outage, then serves again on a new connection once
    the server is back (keel/pg.py), without being opened again."""
    from support.private_pg import private_postgres

    from keel.keystore_pg import KeyStoreUnavailable, PostgresKeyStore
    with private_postgres() as pg:
        keys = PostgresKeyStore(pg.dsn, MASTER, cache_seconds=0)
        try:
            kid, key = keys.key_for("t1", "client:c1")
            pg.stop()
            with pytest.raises(KeyStoreUnavailable, match="key store .PostgreSQL. key lookup failed"):
                keys.key(kid)
            pg.start()
            assert keys.key(kid) == key
            assert keys.key_for("t1", "client:c1") == (kid, key)
        finally:
            keys.close()


def test_one_key_store_at_a_time(tmp_path: Path) -> None:
    from keel.keystore_pg import open_key_store
    with pytest.raises(UsageError, match="not both"):
        open_key_store(keys_file=tmp_path / "k.json", keys_dsn="postgresql://x")
    assert open_key_store() is None
