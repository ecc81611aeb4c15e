"""Personal fields at the ingress (issue 24; docs/privacy.md): the outbox relay and the webhook seal a cartridge's
personal fields with the key store before Kafka sees them, whether the product sent them in clear or sealed, and
a refused envelope's dead letter keeps them masked."""
from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from support.workers import services
from test_privacy import MASTER, SECRET_NAME, STREAM, plaintext_forms, store_at, write_cartridge
from test_webhook import SECRET, RecordingSink, secrets
from test_webhook import TENANT as SIGNER

from keel.cartridge import load_cartridge
from keel.ingress.auth import sign
from keel.ingress.encode import RowEncoder
from keel.ingress.sealing import IngressSealing
from keel.ingress.source import OutboxRow
from keel.ingress.webhook import Limits, WebhookHandler, create_app
from keel.privacy import Privacy, is_encrypted
from keel.wire import REASON

PERSONAL_VALUES = [SECRET_NAME, "+57 300 555 0101", "Ana Ruiz", "alérgica al látex"]


class Sink:
    """What RowEncoder asks of a sink: the record limit."""
    max_record_bytes = 1_000_000

    def fits(self, record: Any) -> bool:
        return record.size() <= self.max_record_bytes


def row(envelope: dict[str, Any] | str, position: int) -> OutboxRow:
    text = envelope if isinstance(envelope, str) else json.dumps(envelope, ensure_ascii=False)
    return OutboxRow(xid=7, position=position, envelope=text, created_at_us=1_764_000_000_000_000)


@pytest.fixture
def clinic(tmp_path: Path) -> tuple[Privacy, Path]:
    folder = write_cartridge(tmp_path / "clinic")
    return Privacy(load_cartridge(folder), store_at(tmp_path / "keys.json")), folder


def assert_no_plaintext(data: bytes) -> None:
    for value in PERSONAL_VALUES:
        for form in plaintext_forms(value):
            assert form not in data, value


def test_the_relay_seals_clear_and_sealed_rows_alike(clinic: tuple[Privacy, Path]) -> None:
    privacy, _ = clinic
    encoder = RowEncoder(privacy.cartridge, Sink(), "outbox", IngressSealing(privacy))  # type: ignore[arg-type]
    presealed = privacy.seal(dict(STREAM[1]))              # a product that seals itself (docs/privacy.md)
    assert is_encrypted(presealed["payload"]["name"])
    encoded = encoder.encode([row(STREAM[0], 1), row(presealed, 2), row(STREAM[2], 3)])
    assert (encoded.relayed, encoded.dead) == (3, 0)
    values = [r.value or b"" for r in encoded.records]
    assert_no_plaintext(b"\n".join(values))
    revealed = [privacy.reveal(json.loads(v)) for v in values]
    assert [e["payload"] for e in revealed] == [STREAM[0]["payload"], STREAM[1]["payload"], STREAM[2]["payload"]]
    assert all(r.key == e["tenant"].encode() for r, e in zip(encoded.records, revealed, strict=True))


def test_a_refused_row_keeps_its_personal_fields_masked(clinic: tuple[Privacy, Path]) -> None:
    privacy, _ = clinic
    encoder = RowEncoder(privacy.cartridge, Sink(), "outbox", IngressSealing(privacy))  # type: ignore[arg-type]
    no_price = {**STREAM[2], "payload": {k: v for k, v in STREAM[2]["payload"].items() if k != "price"}}
    tampered = privacy.seal(dict(STREAM[0]))
    tampered["payload"]["phone"] = {**tampered["payload"]["phone"], "iv": tampered["payload"]["name"]["iv"]}
    encoded = encoder.encode([row(no_price, 1), row(tampered, 2)])
    assert (encoded.relayed, encoded.dead) == (0, 2)
    letters = encoded.records
    assert all(r.topic == privacy.cartridge.dlq_topic for r in letters)
    assert_no_plaintext(b"\n".join((r.value or b"") + b"".join(v for _, v in r.headers) for r in letters))
    assert json.loads(letters[0].value or b"")["payload"]["remark"] == "(erased)"
    reasons = [dict(r.headers)[REASON].decode() for r in letters]
    assert "price" in reasons[0] and reasons[1].startswith("payload.phone: encrypted value")


def test_the_webhook_seals_before_producing(clinic: tuple[Privacy, Path]) -> None:
    privacy, _ = clinic
    sink = RecordingSink()
    limits = Limits(max_body=64 * 1024, max_batch=50)
    handler = WebhookHandler([privacy.cartridge], secrets, sink, limits,
                             sealing={privacy.cartridge.name: IngressSealing(privacy)})
    batch = [{**e, "tenant": SIGNER} for e in STREAM[:3]]
    body = "".join(json.dumps(e, ensure_ascii=False) + "\n" for e in batch).encode()

    async def go() -> tuple[int, dict[str, Any]]:
        async with TestClient(TestServer(create_app(handler, limits))) as client:
            response = await client.post(f"/events/{privacy.cartridge.name}", data=body, headers={
                "Content-Type": "application/x-ndjson", "X-Keel-Tenant": SIGNER, "X-Keel-Signature": sign(SECRET, body)})
            return response.status, await response.json()
    status, answer = asyncio.run(go())
    assert status == 202, answer
    assert answer["accepted"] == ["e1", "e2", "e3"]
    stored = b"\n".join(r.value or b"" for r in sink.records)
    assert_no_plaintext(stored)
    assert [privacy.reveal(json.loads(r.value or b""))["payload"] for r in sink.records] == \
        [e["payload"] for e in batch]


@pytest.fixture
def pg_keys() -> Iterator[tuple[str, str]]:
    """A PostgreSQL key store in a fresh schema (dropped afterwards): (dsn, schema)."""
    import psycopg
    from support.services import service_env
    dsn = service_env("KEEL_POSTGRES_DSN")
    schema = f"k_{uuid.uuid4().hex[:12]}"
    try:
        yield dsn, schema
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


@services
def test_a_key_store_outage_is_a_503_and_nothing_is_produced(tmp_path: Path, pg_keys: tuple[str, str]) -> None:
    """The key store's connection is cut (pg_terminate_backend): the webhook answers 503 with Retry-After and
    produces nothing in clear; the relay's step stops the same way (KeyStoreUnavailable), and its retry seals on
    a new connection (keel/pg.py)."""
    import psycopg

    from keel.keystore_pg import KeyStoreUnavailable, PostgresKeyStore
    dsn, schema = pg_keys
    folder = write_cartridge(tmp_path / "clinic")
    named = f"{dsn}{'&' if '?' in dsn else '?'}application_name={schema}"     # to find its connections
    privacy = Privacy(load_cartridge(folder), PostgresKeyStore(named, MASTER, schema=schema))
    relayed = Privacy(privacy.cartridge, PostgresKeyStore(named, MASTER, schema=schema))     # the relay's
    with psycopg.connect(dsn, autocommit=True) as conn:
        cut = conn.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
                           (schema,)).fetchone()
    assert cut == (2,)
    sink = RecordingSink()
    limits = Limits(max_body=64 * 1024, max_batch=50)
    handler = WebhookHandler([privacy.cartridge], secrets, sink, limits,
                             sealing={privacy.cartridge.name: IngressSealing(privacy)})
    body = (json.dumps({**STREAM[0], "tenant": SIGNER}, ensure_ascii=False) + "\n").encode()

    async def go() -> tuple[int, dict[str, Any], dict[str, str]]:
        async with TestClient(TestServer(create_app(handler, limits))) as client:
            response = await client.post(f"/events/{privacy.cartridge.name}", data=body, headers={
                "Content-Type": "application/x-ndjson", "X-Keel-Tenant": SIGNER, "X-Keel-Signature": sign(SECRET, body)})
            return response.status, await response.json(), dict(response.headers)
    status, answer, headers = asyncio.run(go())
    assert status == 503 and headers.get("Retry-After") == "5", answer
    assert "key store" in answer["error"] and sink.records == []
    assert_no_plaintext(json.dumps(answer, ensure_ascii=False).encode())
    encoder = RowEncoder(relayed.cartridge, Sink(), "outbox", IngressSealing(relayed))  # type: ignore[arg-type]
    with pytest.raises(KeyStoreUnavailable):
        encoder.encode([row(STREAM[1], 1)])
    retried = encoder.encode([row(STREAM[1], 1)])
    assert (retried.relayed, retried.dead) == (1, 0)
    assert_no_plaintext(b"\n".join(r.value or b"" for r in retried.records))


@services
def test_keel_outbox_relay_seals_with_its_key_store(tmp_path: Path) -> None:
    """The relay command end to end (PostgreSQL outbox → Kafka): rows in clear reach the topic sealed, a refused row
    reaches the dead-letter topic masked; without a key store the relay refuses to start (exit 2)."""
    import base64

    from support.outbox import fresh_schema, ingress_cli, ingress_env, insert_all, read_topic
    env = ingress_env()
    folder = write_cartridge(tmp_path / "clinic")
    text = (folder / "cartridge.yaml").read_text(encoding="utf-8")
    (folder / "cartridge.yaml").write_text(text.replace("name: clinic", f"name: p{uuid.uuid4().hex[:10]}", 1),
                                           encoding="utf-8")
    cartridge = load_cartridge(folder)
    keys = tmp_path / "keys.json"
    env = {**env, "KEEL_MASTER_KEY": base64.b64encode(MASTER).decode(), "KEEL_MASTER_KEY_FILE": "",
           "KEEL_KEYS_DSN": "", "KEEL_KEYS_FILE": ""}
    for schema in fresh_schema(env["KEEL_POSTGRES_DSN"]):
        ingress_cli("outbox", "init", "--schema", schema, env=env)
        refused = {**STREAM[0], "id": "no-phone", "payload": {"name": SECRET_NAME}}
        insert_all(env["KEEL_POSTGRES_DSN"], schema, [*STREAM[:3], refused])
        bare = ingress_cli("outbox", "relay", str(folder), "--schema", schema, "--once", env=env, check=False)
        assert bare.returncode == 2 and "declares personal fields" in bare.stderr
        out = ingress_cli("outbox", "relay", str(folder), "--schema", schema, "--once", "--keys", str(keys), env=env)
        assert "relayed 3 event(s), 1 dead letter(s)" in out.stderr
        events = read_topic(env["KEEL_KAFKA_BOOTSTRAP"], cartridge.topic, until=lambda r: len(r) >= 3)
        letters = read_topic(env["KEEL_KAFKA_BOOTSTRAP"], cartridge.dlq_topic, until=lambda r: len(r) >= 1)
        assert_no_plaintext(b"\n".join([r.value for r in events + letters]
                                       + [v for r in letters for _, v in r.headers] + [out.stdout.encode(),
                                                                                       out.stderr.encode()]))
        privacy = Privacy(cartridge, store_at(keys))
        assert [privacy.reveal(json.loads(r.value))["payload"] for r in events] == [e["payload"] for e in STREAM[:3]]
        assert json.loads(letters[0].value)["payload"]["name"] == "[erased]"
