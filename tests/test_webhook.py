"""The signed webhook: authentication, tenant binding, limits, per-event rejections, duplicates, routing —
in-process with a recording sink; then `keel webhook` against real Kafka."""
from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from support.outbox import (
    ROOT,
    Background,
    ingress_env,
    read_topic,
    sample_envelopes,
    services,
    unique_cartridge,
)

from keel.cartridge import load_cartridge
from keel.errors import UsageError
from keel.ingress.auth import Secrets, load_secrets, sign
from keel.ingress.errors import KafkaUnavailable, SecretsInvalid
from keel.ingress.records import OutRecord
from keel.ingress.webhook import Limits, WebhookHandler, create_app
from keel.times import parse_time

TENANT = "hogar-demo"
SECRET = "s3cret-of-hogar-demo-0123"
OTHER = "vecino"
OTHER_SECRET = "s3cret-of-vecino-456789"
NOW = parse_time("2026-11-30T12:00:00Z")


class RecordingSink:
    max_record_bytes = 1_000_000

    def __init__(self, fail: bool = False, hang: bool = False) -> None:
        self.records: list[OutRecord] = []
        self.fail = fail
        self.hang = hang

    def fits(self, record: OutRecord) -> bool:
        return record.size() <= self.max_record_bytes

    async def send_all(self, records: Sequence[OutRecord]) -> None:
        if self.fail:
            raise KafkaUnavailable("Kafka produce failed at test:9092: KafkaTimeoutError")
        if self.hang:              # Kafka down: the producer keeps retrying, nothing is acknowledged
            await asyncio.Event().wait()
        self.records += records


def secrets() -> Secrets:
    return Secrets({TENANT: (SECRET.encode(),), OTHER: (OTHER_SECRET.encode(), b"previous-secret-of-vecino")})


def jsonl(envelopes: list[Any]) -> bytes:
    return "".join((e if isinstance(e, str) else json.dumps(e)) + "\n" for e in envelopes).encode()


Call = Callable[..., Awaitable[tuple[int, dict[str, Any]]]]


def with_client(test: Callable[[Call, RecordingSink], Awaitable[None]], *, sink: RecordingSink | None = None,
                limits: Limits | None = None, cartridges: list[Path] | None = None) -> None:
    sink = sink or RecordingSink()
    limits = limits or Limits(max_body=64 * 1024, max_batch=50)
    loaded = [load_cartridge(p) for p in (cartridges or [ROOT / "cartridges" / "finance"])]
    handler = WebhookHandler(loaded, secrets, sink, limits, clock=lambda: NOW)

    async def go() -> None:
        async with TestClient(TestServer(create_app(handler, limits))) as client:
            async def call(body: bytes, *, tenant: str | None = TENANT, secret: str | None = SECRET,
                           path: str = "/events/finance", content_type: str = "application/x-ndjson",
                           signature: str | None = None, headers: dict[str, str] | None = None
                           ) -> tuple[int, dict[str, Any]]:
                h = {"Content-Type": content_type, **(headers or {})}
                if tenant is not None:
                    h["X-Keel-Tenant"] = tenant
                if signature is not None or secret is not None:
                    h["X-Keel-Signature"] = signature if signature is not None else sign(secret or "", body)
                response = await client.post(path, data=body, headers=h)
                return response.status, await response.json()
            await test(call, sink)
    asyncio.run(go())


def test_a_good_batch_is_produced_in_order_and_answered_with_its_ids() -> None:
    envelopes = sample_envelopes()

    async def test(call: Call, sink: RecordingSink) -> None:
        status, doc = await call(jsonl(envelopes))
        assert status == 202
        assert doc == {"cartridge": "finance", "tenant": TENANT, "accepted": [e["id"] for e in envelopes],
                       "rejected": [], "duplicates": []}
        assert [json.loads(r.value)["id"] for r in sink.records] == [e["id"] for e in envelopes]
        assert {r.key for r in sink.records} == {TENANT.encode()}
        assert {r.topic for r in sink.records} == {"keel.finance.events"}
        first = json.loads(sink.records[0].value)
        assert first["recorded_at"] == "2026-11-30T12:00:00Z" and first["source"] == "debts"   # canonical form
    with_client(test)


def test_one_envelope_a_json_array_and_unlabelled_json_lines_are_accepted() -> None:
    envelopes = sample_envelopes()[:3]

    async def test(call: Call, sink: RecordingSink) -> None:
        assert (await call(json.dumps(envelopes[0], indent=2).encode(), content_type="application/json"))[0] == 202
        assert (await call(json.dumps(envelopes).encode(), content_type="application/json"))[1]["accepted"] == \
            [e["id"] for e in envelopes]
        assert len((await call(jsonl(envelopes), content_type="application/json"))[1]["accepted"]) == 3
        assert len(sink.records) == 7
    with_client(test)


def test_bad_missing_or_foreign_signatures_are_refused_before_anything_is_read() -> None:
    body = jsonl(sample_envelopes()[:2])

    async def test(call: Call, sink: RecordingSink) -> None:
        for kwargs in ({"secret": "not-the-secret-at-all"}, {"secret": None}, {"tenant": None},
                       {"tenant": "nobody", "secret": SECRET}, {"signature": "sha256=" + "0" * 64},
                       {"signature": sign(SECRET, body)[len("sha256="):]}, {"signature": "sha256=é"},
                       {"tenant": OTHER, "secret": SECRET}):
            status, doc = await call(body, **kwargs)
            assert status == 401, kwargs
            assert "signature" in doc["error"]
        tampered_status, _ = await call(body + b"\n", signature=sign(SECRET, body))
        assert tampered_status == 401
        assert sink.records == []
        ok, _ = await call(body, signature=sign(SECRET, body).upper().replace("SHA256=", "sha256="))
        assert ok == 202                                   # hex case does not matter
    with_client(test)


def test_a_rotated_secret_verifies_with_either_value() -> None:
    env = {**sample_envelopes()[0], "tenant": OTHER}

    async def test(call: Call, sink: RecordingSink) -> None:
        assert (await call(jsonl([env]), tenant=OTHER, secret=OTHER_SECRET))[0] == 202
        assert (await call(jsonl([env]), tenant=OTHER, secret="previous-secret-of-vecino"))[0] == 202
    with_client(test)


def test_an_envelope_of_another_tenant_in_a_signed_batch_is_refused() -> None:
    good = sample_envelopes()[:3]
    foreign = {**good[1], "id": "foreign-1", "tenant": OTHER}

    async def test(call: Call, sink: RecordingSink) -> None:
        status, doc = await call(jsonl([good[0], foreign, good[2]]))
        assert status == 202 and doc["accepted"] == [good[0]["id"], good[2]["id"]]
        assert doc["rejected"] == [{"index": 1, "id": "foreign-1",
                                    "reason": f"tenant {OTHER!r} differs from the signing tenant {TENANT!r}"}]
        assert all(json.loads(r.value)["tenant"] == TENANT for r in sink.records)
        status, doc = await call(jsonl([foreign]))
        assert status == 400 and doc["accepted"] == [] and "differs from the signing tenant" in \
            doc["rejected"][0]["reason"]
    with_client(test)


def test_invalid_envelopes_are_listed_and_the_valid_ones_still_accepted() -> None:
    good = sample_envelopes()[:4]
    bad_payload = {**good[0], "id": "bad-payload", "payload": {**good[0]["payload"], "balance_cop": "a lot"}}
    unknown = {**good[0], "id": "unknown-type", "type": "debt.vanished"}

    async def test(call: Call, sink: RecordingSink) -> None:
        body = jsonl([good[0], bad_payload, good[1], '{"id": "broken", ', unknown, good[2], "[1, 2]", good[3]])
        status, doc = await call(body)
        assert status == 202
        assert doc["accepted"] == [e["id"] for e in good]
        reasons = {r["index"]: (r["id"], r["reason"]) for r in doc["rejected"]}
        assert sorted(reasons) == [1, 3, 4, 6]
        assert reasons[1][0] == "bad-payload" and "payload.balance_cop: expected number" in reasons[1][1]
        assert reasons[3][0] == "broken" and "not valid JSON" in reasons[3][1]
        assert "unknown event type 'debt.vanished'" in reasons[4][1]
        assert "JSON object" in reasons[6][1]
        assert [json.loads(r.value)["id"] for r in sink.records] == [e["id"] for e in good]
    with_client(test)


def test_nothing_valid_or_a_malformed_body_is_400() -> None:
    async def test(call: Call, sink: RecordingSink) -> None:
        status, doc = await call(b'{"id": "x", "tenant": "hogar-demo"}\nnot json\n')
        assert status == 400 and doc["error"] == "no valid envelope in the body" and len(doc["rejected"]) == 2
        for body in (b"", b"  \n ", b"[]"):
            status, doc = await call(body, content_type="application/json")
            assert status == 400 and "error" in doc
        assert sink.records == []
    with_client(test)


def test_duplicate_ids_in_a_batch_keep_the_first_and_report_the_rest() -> None:
    a, b = sample_envelopes()[:2]
    changed = {**a, "payload": {**a["payload"], "balance_cop": 1}}

    async def test(call: Call, sink: RecordingSink) -> None:
        status, doc = await call(jsonl([a, b, changed, a]))
        assert status == 202 and doc["accepted"] == [a["id"], b["id"]]
        assert doc["duplicates"] == [{"index": 2, "id": a["id"], "first": 0}, {"index": 3, "id": a["id"], "first": 0}]
        assert json.loads(sink.records[0].value)["payload"] == a["payload"]      # the first one wins
        assert len(sink.records) == 2
    with_client(test)


def test_bodies_and_batches_over_the_limits_are_413() -> None:
    envelopes = sample_envelopes()

    async def test(call: Call, sink: RecordingSink) -> None:
        big = jsonl(envelopes * 40)
        assert len(big) > 8 * 1024
        status, doc = await call(big)
        assert status == 413 and "--max-body" in doc["error"]
        status, doc = await call(jsonl(envelopes[:6]))
        assert status == 413 and "batch of 6 envelopes over 5" in doc["error"]
        assert (await call(jsonl(envelopes[:5])))[0] == 202
    with_client(test, limits=Limits(max_body=8 * 1024, max_batch=5))


def test_a_body_over_the_limit_without_content_length_is_413() -> None:
    limits = Limits(max_body=4096, max_batch=50)
    handler = WebhookHandler([load_cartridge(ROOT / "cartridges" / "finance")], secrets, RecordingSink(), limits)

    async def go() -> int:
        async def chunks():  # type: ignore[no-untyped-def]
            for _ in range(10):
                yield b"x" * 1024
        async with TestClient(TestServer(create_app(handler, limits))) as client:
            response = await client.post("/events/finance", data=chunks(),
                                         headers={"X-Keel-Tenant": TENANT, "X-Keel-Signature": "sha256=00"})
            return response.status
    assert asyncio.run(go()) == 413


def test_routes_are_by_cartridge_path(tmp_path: Path) -> None:
    fleet = ROOT / "cartridges" / "fleet"
    fleet_event = json.loads((fleet / "events.jsonl").read_text().splitlines()[0])
    fin = sample_envelopes()[0]

    async def test(call: Call, sink: RecordingSink) -> None:
        assert (await call(jsonl([fin])))[0] == 202
        status, doc = await call(jsonl([fin]), path="/events/fleet")
        assert status == 400 and "unknown event type" in doc["rejected"][0]["reason"]
        assert (await call(jsonl([{**fleet_event, "tenant": TENANT}]), path="/events/fleet"))[0] == 202
        status, doc = await call(jsonl([fin]), path="/events/nope")
        assert status == 404 and "/events/finance" in doc["error"]
        assert (await call(jsonl([fin]), path="/events"))[0] == 404      # ambiguous with two cartridges
        assert [r.topic for r in sink.records] == ["keel.finance.events", "keel.fleet.events"]
    with_client(test, cartridges=[ROOT / "cartridges" / "finance", fleet])


def test_kafka_failure_is_503_and_says_retry() -> None:
    async def test(call: Call, sink: RecordingSink) -> None:
        status, doc = await call(jsonl(sample_envelopes()[:1]))
        assert status == 503 and "retry" in doc["error"]
    with_client(test, sink=RecordingSink(fail=True))


def test_kafka_that_does_not_acknowledge_is_503_within_the_bound() -> None:
    """Issue 10: a request sent as Kafka stopped waited 105 s for a 202; now it is answered 503 in bounded time."""
    async def test(call: Call, sink: RecordingSink) -> None:
        status, doc = await call(jsonl(sample_envelopes()[:1]))
        assert status == 503 and "not acknowledged by Kafka within 0.2s" in doc["error"] and not sink.records
    with_client(test, sink=RecordingSink(hang=True), limits=Limits(max_body=64 * 1024, max_batch=50,
                                                                   kafka_timeout_s=0.2))


def test_secrets_file_format(tmp_path: Path) -> None:
    good = tmp_path / "secrets.yaml"
    good.write_text(f"{TENANT}: {SECRET}\n{OTHER}: [{OTHER_SECRET}, another-old-secret-value]\n")
    loaded = load_secrets(good)
    assert len(loaded) == 2 and loaded.verify(OTHER, b"x", sign("another-old-secret-value", b"x"))
    (tmp_path / "s.json").write_text(json.dumps({TENANT: SECRET}))
    assert load_secrets(tmp_path / "s.json").verify(TENANT, b"{}", sign(SECRET, b"{}"))
    for text, problem in ((f"{TENANT}: short\n", "at least 16 characters"), ("[a, b]\n", "mapping"),
                          ("'bad tenant!': 0123456789abcdef0\n", "not a tenant name"), ("{", "not valid YAML")):
        (tmp_path / "bad.yaml").write_text(text)
        with pytest.raises(SecretsInvalid, match=problem):
            load_secrets(tmp_path / "bad.yaml")
    with pytest.raises(UsageError, match="No such file"):
        load_secrets(tmp_path / "missing.yaml")


# ---- `keel webhook` with real Kafka -------------------------------------------------------------

@services
def test_keel_webhook_produces_accepted_events_to_kafka_and_stops_on_sigterm(tmp_path: Path) -> None:
    env = ingress_env()
    folder = unique_cartridge(tmp_path)
    cartridge = load_cartridge(folder)
    secrets_file = tmp_path / "secrets.yaml"
    secrets_file.write_text(f"{TENANT}: {SECRET}\n")
    secrets_file.chmod(0o600)
    server = Background(["webhook", str(folder), "--port", "0", "--secrets", str(secrets_file),
                         "--max-batch", "100"], env, tmp_path / "webhook.log")
    try:
        port = int(server.wait_for_line(r"listening on http://127\.0\.0\.1:(\d+)").group(1))
        good = sample_envelopes()
        bad = {**good[0], "id": "bad", "type": "debt.vanished"}
        body = jsonl(good[:5] + [bad] + good[5:] + [good[0]])

        def post(data: bytes, secret: str = SECRET) -> tuple[int, dict[str, Any]]:
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/events/{cartridge.name}", data=data, method="POST",
                headers={"Content-Type": "application/x-ndjson", "X-Keel-Tenant": TENANT,
                         "X-Keel-Signature": sign(secret, data)})
            try:
                with urllib.request.urlopen(request, timeout=30) as response:
                    return response.status, json.loads(response.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())

        status, doc = post(body)
        assert status == 202 and doc["accepted"] == [e["id"] for e in good]
        assert [r["index"] for r in doc["rejected"]] == [5] and doc["duplicates"][0]["id"] == good[0]["id"]
        assert post(body, secret="wrong-secret-wrong-secret")[0] == 401
        records = read_topic(env["KEEL_KAFKA_BOOTSTRAP"], cartridge.topic, until=lambda r: len(r) >= len(good))
        assert [json.loads(r.value)["id"] for r in records] == [e["id"] for e in good]
        assert {r.key for r in records} == {TENANT.encode()}
        assert server.terminate() == 0
        assert "stopped: 2 request(s) (202: 1, 401: 1)" in server.text()
    finally:
        if server.alive():
            server.kill()
