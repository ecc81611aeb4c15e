"""Issue 13: the read side and memory cannot be tricked, through the Python API, the CLI and real MCP clients
(in-memory, stdio, HTTP with tokens), on the embedded store and on Redis."""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import uuid
from pathlib import Path
from typing import Any

import anyio
import pytest
from support.mcp_sessions import (
    FINANCE,
    KEEL,
    ROOT,
    TENANT_A,
    TENANT_B,
    add_tenant_b,
    copy_finance,
    http_server,
    http_session,
    make_token,
    memory_session,
    ok,
    refused,
    stdio_session,
)
from support.workers import unique_cartridge

from keel import NoteRefused, Projector, Tools, UnknownTenant, UsageError, load_cartridge
from keel.embedded import build_embedded, replay_file
from keel.eventlog import FileLog
from keel.search import query_tokens, tokens
from keel.times import parse_time
from tools_server.backend import Backend
from tools_server.config import Identity, ServerConfig
from tools_server.server import build_server
from tools_server.surface import BYTES_LIMIT, SPECS, tools_json

CORPUS = ROOT / "tests" / "corpus" / "directory"
NOW = parse_time("2026-11-30T12:00:00Z")


def finance_tools(events: Path, *, agent: str | None = "a1", task: str | None = "t1", tenant: str = TENANT_A,
                  allow: bool = True) -> Tools:
    cartridge = load_cartridge(FINANCE)
    projector, _ = build_embedded(cartridge, events, allow_global_notes=True)
    return Tools(cartridge, projector.store, tenant, agent=agent, task=task, log=FileLog(projector, events),
                 allow_global_notes=allow)


def keel(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KEEL, *args], cwd=str(ROOT), capture_output=True, text=True, timeout=120, check=False)


# ---- 1. evidence means evidence --------------------------------------------------------------------

def test_a_note_is_no_evidence_and_neither_is_an_unrelated_event(tmp_path: Path) -> None:
    t = finance_tools(copy_finance(tmp_path))
    note = t.annotate("debt:visa", "guess", "rate looks high", "agent")["fact"]
    with pytest.raises(NoteRefused, match="wrote nothing about debt:visa.*a note, a retraction or a retracted event is no evidence"):
        t.annotate("debt:visa", "claim", "expensive", "tenant", evidence=note["evidence"])   # laundering
    with pytest.raises(NoteRefused, match="snap-libranza-2026-09.*wrote nothing about debt:visa"):
        t.annotate("debt:visa", "claim", "expensive", "tenant", evidence="snap-libranza-2026-09")
    with pytest.raises(NoteRefused, match="not an event of this tenant"):
        t.annotate("debt:visa", "claim", "expensive", "tenant", evidence="b-snap-visa")
    # a relation to the entity counts: the due's schedule linked it to the debt
    due_event = next(r for r in t.related("debt:visa", "for_debt")["relations"] if r["subject"] == "due:visa-2026-09")
    schedule = t.history(due_event["subject"], "status")["versions"][0]["evidence"]
    assert t.annotate("debt:visa", "claim", "has dues", "tenant", evidence=schedule)["fact"]["evidence"] == schedule
    assert t.annotate("debt:visa", "claim", "expensive", "tenant", evidence="snap-visa-2026-10")["fact"]["value"] == \
        "expensive"


def test_global_note_evidence_touches_an_entity_of_the_type(tmp_path: Path) -> None:
    t = finance_tools(copy_finance(tmp_path))
    with pytest.raises(NoteRefused, match="wrote nothing about an entity of type account"):
        t.annotate("type:account", "tip", "x", "global", evidence="snap-visa-2026-10")
    with pytest.raises(NoteRefused, match="an entity of type debt"):
        t.annotate("rule:debt_expensive", "tip", "x", "global", evidence="pay-libranza-2026-09")
    assert t.annotate("type:debt", "tip", "check the rate", "global", evidence="snap-visa-2026-10")["fact"]


def _retract(events: Path, target: str, retraction_id: str) -> None:
    """Append a keel.retracted of `target` (an event of tenant A) to the events file."""
    with events.open("a") as f:
        f.write(json.dumps({"id": retraction_id, "tenant": TENANT_A, "type": "keel.retracted", "subject": "debt:visa",
                            "occurred_at": "2026-11-01", "payload": {"event": target, "reason": "sent twice"}}) + "\n")


def test_a_retracted_event_and_a_retraction_are_no_evidence_api_cli_mcp(tmp_path: Path) -> None:
    events = copy_finance(tmp_path)
    _retract(events, "snap-visa-2026-10", "oops-visa-10")
    t = finance_tools(events)
    assert t.context("debt:visa", at="2026-10-15")["facts"]    # the September snapshot still stands
    with pytest.raises(NoteRefused, match="evidence 'snap-visa-2026-10' was retracted; pass the id of a domain event"):
        t.annotate("debt:visa", "claim", "expensive", "tenant", evidence="snap-visa-2026-10")
    with pytest.raises(NoteRefused, match="evidence 'oops-visa-10' is a retraction, not a domain event"):
        t.annotate("debt:visa", "claim", "expensive", "tenant", evidence="oops-visa-10")
    with pytest.raises(NoteRefused, match="'snap-visa-2026-10' was retracted"):
        t.annotate("type:debt", "tip", "x", "global", evidence="snap-visa-2026-10")
    assert t.annotate("debt:visa", "claim", "expensive", "tenant", evidence="snap-visa-2026-09")["fact"]["evidence"] \
        == "snap-visa-2026-09"                                   # an event of it not retracted still is

    before = events.read_text()
    cli = keel("annotate", str(FINANCE), str(events), "debt:visa", "claim", "expensive", "--tenant", TENANT_A,
               "--agent", "a1", "--scope", "tenant", "--evidence", "snap-visa-2026-10")
    assert cli.returncode == 1, cli.stderr
    assert "was retracted" in cli.stderr and "Traceback" not in cli.stderr
    assert events.read_text() == before                          # refused: nothing appended

    server = build_server(ServerConfig(Backend.embedded(load_cartridge(FINANCE), events),
                                       identity=Identity(TENANT_A, "a1")))

    async def body(s: Any) -> None:
        note = {"entity": "debt:visa", "predicate": "claim", "value": "expensive", "scope": "tenant"}
        assert "was retracted" in await refused(s, "annotate", {**note, "evidence": "snap-visa-2026-10"})
        assert "is a retraction" in await refused(s, "annotate", {**note, "evidence": "oops-visa-10"})
    anyio.run(_session, server, body)


# ---- 2. identity only from configuration or credentials --------------------------------------------

def test_a_caller_bound_to_no_task_writes_no_task_note_over_mcp(tmp_path: Path) -> None:
    events = copy_finance(tmp_path)
    server = build_server(ServerConfig(Backend.embedded(load_cartridge(FINANCE), events),
                                       identity=Identity(TENANT_A, "a1")))

    async def body(s: Any) -> None:
        base = {"entity": "debt:visa", "predicate": "p", "value": 1, "scope": "task"}
        assert "unknown argument 'task'" in await refused(s, "annotate", {**base, "task": "victim"})
        assert "bound to no task" in await refused(s, "annotate", base)
    anyio.run(_session, server, body)
    assert "victim" not in events.read_text()


async def _session(server: Any, body: Any) -> None:
    async with memory_session(server) as s:
        await body(s)


# ---- 3. strict tool contracts ------------------------------------------------------------------------

def test_every_input_schema_is_strict_and_the_surface_is_small() -> None:
    assert all(spec.input_schema["additionalProperties"] is False for spec in SPECS)
    assert "task" not in next(s for s in SPECS if s.name == "annotate").input_schema["properties"]
    assert len(tools_json(indent=None).encode("utf-8")) <= BYTES_LIMIT


def test_unknown_arguments_and_names_are_tool_errors(tmp_path: Path) -> None:
    events = add_tenant_b(copy_finance(tmp_path))
    server = build_server(ServerConfig(Backend.embedded(load_cartridge(FINANCE), events),
                                       identity=Identity(TENANT_A, "a1")))

    async def body(s: Any) -> None:
        text = await refused(s, "related", {"entity": "debt:visa", "since": "2026-01-01", "limit": 3})
        assert "unknown arguments 'limit', 'since'" in text and "related takes entity, relation, at, known_at" in text
        assert "for_debt, owed_by, paid_from" in await refused(s, "related", {"entity": "debt:visa",
                                                                               "relation": "nosuchrel"})
        assert "balance_cop" in await refused(s, "history", {"entity": "debt:visa", "predicate": "nosuch"})
        assert "account, debt, due, household" in await refused(s, "search", {"query": "x", "type": "planet"})
        before = await ok(s, "related", {"entity": "debt:visa", "known_at": "2026-09-01T12:00:00Z"})
        now = await ok(s, "related", {"entity": "debt:visa"})
        assert [r["subject"] for r in before["relations"]] == ["due:visa-2026-09", "debt:visa"]   # known then
        assert len(now["relations"]) == 4
    anyio.run(_session, server, body)


def test_cli_unknown_names_exit_2_and_unknown_tenants_exit_1(tmp_path: Path) -> None:
    events = str(copy_finance(tmp_path))
    out = keel("related", str(FINANCE), events, "debt:visa", "nosuchrel")
    assert out.returncode == 2 and "for_debt, owed_by, paid_from" in out.stderr
    for args in (["digest", str(FINANCE), "--events", events, "--tenant", "nope"],
                 ["context", str(FINANCE), events, "debt:visa", "--tenant", "nope"],
                 ["search", str(FINANCE), events, "visa", "--tenant", "nope"]):
        out = keel(*args)
        assert out.returncode == 1 and "unknown tenant 'nope'" in out.stderr, (args, out.stderr)
        assert out.stdout == ""


def test_serve_warns_about_a_tenant_without_events(tmp_path: Path) -> None:
    events = copy_finance(tmp_path)
    out = subprocess.run([*KEEL, "serve", str(FINANCE), "--events", str(events), "--tenant", "nope"],
                         cwd=str(ROOT), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, check=False)
    assert "tenant 'nope' has no events yet" in out.stderr


def test_strict_arguments_over_stdio(tmp_path: Path) -> None:
    events = copy_finance(tmp_path)

    async def go() -> None:
        async with stdio_session(str(FINANCE), "--events", str(events), "--tenant", TENANT_A, "--agent", "a1") as s:
            assert "unknown argument 'tenant'" in await refused(s, "context", {"entity": "debt:visa",
                                                                                "tenant": TENANT_B})
            found = await ok(s, "search", {"query": "visa", "at": "2026-08-01"})
            assert found["results"] == []                       # the Visa was first seen in September
            assert "bound to no task" in await refused(s, "annotate", {"entity": "debt:visa", "predicate": "p",
                                                                       "value": 1, "scope": "task"})
    anyio.run(go)


# ---- HTTP with tokens: identity, strictness, global notes --------------------------------------------

def test_http_tokens_bind_identity_and_global_notes_are_anonymous(tmp_path: Path) -> None:
    events = add_tenant_b(copy_finance(tmp_path))
    tokens = tmp_path / "tokens.jsonl"
    a, b = make_token(tokens, TENANT_A, "a1"), make_token(tokens, TENANT_B, "b1")
    with http_server(tmp_path, str(FINANCE), "--events", str(events), "--tokens", str(tokens),
                     "--allow-global-notes") as server:
        async def as_a() -> None:
            async with http_session(server.url, a) as s:
                note = {"entity": "debt:visa", "predicate": "p", "value": 1, "scope": "task"}
                assert "unknown argument 'task'" in await refused(s, "annotate", {**note, "task": "t-of-b"})
                assert "bound to no task" in await refused(s, "annotate", note)
                await ok(s, "annotate", {"entity": "type:debt", "predicate": "tip", "value": "compare rates",
                                         "scope": "global", "evidence": "snap-visa-2026-10"})

        async def as_b() -> None:
            async with http_session(server.url, b) as s:
                seen = await ok(s, "context", {"entity": "debt:visa"})
                tip = next(f for f in seen["facts"] if f["predicate"] == "tip")
                assert tip["scope"] == "global" and tip["source"] == "global"
                assert tip["evidence"] is None and tip["by"] is None
                text = json.dumps(seen)
                assert "snap-visa-2026-10" not in text and "a1" not in text and TENANT_A not in text
        anyio.run(as_a)
        anyio.run(as_b)


def test_global_notes_are_read_without_the_operator_switch(tmp_path: Path) -> None:
    events = copy_finance(tmp_path)
    finance_tools(events).annotate("type:debt", "tip", "compare rates", "global", evidence="snap-visa-2026-10")
    out = keel("context", str(FINANCE), str(events), "debt:libranza", "--json")   # no --allow-global-notes
    assert out.returncode == 0, out.stderr
    tips = [f for f in json.loads(out.stdout)["facts"] if f["scope"] == "global"]
    assert [(f["value"], f["source"], f["evidence"]) for f in tips] == [("compare rates", "global", None)]


# ---- 7. small things -------------------------------------------------------------------------------------

def test_busy_port_is_one_line_and_exit_3(tmp_path: Path) -> None:
    events = copy_finance(tmp_path)
    tokens = tmp_path / "tokens.jsonl"
    make_token(tokens, TENANT_A)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = keel("serve", str(FINANCE), "--events", str(events), "--tokens", str(tokens), "--transport", "http",
                   "--port", str(port))
    assert out.returncode == 3
    assert out.stderr.strip().splitlines() == [out.stderr.strip()]       # one line, no success line before it
    assert f"cannot listen on 127.0.0.1:{port}" in out.stderr and "Traceback" not in out.stderr


# ---- 4. search across scripts, notes and time ------------------------------------------------------------

def test_tokens_fold_latin_and_index_unsegmented_scripts() -> None:
    assert tokens("José NÚÑEZ Straße Søren") == ["jose", "nunez", "strasse", "soren"]
    assert set(query_tokens("小龙")) <= set(tokens("李小龙")) and query_tokens("李") == ["李"]
    assert query_tokens("田中さくら") == ["田中", "中さ", "さく", "くら"]
    assert tokens("ｶﾀｶﾅ") == tokens("カタカナ")                 # width folded (NFKC)
    assert tokens("Ελληνικά Кириллица") == ["ελληνικά", "кириллица"]     # other scripts: case-folded words


def corpus_queries() -> list[dict[str, Any]]:
    return json.loads((CORPUS / "queries.json").read_text(encoding="utf-8"))


def check_corpus(store: Any) -> None:
    cartridge = load_cartridge(CORPUS)
    for q in corpus_queries():
        t = Tools(cartridge, store, "club-norte", agent=q.get("agent"), task=q.get("task"), clock=lambda: NOW)
        found = [r["entity"] for r in t.search(q["query"], at=q.get("at"), known_at=q.get("known_at"))["results"]]
        assert (found[:1] == [q["expect"]]) if q["expect"] else found == [], (q, found)


def test_search_corpus_embedded() -> None:
    projector, report = build_embedded(load_cartridge(CORPUS), CORPUS / "events.jsonl")
    assert not report.rejected
    check_corpus(projector.store)


def test_search_corpus_on_redis(redis_url: str) -> None:
    from keel.store.redis import RedisStore
    store = RedisStore.from_url(redis_url, namespace=f"t{uuid.uuid4().hex[:12]}")
    try:
        report = replay_file(Projector(load_cartridge(CORPUS), store), CORPUS / "events.jsonl")
        assert not report.rejected
        check_corpus(store)
    finally:
        store.drop_namespace()
        store.close()


def test_search_time_and_notes_through_the_cli(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    shutil.copyfile(CORPUS / "events.jsonl", events)
    def found(*args: str) -> list[str]:
        out = keel("search", str(CORPUS), str(events), *args, "--json")
        assert out.returncode == 0, out.stderr
        return [r["entity"] for r in json.loads(out.stdout)["results"]]
    assert found("小龙") == ["member:li"]
    assert found("Pérez") == [] and found("Pérez", "--at", "2026-03-01") == ["member:ana"]
    assert found("Gómez", "--known-at", "2026-06-01T12:00:00Z") == []
    assert found("cantones", "--at", "2026-03-10", "--agent", "a1") == ["member:li"]
    assert found("cantones", "--at", "2026-03-10", "--agent", "a2") == []


def test_search_arguments_over_mcp(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    shutil.copyfile(CORPUS / "events.jsonl", events)
    backend = Backend.embedded(load_cartridge(CORPUS), events)

    async def as_t1(s: Any) -> None:
        hit = await ok(s, "search", {"query": "renovación", "at": "2026-03-10"})
        assert [r["entity"] for r in hit["results"]] == ["member:tanaka"]
        assert (await ok(s, "search", {"query": "Pérez", "at": "2026-03-01"}))["results"][0]["labels"] == \
            {"city": "Medellín", "name": "Ana Pérez"}
    anyio.run(_session, build_server(ServerConfig(backend, identity=Identity("club-norte", "a9", "t1"))), as_t1)

    async def as_t2(s: Any) -> None:
        assert (await ok(s, "search", {"query": "renovación", "at": "2026-03-10"}))["results"] == []
    anyio.run(_session, build_server(ServerConfig(backend, identity=Identity("club-norte", "a9", "t2"))), as_t2)


def test_unknown_tenant_in_the_python_api(tmp_path: Path) -> None:
    t = finance_tools(copy_finance(tmp_path), tenant="nope")
    for call in (lambda: t.context("debt:visa"), lambda: t.search("visa"), lambda: t.related("debt:visa"),
                 lambda: t.history("debt:visa")):
        with pytest.raises(UnknownTenant, match="unknown tenant 'nope'"):
            call()
    with pytest.raises(UsageError, match="not a relation of the cartridge"):
        finance_tools(copy_finance(tmp_path)).related("debt:visa", "nosuchrel")


def test_http_tokens_on_redis(tmp_path: Path, redis_url: str, kafka_bootstrap: str) -> None:
    """`keel serve --redis --transport http`: search in time and across scripts, strict arguments, and a token
    of a tenant without events answered 'unknown tenant' (and warned about at start)."""
    from keel.store.redis import RedisStore
    tenant = f"club-{uuid.uuid4().hex[:8]}"
    events = tmp_path / "events.jsonl"
    events.write_text(CORPUS.joinpath("events.jsonl").read_text(encoding="utf-8").replace("club-norte", tenant),
                      encoding="utf-8")
    folder = unique_cartridge(tmp_path, CORPUS)      # its own namespace, whatever runs beside it
    cartridge = load_cartridge(folder)
    store = RedisStore.from_url(redis_url, namespace=cartridge.name)
    tokens = tmp_path / "tokens.jsonl"
    member, empty = make_token(tokens, tenant, "a1", "t1"), make_token(tokens, f"{tenant}-empty", "a1")
    try:
        assert not replay_file(Projector(cartridge, store), events).rejected
        with http_server(tmp_path, str(folder), "--redis", redis_url, "--kafka", kafka_bootstrap,
                         "--tokens", str(tokens)) as server:
            async def go() -> None:
                async with http_session(server.url, member) as s:
                    hits = await ok(s, "search", {"query": "李小龙"})
                    assert [r["entity"] for r in hits["results"]] == ["member:li"]
                    assert (await ok(s, "search", {"query": "Pérez"}))["results"] == []
                    then = await ok(s, "search", {"query": "Pérez", "at": "2026-03-01"})
                    assert [r["entity"] for r in then["results"]] == ["member:ana"]
                    noted = await ok(s, "search", {"query": "renovacion", "at": "2026-03-10"})
                    assert [r["entity"] for r in noted["results"]] == ["member:tanaka"]
                    assert "unknown argument 'tenant'" in await refused(s, "search", {"query": "x", "tenant": "y"})
                async with http_session(server.url, empty) as s:
                    assert "unknown tenant" in await refused(s, "context", {"entity": "member:li"})
                    assert "unknown tenant" in await refused(s, "search", {"query": "li"})
            anyio.run(go)
            assert f"tenant '{tenant}-empty' has no events yet" in server.stderr()
    finally:
        store.drop_namespace()
        store.close()
