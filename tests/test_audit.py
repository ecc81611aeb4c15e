"""The audit log (keel.audit, issue 26): one record per MCP tool call over stdio and HTTP, no personal data in it,
and `keel audit replay` reproducing an answer byte for byte after more events changed the entity."""
from __future__ import annotations

import hashlib
import json
import secrets
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.mcp_sessions import (
    FINANCE,
    TENANT_A,
    canonical_tools,
    copy_finance,
    golden_text,
    http_server,
    http_session,
    make_token,
    memory_session,
    ok,
    sorted_json,
    stdio_session,
)
from test_oauth import Issuer

from keel import audit
from keel.audit import AuditFile, answer_bytes, kept_arguments, read_records
from keel.cartridge import load_cartridge
from keel.cli import main
from tools_server.backend import Backend
from tools_server.config import Identity, ServerConfig
from tools_server.server import build_server

NOTE = "pay due:visa-2026-11 first"
WHY = "Ana asked to forget it"


def later_snapshot(balance: int) -> dict[str, Any]:
    """A debt:visa snapshot recorded a minute from now: after any answer the test has recorded."""
    stamp = (datetime.now(UTC) + timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {"id": f"snap-visa-later-{balance}", "tenant": TENANT_A, "type": "debt.snapshot", "subject": "debt:visa",
            "occurred_at": "2026-11-01", "recorded_at": stamp,
            "payload": {"creditor": "Banco Andino", "product": "Visa", "balance_cop": balance, "rate_ea_pct": 29.22,
                        "installment_cop": 380000, "month": "2026-11"}}


def append(events: Path, *envelopes: dict[str, Any]) -> None:
    with events.open("a", encoding="utf-8") as f:
        f.writelines(json.dumps(e) + "\n" for e in envelopes)


def replay(log: Path, events: Path, record_id: str, capsys: pytest.CaptureFixture[str], *extra: str
           ) -> tuple[int, dict[str, Any] | str]:
    code = main(["audit", "replay", record_id, str(FINANCE), "--events", str(events), "--audit", str(log),
                 "--json", *extra])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else err


def test_kept_arguments_hash_free_text_and_drop_note_values() -> None:
    kept = kept_arguments("search", {"query": "Ana Pérez visa", "type": "debt", "limit": 5, "at": "2026-09-15",
                                     "known_at": None})
    assert kept == {"query": {"sha256": hashlib.sha256(b'"Ana P\xc3\xa9rez visa"').hexdigest()}, "type": "debt",
                    "limit": 5, "at": "2026-09-15"}
    kept = kept_arguments("annotate", {"entity": "debt:visa", "predicate": "next_step", "value": NOTE,
                                       "scope": "tenant", "evidence": "snap-visa"})
    assert "value" not in kept and set(kept["entity"]) == {"sha256"} and set(kept["evidence"]) == {"sha256"}
    assert kept["predicate"] == "next_step" and kept["scope"] == "tenant"
    kept = kept_arguments("annotate", {"entity": "debt:visa", "predicate": "next_step", "withdraw": True,
                                       "reason": "Ana asked us to forget it"})
    assert kept["withdraw"] is True and "reason" not in kept
    # a malformed argument in a name's place (free text, an object) is hashed, never kept as text
    kept = kept_arguments("history", {"entity": "debt:visa", "predicate": "Ana Pérez's diagnosis",
                                      "known_at": {"x": 1}})
    assert set(kept["predicate"]) == {"sha256"} and set(kept["known_at"]) == {"sha256"}


def test_answer_bytes_leave_out_what_is_not_reproducible() -> None:
    result = {"entity": "debt:visa", "at": None, "known_at": None, "facts": [], "known_through": "2026-11-01T00:00:00Z",
              "applied_through": "2026-12-01T00:00:00Z", "lag": 3, "lag_measured_at": "2026-12-01T00:00:00Z"}
    assert answer_bytes(result) == b'{"entity":"debt:visa","facts":[],"known_through":"2026-11-01T00:00:00Z"}'


def test_replay_reproduces_answers_after_the_entity_changed(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    events, log = copy_finance(tmp_path), tmp_path / "audit.jsonl"
    backend = Backend.embedded(load_cartridge(FINANCE), events)
    backend.audit = AuditFile(log)
    server = build_server(ServerConfig(backend, identity=Identity(TENANT_A, "debts", "visa-plan")))
    sent: dict[str, bytes] = {}

    async def call(s: Any, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        result = await s.call_tool(tool, arguments)
        assert not result.is_error, result.content[0].text
        sent[tool] = result.content[0].text.encode("utf-8")
        return result.structured_content

    async def go() -> dict[str, Any]:
        async with memory_session(server) as s:
            tools = (await s.list_tools()).tools
            assert sorted_json(canonical_tools(tools)) == sorted_json(golden_text())   # the surface is unchanged
            await call(s, "annotate", {"entity": "debt:visa", "predicate": "next_step", "value": NOTE,
                                       "scope": "tenant", "evidence": "snap-visa-2026-09"})
            await call(s, "annotate", {"entity": "debt:visa", "predicate": "next_step", "scope": "tenant",
                                       "evidence": "snap-visa-2026-09", "withdraw": True, "reason": WHY})
            now = await call(s, "context", {"entity": "debt:visa"})
            await call(s, "history", {"entity": "debt:visa", "predicate": "balance_cop"})
            await call(s, "search", {"query": "Visa", "type": "debt"})
            await call(s, "related", {"entity": "debt:visa", "relation": "for_debt"})
            bad = await s.call_tool("context", {"entity": "debt:*"})
            assert bad.is_error
            return now
    try:
        answered = anyio.run(go)
    finally:
        backend.close()

    records = list(read_records(log))
    assert [r["tool"] for r in records] == ["annotate", "annotate", "context", "history", "search", "related",
                                            "context"]
    assert records[1]["arguments"]["withdraw"] is True and "reason" not in records[1]["arguments"]
    by_tool = {r["tool"]: r for r in records[1:6]}
    text = log.read_text(encoding="utf-8")
    for secret in ("debt:visa", "Visa", NOTE, "snap-visa", WHY):          # entity ids, queries and note values never written
        assert secret not in text
    for tool, record in by_tool.items():
        assert (record["tenant"], record["agent"], record["task"], record["subject"]) == \
            (TENANT_A, "debts", "visa-plan", None)
        assert record["outcome"] == "ok" and record["cartridge"] == "finance"
        assert record["result_sha256"] == hashlib.sha256(sent[tool]).hexdigest()   # the exact bytes MCP sent
    context = by_tool["context"]
    assert context["known_through"] == answered["known_through"] and context["at"]    # the clock's world time
    assert context["answer_sha256"] == audit.sha256(answer_bytes(answered))
    assert records[-1]["outcome"] == "error" and records[-1]["answer_sha256"] is None

    append(events, later_snapshot(1234500))              # the entity changes after the answers
    assert main(["context", str(FINANCE), str(events), "debt:visa", "--json"]) == 0
    now = json.loads(capsys.readouterr().out)
    assert [f["value"] for f in now["facts"] if f["predicate"] == "balance_cop"] == [1234500]

    for tool in ("context", "history", "related"):
        code, verdict = replay(log, events, by_tool[tool]["id"], capsys, "--entity", "debt:visa")
        assert (code, verdict["identical"]) == (0, True), verdict
        assert verdict["replayed_sha256"] == by_tool[tool]["answer_sha256"]
    code, verdict = replay(log, events, by_tool["search"]["id"], capsys, "--query", "Visa")
    assert (code, verdict["identical"]) == (0, True), verdict

    # the human verdict, and `show`
    assert main(["audit", "replay", context["id"], str(FINANCE), str(events), "--audit", str(log),
                 "--entity", "debt:visa"]) == 0
    assert capsys.readouterr().out.startswith("identical: context as known at ")
    assert main(["audit", "show", context["id"], "--audit", str(log), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == context

    # refused: a wrong or missing plaintext, an annotate record, an unknown id
    assert replay(log, events, context["id"], capsys, "--entity", "debt:libranza")[0] == 2
    code, err = replay(log, events, context["id"], capsys)
    assert code == 2 and "--entity" in err
    code, err = replay(log, events, by_tool["annotate"]["id"], capsys, "--entity", "debt:visa")
    assert code == 2 and "cannot be replayed" in err
    assert replay(log, events, "nope", capsys)[0] == 2


def test_replay_says_when_the_answer_differs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A graph that is not the one the server answered from (here: a change recorded back then, inserted into the
    file afterwards) gives another answer, and replay says so (exit 1)."""
    events, log = copy_finance(tmp_path), tmp_path / "audit.jsonl"
    backend = Backend.embedded(load_cartridge(FINANCE), events)
    backend.audit = AuditFile(log)
    server = build_server(ServerConfig(backend, identity=Identity(TENANT_A)))

    async def go() -> None:
        async with memory_session(server) as s:
            await ok(s, "context", {"entity": "debt:visa", "at": "2026-09-15"})
    try:
        anyio.run(go)
    finally:
        backend.close()
    (record,) = read_records(log)
    assert record["at"] == "2026-09-15"
    lines = events.read_text(encoding="utf-8").splitlines()
    lines[0] = lines[0].replace("4200000", "4200001")    # the snapshot the answer showed, rewritten
    events.write_text("\n".join(lines) + "\n", encoding="utf-8")
    code, verdict = replay(log, events, record["id"], capsys, "--entity", "debt:visa")
    assert code == 1 and verdict["identical"] is False and verdict["why"]


def test_stdio_and_http_servers_append_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    events = copy_finance(tmp_path)
    stdio_log, http_log, tokens = tmp_path / "stdio.jsonl", tmp_path / "http.jsonl", tmp_path / "tokens.jsonl"

    async def over_stdio() -> None:
        async with stdio_session(str(FINANCE), "--events", str(events), "--agent", "debts", "--no-call-log",
                                 "--audit", str(stdio_log)) as s:
            await ok(s, "context", {"entity": "debt:visa"})
    anyio.run(over_stdio)
    (record,) = read_records(stdio_log)
    assert (record["tool"], record["tenant"], record["agent"]) == ("context", TENANT_A, "debts")

    token = make_token(tokens, TENANT_A, agent="planner")
    issuer = Issuer()                       # an OAuth issuer on loopback (tests/test_oauth.py)
    try:
        with http_server(tmp_path, str(FINANCE), "--events", str(events), "--tokens", str(tokens), "--issuer",
                         issuer.url, "--audit", str(http_log), "--no-call-log", "--stateless") as server:
            jwt = issuer.token(aud=server.url, task="t9")

            async def over_http() -> None:
                async with http_session(server.url, token) as s:
                    await ok(s, "related", {"entity": "debt:visa"})
                async with http_session(server.url, jwt) as s:
                    await ok(s, "history", {"entity": "debt:visa"})
            anyio.run(over_http)
    finally:
        issuer.close()
    record, signed = read_records(http_log)
    assert (record["tool"], record["tenant"], record["agent"]) == ("related", TENANT_A, "planner")
    digest = hashlib.sha256(token.encode()).hexdigest()                        # a static token's subject: its digest
    assert record["subject"] == hashlib.sha256(digest.encode()).hexdigest()  # kept hashed, like every subject
    assert (signed["tool"], signed["tenant"], signed["agent"], signed["task"], signed["subject"]) == \
        ("history", TENANT_A, "agent-7", "t9", hashlib.sha256(b"svc-1").hexdigest())   # an OAuth token: claims, sub hashed
    assert "svc-1" not in http_log.read_text()
    append(events, later_snapshot(999))
    code, verdict = replay(http_log, events, record["id"], capsys, "--entity", "debt:visa")
    assert (code, verdict["identical"]) == (0, True), verdict


@pytest.mark.services
def test_redis_answer_reproduced_and_kafka_topic_holds_records(tmp_path: Path, redis_url: str, kafka_bootstrap: str,
                                                               private_finance: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """On the Redis graph: records written to a Kafka audit topic and a file, read back by id from the topic, and
    `keel audit replay --redis` reproducing an answer after a later event changed the entity in Redis."""
    from keel.config import resolve
    from keel.embedded import replay_file
    from keel.kafka_audit import AuditTopic, find_topic_record
    from keel.projector import Projector
    from keel.store.redis import RedisStore

    cartridge = load_cartridge(private_finance)
    tenant = f"audit-{secrets.token_hex(4)}"
    store = RedisStore.from_url(redis_url, namespace=cartridge.name)
    private = f"audit-test-{secrets.token_hex(4)}"
    topic = f"keel.{private}.audit"             # a private topic, as `--audit kafka` names a cartridge's
    settings = resolve({"kafka": kafka_bootstrap})
    try:
        events = tmp_path / "events.jsonl"
        events.write_text("".join(json.dumps({**json.loads(line), "tenant": tenant}) + "\n" for line in
                                  (FINANCE / "events.jsonl").read_text(encoding="utf-8").splitlines()), "utf-8")
        assert not replay_file(Projector(cartridge, store), events).rejected
        log = tmp_path / "audit.jsonl"
        backend = Backend(cartridge, store, None, blocking=True)
        both = Both(AuditFile(log), AuditTopic(cartridge.name, settings, topic=topic))
        backend.audit = both
        server = build_server(ServerConfig(backend, identity=Identity(tenant, "a1")))

        async def go() -> None:
            async with memory_session(server) as s:
                await ok(s, "context", {"entity": "debt:visa"})
        anyio.run(go)
        both.close()
        (record,) = read_records(log)
        assert record["tenant"] == tenant and record["known_through"]
        assert find_topic_record(kafka_bootstrap, topic, record["id"]) == record
        assert main(["audit", "show", record["id"], "--audit", "kafka", "--cartridge", private, "--kafka",
                     kafka_bootstrap, "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == record

        later = tmp_path / "later.jsonl"
        later.write_text(json.dumps({**later_snapshot(777), "tenant": tenant}) + "\n", "utf-8")
        assert not replay_file(Projector(cartridge, store), later).rejected
        assert fact_value(store, cartridge, tenant) == 777                # the entity changed in Redis
        code = main(["audit", "replay", record["id"], str(private_finance), "--redis", redis_url, "--audit", str(log),
                     "--kafka", kafka_bootstrap, "--entity", "debt:visa", "--json"])
        verdict = json.loads(capsys.readouterr().out)
        assert (code, verdict["identical"]) == (0, True), verdict
    finally:
        store.drop_namespace()
        store.close()


class Both:
    """Two audit writers at once (the file and the topic), for the test above."""

    def __init__(self, *writers: Any) -> None:
        self.writers = writers

    def write(self, record: dict[str, Any]) -> None:
        for w in self.writers:
            w.write(record)

    def close(self) -> None:
        for w in self.writers:
            w.close()


def fact_value(store: Any, cartridge: Any, tenant: str) -> Any:
    from keel.tools import Tools
    context = Tools(cartridge, store, tenant).context("debt:visa")
    return next(f["value"] for f in context["facts"] if f["predicate"] == "balance_cop")
