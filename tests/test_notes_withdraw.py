"""Withdrawing a note (issue 27, item 2): annotate with `withdraw: true` closes the caller's own note now, as a
keel.annotated event with `withdraw: true` in the log; `history` shows the closed version with who, when and why.
On the embedded graph here, on Redis with a worker applying the log below (KEEL_REDIS_URL, KEEL_KAFKA_BOOTSTRAP)."""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.mcp_sessions import (
    FINANCE,
    ROOT,
    TENANT_A,
    copy_finance,
    memory_session,
    ok,
    refused,
    stop_process,
)

import keel
from keel.cartridge import load_cartridge
from keel.digest import digest
from keel.embedded import replay_file
from keel.projector import Projector
from keel.store.memory import MemoryStore
from tools_server.backend import Backend
from tools_server.config import Identity, ServerConfig
from tools_server.server import build_server

EVIDENCE = "snap-visa-2026-10"      # a domain event of the sample stream that wrote debt:visa


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def notes_named(facts: list[dict[str, Any]], predicate: str) -> list[Any]:
    return [f["value"] for f in facts if f["predicate"] == predicate]


def rebuilt(events: Path) -> MemoryStore:
    store = MemoryStore()
    report = replay_file(Projector(load_cartridge(FINANCE), store), events)
    assert not report.rejected, report.rejected
    return store


@pytest.fixture
def events(tmp_path: Path) -> Path:
    return copy_finance(tmp_path)


def test_withdrawn_note_leaves_context_and_stays_in_history(events: Path) -> None:
    with keel.open(FINANCE, events=events) as graph:
        me = graph.tools(tenant=TENANT_A, agent="a1", task="t1")
        written = me.annotate("debt:visa", "next_step", "prepay", scope="task")
        assert notes_named(me.context("debt:visa")["facts"], "next_step") == ["prepay"]
        done = me.annotate("debt:visa", "next_step", scope="task", withdraw=True, reason="paid already")
        assert done["applied"] is True and done["event_id"].startswith("withdrawal-")
        fact = done["fact"]
        assert fact["value"] == "prepay" and fact["valid_from"] == written["fact"]["valid_from"]
        assert fact["withdrawn"] == {"at": fact["valid_to"], "by": "agent:a1", "reason": "paid already",
                                     "event_id": done["event_id"], "evidence": None}
        assert notes_named(me.context("debt:visa")["facts"], "next_step") == []
        assert me.search("prepay")["results"] == []
        [version] = me.history("debt:visa", "next_step")["versions"]
        assert version == fact
        # bitemporal: before the withdrawal was recorded, the note was the belief, and history says nothing of it
        before = written["fact"]["recorded_at"]
        assert notes_named(me.context("debt:visa", at=before)["facts"], "next_step") == ["prepay"]
        [then] = me.history("debt:visa", "next_step", known_at=before)["versions"]
        assert "withdrawn" not in then and then["valid_to"] == then["expires_at"]
        # the same call again is a retry: the same answer, nothing written twice
        assert me.annotate("debt:visa", "next_step", scope="task", withdraw=True, reason="paid already") == \
            {**done, "known_through": done["known_through"]}
        # a note of the same name written afterwards is a new version, withdrawn by a new event
        me.annotate("debt:visa", "next_step", "call the bank", scope="task")
        again = me.annotate("debt:visa", "next_step", scope="task", withdraw=True)
        assert again["event_id"] != done["event_id"] and again["fact"]["withdrawn"]["reason"] is None
        assert [v.get("withdrawn", {}).get("event_id") for v in me.history("debt:visa", "next_step")["versions"]] \
            == [done["event_id"], again["event_id"]]
    log = lines(events)
    withdrawals = [e for e in log if e["type"] == "keel.annotated" and e["payload"].get("withdraw")]
    assert [e["id"] for e in withdrawals] == [done["event_id"], again["event_id"]]
    assert withdrawals[0]["by"] == "agent:a1" and "value" not in withdrawals[0]["payload"]
    assert withdrawals[0]["payload"]["reason"] == "paid already"


def test_the_same_note_written_again_after_its_withdrawal_is_a_new_note(events: Path) -> None:
    """Within the retry window, a note's id is the same for the same call, so a retry counts once; once the note
    was withdrawn, writing it again means it again: a new version, open, with a new id (and a retry of that write
    is once more the same one)."""
    with keel.open(FINANCE, events=events) as graph:
        me = graph.tools(tenant=TENANT_A, agent="a1", task="t1")
        first = me.annotate("debt:visa", "next_step", "prepay", scope="agent")
        me.annotate("debt:visa", "next_step", scope="agent", withdraw=True)
        again = me.annotate("debt:visa", "next_step", "prepay", scope="agent")
        assert again["applied"] and again["event_id"] != first["event_id"]
        assert again["fact"]["valid_to"] == again["fact"]["expires_at"] and "withdrawn" not in again["fact"]
        assert notes_named(me.context("debt:visa")["facts"], "next_step") == ["prepay"]
        assert me.annotate("debt:visa", "next_step", "prepay", scope="agent")["event_id"] == again["event_id"]
        versions = me.history("debt:visa", "next_step")["versions"]
        assert [("withdrawn" in v, v["valid_to"] == v["expires_at"]) for v in versions] == [(True, False),
                                                                                            (False, True)]
    notes = [e["id"] for e in lines(events) if e["type"] == "keel.annotated" and not e["payload"].get("withdraw")]
    assert notes == [first["event_id"], again["event_id"]]


def test_log_replayed_is_the_graph_that_wrote_it(events: Path) -> None:
    with keel.open(FINANCE, events=events) as graph:
        me = graph.tools(tenant=TENANT_A, agent="a1", task="t1")
        me.annotate("debt:visa", "next_step", "prepay", scope="task")
        me.annotate("debt:visa", "risk", "high", scope="tenant", evidence=EVIDENCE)
        me.annotate("debt:visa", "mine", 1, scope="agent")
        me.annotate("debt:visa", "next_step", scope="task", withdraw=True, reason="done")
        me.annotate("debt:visa", "risk", scope="tenant", withdraw=True, evidence=EVIDENCE, reason="rates fell")
        me.annotate("debt:visa", "mine", scope="agent", withdraw=True)
        live = digest(graph.store, TENANT_A)
        assert me.context("debt:visa")["facts"] == [f for f in me.context("debt:visa")["facts"]
                                                    if f["predicate"] not in ("next_step", "risk", "mine")]
    assert digest(rebuilt(events), TENANT_A) == live


def test_another_agents_note_is_refused(events: Path) -> None:
    with keel.open(FINANCE, events=events) as graph:
        mine = graph.tools(tenant=TENANT_A, agent="a1", task="t1")
        other = graph.tools(tenant=TENANT_A, agent="b2", task="t1")         # same task: sees the task note
        mine.annotate("debt:visa", "next_step", "prepay", scope="task")
        mine.annotate("debt:visa", "risk", "high", scope="tenant", evidence=EVIDENCE)
        for scope, evidence in (("task", None), ("tenant", EVIDENCE)):
            pred = "next_step" if scope == "task" else "risk"
            with pytest.raises(keel.NoteRefused, match="written by another agent; only its writer may withdraw"):
                other.annotate("debt:visa", pred, scope=scope, withdraw=True, evidence=evidence)
        with pytest.raises(keel.NoteRefused, match="no agent note 'mine' is in force"):
            other.annotate("debt:visa", "mine", scope="agent", withdraw=True)      # its own timeline is empty
        anonymous = graph.tools(tenant=TENANT_A, task="t1")
        with pytest.raises(keel.NoteRefused, match="needs an agent binding"):
            anonymous.annotate("debt:visa", "next_step", scope="task", withdraw=True)
        assert notes_named(mine.context("debt:visa")["facts"], "next_step") == ["prepay"]
        assert notes_named(mine.context("debt:visa")["facts"], "risk") == ["high"]
    assert not [e for e in lines(events) if e["payload"].get("withdraw")]        # nothing reached the log


def test_tenant_note_needs_evidence_to_be_withdrawn(events: Path) -> None:
    with keel.open(FINANCE, events=events) as graph:
        me = graph.tools(tenant=TENANT_A, agent="a1")
        me.annotate("debt:visa", "risk", "high", scope="tenant", evidence=EVIDENCE)
        with pytest.raises(keel.NoteRefused, match="this scope requires evidence"):
            me.annotate("debt:visa", "risk", scope="tenant", withdraw=True, reason="rates fell")
        with pytest.raises(keel.NoteRefused, match="is not an event of this tenant"):
            me.annotate("debt:visa", "risk", scope="tenant", withdraw=True, evidence="no-such-event")
        assert notes_named(me.context("debt:visa")["facts"], "risk") == ["high"]
        done = me.annotate("debt:visa", "risk", scope="tenant", withdraw=True, evidence=EVIDENCE, reason="rates fell")
        assert done["fact"]["withdrawn"]["evidence"] == EVIDENCE
        assert notes_named(me.context("debt:visa")["facts"], "risk") == []
        with pytest.raises(keel.NoteRefused, match="no tenant note 'risk' is in force"):
            graph.tools(tenant=TENANT_A, agent="a2").annotate("debt:visa", "risk", scope="tenant", withdraw=True,
                                                              evidence=EVIDENCE)


def test_global_notes_cannot_be_withdrawn(events: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEEL_ALLOW_GLOBAL_NOTES", "1")
    with keel.open(FINANCE, events=events) as graph:
        me = graph.tools(tenant=TENANT_A, agent="a1")
        me.annotate("type:debt", "tip", "compare rates", scope="global", evidence=EVIDENCE)
        with pytest.raises(keel.NoteRefused, match="global notes cannot be withdrawn"):
            me.annotate("type:debt", "tip", scope="global", withdraw=True, evidence=EVIDENCE)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"value": "x", "withdraw": True}, "value: a withdrawal takes no value"),
    ({"value": "x", "reason": "why"}, "reason: only a withdrawal"),
    ({}, "value: required"),
    ({"withdraw": "yes"}, "withdraw: true"),
    ({"withdraw": True, "reason": "x" * 513}, "reason: expected a string of at most 512"),
])
def test_bad_arguments_are_usage_errors(events: Path, kwargs: dict[str, Any], message: str) -> None:
    with keel.open(FINANCE, events=events) as graph, pytest.raises(keel.UsageError, match=message):
        graph.tools(tenant=TENANT_A, agent="a1", task="t1").annotate("debt:visa", "next_step", scope="task",
                                                                      **kwargs)


def withdrawal(by: str, **payload: Any) -> dict[str, Any]:
    return {"id": f"w-{by}", "tenant": TENANT_A, "type": "keel.annotated", "subject": "debt:visa",
            "occurred_at": "2030-01-02T00:00:00Z", "by": by,
            "payload": {"predicate": "risk", "scope": "tenant", "withdraw": True, "evidence": EVIDENCE, **payload}}


def test_the_log_is_checked_again_when_applied(tmp_path: Path) -> None:
    """A withdrawal in the log (another producer's, or one whose note changed hands meanwhile) gets the tool's
    checks when applied: refused with the reason, or applied like the tool's."""
    events = copy_finance(tmp_path)
    note = {"id": "n-1", "tenant": TENANT_A, "type": "keel.annotated", "subject": "debt:visa",
            "occurred_at": "2030-01-01T00:00:00Z", "by": "agent:a1",
            "payload": {"predicate": "risk", "value": "high", "scope": "tenant", "evidence": EVIDENCE}}
    bad = [withdrawal("agent:b2"), {**withdrawal("agent:a1"), "id": "w-noev", "payload": {
        "predicate": "risk", "scope": "tenant", "withdraw": True}},
        {**withdrawal("agent:a1"), "id": "w-value", "payload": {**withdrawal("agent:a1")["payload"], "value": 1}},
        {**withdrawal("agent:a1"), "id": "w-false", "payload": {**withdrawal("agent:a1")["payload"],
                                                                "withdraw": False}}]
    with events.open("a", encoding="utf-8") as f:
        for e in [note, *bad, withdrawal("agent:a1", reason="rates fell")]:
            f.write(json.dumps(e) + "\n")
    store = MemoryStore()
    report = replay_file(Projector(load_cartridge(FINANCE), store), events)
    reasons = {r.event_id: r.reason for r in report.rejected}
    assert set(reasons) == {"w-agent:b2", "w-noev", "w-value", "w-false"}
    assert "written by another agent" in reasons["w-agent:b2"]
    assert "this scope requires evidence" in reasons["w-noev"]
    assert "a withdrawal (withdraw: true) carries no value" in reasons["w-value"]
    assert "payload.withdraw: true (a withdrawal) or absent" in reasons["w-false"]
    [(_, assertions)] = [(k, a) for k, a in store.dump(TENANT_A) if k == ("f", "debt:visa", "risk", "tenant")]
    end = assertions[-1]
    assert end.closed and end.value == {"keel.withdrawn": "w-agent:a1", "reason": "rates fell"}
    assert (end.by, end.evidence) == ("agent:a1", EVIDENCE)


def test_withdraw_over_mcp(events: Path) -> None:
    """The annotate tool takes withdraw and reason; its result is the Python call's (the closed version)."""
    backend = Backend.embedded(load_cartridge(FINANCE), events)
    visa = {"entity": "debt:visa", "predicate": "risk", "scope": "tenant", "evidence": EVIDENCE}

    async def writer(s: Any) -> None:
        await ok(s, "annotate", {**visa, "value": "high"})
        assert "takes no value" in await refused(s, "annotate", {**visa, "value": "x", "withdraw": True})
        assert "only a withdrawal" in await refused(s, "annotate", {**visa, "value": "x", "reason": "r"})
        assert "requires evidence" in await refused(s, "annotate", {**visa, "evidence": None, "withdraw": True})

    async def other(s: Any) -> None:
        assert "written by another agent" in await refused(s, "annotate", {**visa, "withdraw": True})

    async def withdraw(s: Any) -> None:
        done = await ok(s, "annotate", {**visa, "withdraw": True, "reason": "rates fell"})
        assert done["fact"]["withdrawn"]["reason"] == "rates fell" and done["fact"]["withdrawn"]["by"] == "agent:a1"
        assert not [f for f in (await ok(s, "context", {"entity": "debt:visa"}))["facts"] if f["predicate"] == "risk"]
        [version] = (await ok(s, "history", {"entity": "debt:visa", "predicate": "risk"}))["versions"]
        assert version == done["fact"]

    for identity, body in ((Identity(TENANT_A, "a1"), writer), (Identity(TENANT_A, "b2"), other),
                           (Identity(TENANT_A, "a1"), withdraw)):
        server = build_server(ServerConfig(backend, identity=identity))

        async def go(server: Any = server, body: Any = body) -> None:
            async with memory_session(server) as session:
                await body(session)
        anyio.run(go)


@pytest.mark.parametrize(("payload", "valid"), [
    ({"predicate": "risk", "scope": "tenant", "withdraw": True}, True),
    ({"predicate": "risk", "scope": "tenant", "withdraw": True, "reason": "rates fell", "evidence": EVIDENCE}, True),
    ({"predicate": "risk", "scope": "tenant", "value": "high"}, True),
    ({"predicate": "risk", "scope": "tenant", "withdraw": True, "value": "high"}, False),
    ({"predicate": "risk", "scope": "tenant", "value": "high", "reason": "why"}, False),
    ({"predicate": "risk", "scope": "tenant", "withdraw": False}, False),
    ({"predicate": "risk", "scope": "tenant"}, False),
    ({"predicate": "risk", "scope": "tenant", "withdraw": True, "reason": "x" * 513}, False),
])
def test_the_json_schema_and_keel_agree_on_withdrawals(payload: dict[str, Any], valid: bool) -> None:
    """keel schema's document for keel.annotated (what producers validate with) says what the envelope check
    says about a withdrawal's payload."""
    import jsonschema

    from keel.envelope import Catalog
    from keel.errors import EnvelopeRejected
    from keel.schema import cartridge_document
    cartridge = load_cartridge(FINANCE)
    env = {"id": "w", "tenant": TENANT_A, "type": "keel.annotated", "subject": "debt:visa",
           "occurred_at": "2026-10-01", "payload": payload}
    assert jsonschema.Draft202012Validator(cartridge_document(cartridge)).is_valid(env) is valid
    try:
        Catalog(cartridge).parse(env)
    except EnvelopeRejected:
        assert not valid
    else:
        assert valid


# ---- Redis: a worker applies the log -----------------------------------------------------------------

@pytest.fixture
def tenant() -> str:
    return f"wd-{secrets.token_hex(4)}"


@pytest.fixture
def redis_store(redis_url: str, private_finance: Path) -> Iterator[Any]:
    from keel.store.redis import RedisStore
    store = RedisStore.from_url(redis_url, namespace=load_cartridge(private_finance).name)
    try:
        yield store
    finally:
        store.drop_namespace()
        store.close()


def moved(tmp_path: Path, tenant: str) -> Path:
    """The finance stream moved to a private tenant."""
    out = tmp_path / "events.jsonl"
    out.write_text("".join(json.dumps({**e, "tenant": tenant}) + "\n" for e in lines(FINANCE / "events.jsonl")),
                   encoding="utf-8")
    return out


@pytest.mark.services
def test_redis_worker_builds_the_embedded_graph(tmp_path: Path, tenant: str, redis_url: str, kafka_bootstrap: str,
                                               redis_store: Any, private_finance: Path) -> None:
    """Notes written and withdrawn on the embedded graph, the log published, a worker applying it to Redis: the
    same digest; then withdrawals through Kafka and the worker behave as embedded ones do."""
    events = moved(tmp_path, tenant)
    with keel.open(private_finance, events=events) as graph:
        me = graph.tools(tenant=tenant, agent="a1", task="t1")
        me.annotate("debt:visa", "next_step", "prepay", scope="task")
        me.annotate("debt:visa", "risk", "high", scope="tenant", evidence=EVIDENCE)
        me.annotate("debt:visa", "next_step", scope="task", withdraw=True, reason="done")
        last = me.annotate("debt:visa", "risk", scope="tenant", withdraw=True, evidence=EVIDENCE, reason="rates fell")
        embedded = digest(graph.store, tenant)
        embedded_history = me.history("debt:visa")["versions"]
    env = {**os.environ, "KEEL_REDIS_URL": redis_url, "KEEL_KAFKA_BOOTSTRAP": kafka_bootstrap}
    cli = [sys.executable, "-m", "keel.cli"]
    subprocess.run([*cli, "publish", str(private_finance), str(events)], cwd=str(ROOT), env=env, check=True,
                   capture_output=True, timeout=120)
    with (tmp_path / "worker.log").open("wb") as log:
        proc = subprocess.Popen([*cli, "worker", str(private_finance)], cwd=str(ROOT), env=env, stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not redis_store.has_event(tenant, last["event_id"]):
            assert proc.poll() is None, (tmp_path / "worker.log").read_text()
            assert time.monotonic() < deadline, "the worker did not apply the log in 120 s"
            time.sleep(0.2)
        assert digest(redis_store, tenant) == embedded
        with keel.open(private_finance, redis=redis_url, kafka=kafka_bootstrap) as graph:
            me = graph.tools(tenant=tenant, agent="a1", task="t1")
            assert me.history("debt:visa")["versions"] == embedded_history
            other = graph.tools(tenant=tenant, agent="b2", task="t1")
            me.annotate("debt:visa", "next_step", "call the bank", scope="task")
            assert notes_named(other.context("debt:visa")["facts"], "next_step") == ["call the bank"]
            with pytest.raises(keel.NoteRefused, match="written by another agent"):
                other.annotate("debt:visa", "next_step", scope="task", withdraw=True)
            me.annotate("debt:visa", "risk", "low", scope="tenant", evidence=EVIDENCE)
            with pytest.raises(keel.NoteRefused, match="this scope requires evidence"):
                me.annotate("debt:visa", "risk", scope="tenant", withdraw=True)
            done = me.annotate("debt:visa", "next_step", scope="task", withdraw=True, reason="called")
            assert done["applied"] is True
            assert done["fact"]["withdrawn"]["by"] == "agent:a1" and done["fact"]["withdrawn"]["reason"] == "called"
            assert notes_named(me.context("debt:visa")["facts"], "next_step") == []
            assert notes_named(me.context("debt:visa")["facts"], "risk") == ["low"]
            assert [v["withdrawn"]["reason"] for v in me.history("debt:visa", "next_step")["versions"]] == \
                ["done", "called"]
    finally:
        stop_process(proc, 30)


def test_keel_annotate_withdraws_with_a_flag(events: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from keel.cli import main
    base = ["annotate", str(FINANCE), str(events), "debt:visa", "next_step"]
    assert main([*base, "prepay", "--scope", "agent", "--agent", "a1"]) == 0
    assert main([*base, "x", "--scope", "agent", "--agent", "a1", "--reason", "why"]) == 2   # a reason needs --withdraw
    assert main([*base, "--scope", "agent", "--agent", "a2", "--withdraw"]) == 1             # not a2's note
    capsys.readouterr()
    assert main([*base, "--scope", "agent", "--agent", "a1", "--withdraw", "--reason", "paid", "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["fact"]["withdrawn"]["by"] == "agent:a1" and done["fact"]["withdrawn"]["reason"] == "paid"
    assert main([*base, "--scope", "agent", "--agent", "a1", "--withdraw"]) == 0      # a retry answers the same
    assert '"withdraw": true' in events.read_text() or '"withdraw":true' in events.read_text()
