"""What changed since (issue 27, item 1): `history` without an entity pages the tenant's changes recorded after
`since`, oldest first, on the embedded graph and on Redis (KEEL_REDIS_URL): a late event, a
correction, a retraction, a withdrawn note, visibility of notes, paging with a cursor while ingest goes on."""
from __future__ import annotations

import json
import subprocess
import threading
import uuid
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.mcp_sessions import FINANCE, KEEL, ROOT, TENANT_A, copy_finance, memory_session, ok, refused
from support.redis_checks import random_batches
from support.services import service_env

import keel
from keel.cartridge import load_cartridge
from keel.changes import change_rows
from keel.embedded import replay_file
from keel.errors import UsageError
from keel.projector import Projector
from keel.store.base import Store, new_write
from keel.store.memory import MemoryStore
from keel.store.redis import RedisStore
from keel.timeline import Timeline, new_assertion, void_of
from keel.tools import Tools
from tools_server.backend import Backend
from tools_server.config import Identity, ServerConfig
from tools_server.server import build_server

SINCE = "2026-08-01"


def story(tmp_path: Path) -> Path:
    """The finance sample (a late payment, a correction) plus a task note withdrawn by its writer, another
    agent's task note, a retraction of a snapshot and an erasure receipt."""
    events = copy_finance(tmp_path)
    with keel.open(FINANCE, events=events) as graph:
        me = graph.tools(tenant=TENANT_A, agent="a1", task="t1")
        me.annotate("debt:visa", "next_step", "prepay", scope="task")
        me.annotate("debt:visa", "next_step", scope="task", withdraw=True, reason="paid already")
        graph.tools(tenant=TENANT_A, agent="a2", task="t2").annotate("debt:visa", "secret", "mine", scope="task")
    with events.open("a") as f:
        f.write(json.dumps({"id": "oops-visa-10", "tenant": TENANT_A, "type": "keel.retracted",
                            "subject": "debt:visa", "occurred_at": "2026-11-01",
                            "payload": {"event": "snap-visa-2026-10", "reason": "sent twice"}}) + "\n")
        f.write(json.dumps({"id": "erased-visa", "tenant": TENANT_A, "type": "keel.erased", "subject": "debt:visa",
                            "occurred_at": "2026-11-02", "payload": {"keys": 0}}) + "\n")
    return events


def pages(tools: Tools, limit: int, **kwargs: Any) -> list[dict[str, Any]]:
    """Every answer from `since` on, following cursors until the log's end."""
    out = [tools.history(since=SINCE, limit=limit, **kwargs)]
    while out[-1]["more"]:
        out.append(tools.history(since=SINCE, cursor=out[-1]["cursor"], limit=limit, **kwargs))
    return out


def rows(answers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for a in answers for c in a["changes"]]


def check_story(tools: Tools) -> list[dict[str, Any]]:
    """What the story's changes say, on any backend; returns every answer of a walk by 7."""
    answers = pages(tools, 7)
    changes = rows(answers)
    assert changes == rows(pages(tools, 500)) == tools.history(since=SINCE, limit=500)["changes"]
    assert all(len(a["changes"]) <= 7 for a in answers) and not answers[-1]["more"]
    stamps = [c["recorded_at"] for c in changes]
    assert stamps == sorted(stamps)                                            # oldest first
    # a late event: the September payment was recorded after October's writes, and is listed there
    [paid] = [c for c in changes if c["evidence"] == "pay-visa-2026-09" and c["name"] == "status"]
    assert paid["valid_from"] < paid["recorded_at"] and paid["old"] == "pending" and paid["new"] == "paid"
    # the correction: the balance replaced at its own valid_from, old and new values
    [fixed] = [c for c in changes if c["evidence"] == "snap-libranza-2026-10-fix" and c["name"] == "balance_cop"]
    assert (fixed["change"], fixed["old"], fixed["new"], fixed["by"]) == ("corrected", 12180000, 12150000, "human:ana")
    # the retraction: every write of the snapshot voided, the value before it back
    retracted = [c for c in changes if c["change"] == "retracted"]
    assert retracted and {c["evidence"] for c in retracted} == {"oops-visa-10"}
    [balance] = [c for c in retracted if c["name"] == "balance_cop"]
    assert (balance["old"], balance["new"]) == (3870000, 4200000)
    # the withdrawn note, with who and why; another agent's task note is not visible
    [note] = [c for c in changes if c["what"] == "note" and c["change"] == "version"]
    [gone] = [c for c in changes if c["change"] == "withdrawn"]
    assert (note["name"], note["scope"], note["new"]) == ("next_step", "task", "prepay")
    assert (gone["old"], gone["new"], gone["by"], gone["reason"]) == ("prepay", None, "agent:a1", "paid already")
    assert gone["valid_from"] == note["valid_from"] and gone["valid_to"] == gone["recorded_at"]
    assert not [c for c in changes if c["name"] == "secret"]
    [erased] = [c for c in changes if c["change"] == "erased"]
    assert (erased["entity"], erased["name"], erased["evidence"]) == ("debt:visa", "keel.erased", "erased-visa")
    # each answer's known_through is complete: nothing after it was returned on an earlier page
    for a, b in pairwise(answers):
        assert all(c["recorded_at"] > a["known_through"] for c in b["changes"])
    last = answers[-1]["known_through"]
    assert last == stamps[-1] and tools.history(since=last)["changes"] == []
    assert tools.history(cursor=answers[-1]["cursor"]) == {**answers[-1], "since": None, "changes": []}
    only_dues = tools.history(since=SINCE, type="due", limit=500)["changes"]
    assert only_dues and all("due:" in c["entity"] + (c["object"] or "") for c in only_dues)
    rare = pages(tools, 1, type="account")          # pages cut short by the scan bound still continue exactly
    assert any(not a["changes"] and a["more"] for a in rare)
    assert rows(rare) == tools.history(since=SINCE, type="account", limit=500)["changes"] != []
    return answers


def test_the_story_on_the_embedded_graph(tmp_path: Path) -> None:
    events = story(tmp_path)
    with keel.open(FINANCE, events=events) as graph:
        check_story(graph.tools(tenant=TENANT_A, agent="a1", task="t1"))


def test_since_a_known_through_lists_exactly_what_came_after(tmp_path: Path) -> None:
    events = copy_finance(tmp_path)
    with keel.open(FINANCE, events=events) as graph:
        me = graph.tools(tenant=TENANT_A, agent="a1", task="t1")
        before = me.history(since=SINCE, limit=500)
        assert before["more"] is False
        me.annotate("debt:visa", "next_step", "prepay", scope="task")
        [new] = me.history(since=before["known_through"])["changes"]
        assert (new["entity"], new["what"], new["new"], new["change"]) == ("debt:visa", "note", "prepay", "version")
        assert me.history(cursor=before["cursor"])["changes"] == [new]      # the cursor resumes exactly too


@pytest.mark.parametrize(("kwargs", "message"), [
    ({}, "since: a recorded time"),
    ({"since": "yesterday"}, "since: 'yesterday' is neither"),
    ({"since": SINCE, "limit": 0}, "limit: an integer from 1 to 500"),
    ({"since": SINCE, "limit": 501}, "limit: an integer from 1 to 500"),
    ({"since": SINCE, "type": "nope"}, "type: 'nope' is not an entity type"),
    ({"cursor": "c1.x"}, "cursor: pass back the `cursor`"),
    ({"since": SINCE, "predicate": "p"}, "predicate and known_at go with an entity"),
    ({"entity": "debt:visa", "since": SINCE}, "since, type, cursor and limit go without an entity"),
])
def test_bad_arguments_are_usage_errors(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    with keel.open(FINANCE, events=copy_finance(tmp_path)) as graph, \
            pytest.raises(UsageError, match=message.replace("(", r"\(").replace("`", ".")):
        graph.tools(tenant=TENANT_A).history(**kwargs)


def test_cli_json_is_the_tool_answer_and_pages_by_cursor(tmp_path: Path) -> None:
    events = story(tmp_path)
    with keel.open(FINANCE, events=events) as graph:
        want = pages(graph.tools(tenant=TENANT_A, agent="a1", task="t1"), 40)
    got, cursor = [], None
    while True:
        args = [*KEEL, "history", str(FINANCE), str(events), "--since", SINCE, "--limit", "40", "--json",
                "--agent", "a1", "--task", "t1", *(["--cursor", cursor] if cursor else [])]
        out = subprocess.run(args, cwd=str(ROOT), capture_output=True, text=True, check=True)
        got.append(json.loads(out.stdout))
        cursor = got[-1]["cursor"]
        if not got[-1]["more"]:
            break
    assert got == want
    text = subprocess.run([*KEEL, "history", str(FINANCE), str(events), "--since", SINCE, "--limit", "3"],
                          cwd=str(ROOT), capture_output=True, text=True, check=True).stdout
    assert "more: --cursor c1.3." in text and "known through" in text


def test_over_mcp_the_answer_is_the_tools_answer(tmp_path: Path) -> None:
    events = story(tmp_path)
    with keel.open(FINANCE, events=events) as graph:
        want = graph.tools(tenant=TENANT_A, agent="a1", task="t1").history(since=SINCE, limit=20)
    server = build_server(ServerConfig(Backend.embedded(load_cartridge(FINANCE), events),
                                       identity=Identity(TENANT_A, "a1", "t1")))

    async def go() -> None:
        async with memory_session(server) as s:
            assert await ok(s, "history", {"since": SINCE, "limit": 20}) == want
            assert "since, type, cursor and limit go without an entity" in await refused(
                s, "history", {"entity": "debt:visa", "since": SINCE})
    anyio.run(go)


# ---- the change log of every store: paging while ingest goes on ------------------------------------------

def paged_while_ingesting(store: Store, batches: list[Any], limits: list[int]) -> None:
    """Apply batches one by one, reading a page (of the next size in `limits`) after each; then read to the end.
    The pages together are exactly the whole log: nothing missed, nothing repeated."""
    seen: list[Any] = []
    start, generation = None, None
    for i, (writes, event_id) in enumerate(batches):
        store.apply_writes("acme", writes, event_id)
        page = store.changes("acme", start=start, generation=generation, count=limits[i % len(limits)])
        seen += page.entries
        start, generation = page.start + len(page.entries), page.generation
    while True:
        page = store.changes("acme", start=start, generation=generation, count=7)
        if not page.entries:
            break
        seen += page.entries
        start = page.start + len(page.entries)
    whole = store.changes("acme", count=10_000)
    assert [e.position for e in seen] == list(range(whole.length))
    assert seen == whole.entries == [(i, k, a) for i, (k, a) in enumerate(w for ws, _ in batches for w in ws)] \
        or _same_when_ids_repeat(seen, whole.entries, batches)


def _same_when_ids_repeat(seen: list[Any], whole: list[Any], batches: list[Any]) -> bool:
    """A batch whose event id was applied before writes nothing: the log holds the others' writes only."""
    applied: set[str] = set()
    kept = []
    for writes, event_id in batches:
        if event_id is not None and event_id in applied:
            continue
        if event_id is not None:
            applied.add(event_id)
        kept += writes
    return seen == whole and [(k, a) for _, k, a in whole] == [(w.key, w.assertion) for w in kept]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), limits=st.lists(st.integers(1, 9), min_size=1, max_size=5))
def test_paging_while_ingesting_misses_and_repeats_nothing(seed: int, limits: list[int]) -> None:
    paged_while_ingesting(MemoryStore(), random_batches(seed, 40), limits)


# ---- Redis ----------------------------------------------------------------------------------------------

@pytest.fixture
def redis_store() -> Iterator[RedisStore]:
    url = service_env("KEEL_REDIS_URL")
    probe = RedisStore.from_url(url, namespace=f"probe{uuid.uuid4().hex[:12]}")    # private: stamped, then dropped
    store = RedisStore(probe.client, namespace=f"chg{uuid.uuid4().hex[:12]}", owns_client=False)
    yield store
    store.drop_namespace()
    probe.drop_namespace()
    probe.close()


@pytest.mark.services
def test_the_story_on_redis_is_the_embedded_answer(tmp_path: Path, redis_store: RedisStore) -> None:
    events = story(tmp_path)
    cartridge = load_cartridge(FINANCE)
    report = replay_file(Projector(cartridge, redis_store), events)
    assert not report.rejected, report.rejected
    on_redis = check_story(Tools(cartridge, redis_store, TENANT_A, "a1", "t1"))
    with keel.open(FINANCE, events=events) as graph:
        assert on_redis == pages(graph.tools(tenant=TENANT_A, agent="a1", task="t1"), 7)


@pytest.mark.services
def test_redis_paging_while_ingesting_misses_and_repeats_nothing(redis_store: RedisStore) -> None:
    paged_while_ingesting(redis_store, random_batches(7, 60), [1, 4, 2, 9])


@pytest.mark.services
def test_redis_paging_under_a_concurrent_writer(tmp_path: Path, redis_store: RedisStore) -> None:
    """A writer thread applies the sample's events while the reader pages with the tool's cursor."""
    cartridge = load_cartridge(FINANCE)
    events = copy_finance(tmp_path)
    lines = events.read_text().splitlines()
    first, rest = tmp_path / "first.jsonl", tmp_path / "rest.jsonl"
    first.write_text("\n".join(lines[:3]) + "\n")
    rest.write_text("\n".join(lines[3:]) + "\n")
    replay_file(Projector(cartridge, redis_store), first)
    reader = Tools(cartridge, redis_store, TENANT_A)
    writer = threading.Thread(target=replay_file, args=(Projector(cartridge, redis_store), rest))
    got: list[dict[str, Any]] = []
    answer = reader.history(since=SINCE, limit=2)
    writer.start()
    while True:                 # follow the cursor, at the log's end too, until the writer is done
        got += answer["changes"]
        if not answer["more"] and not writer.is_alive():
            break
        answer = reader.history(cursor=answer["cursor"], limit=2)
    writer.join()
    got += reader.history(cursor=answer["cursor"], limit=500)["changes"]
    def ident(row: dict[str, Any]) -> dict[str, Any]:       # valid_to is as known when answered: it may move
        return {k: v for k, v in row.items() if k != "valid_to"}
    assert [ident(r) for r in got] == [ident(r) for r in rows(pages(reader, 500))]



@pytest.mark.services
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_redis_windows_give_the_rows_whole_timelines_give(redis_store: RedisStore, seed: int) -> None:
    """Redis reads a change's neighbourhood (Store.windows_many, from the segments its valid-time index
    names), the memory store whole timelines: every row of a random workload (corrections at one point, voids,
    closes, late points, expiries) is the same."""
    memory = MemoryStore()
    if seed > 1:
        redis_store.roll_bytes = 300 * seed         # many closed segments: the valid-time index bounds the reads
    for writes, event_id in random_batches(seed, 150):
        redis_store.apply_writes("acme", writes, event_id)
        memory.apply_writes("acme", writes, event_id)
    entries = memory.changes("acme", count=100_000).entries
    assert redis_store.changes("acme", count=100_000).entries == entries
    for i in range(0, len(entries), 50):
        assert change_rows(redis_store, "acme", entries[i:i + 50]) == change_rows(memory, "acme", entries[i:i + 50])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["value", "end", "void"]), st.integers(0, 3)),
                min_size=1, max_size=25))
def test_old_and_new_are_the_belief_before_and_after_the_change(ops: list[tuple[int, str, int]]) -> None:
    """Against a model: `old` (`new`) is the value at the change's point of a timeline rebuilt from the log
    before (through) the change. One write per event, each recorded later than the one before."""
    store = MemoryStore()
    key = ("f", "thing:one", "p", "")
    for i, (point, kind, value) in enumerate(ops):
        closed = kind != "value"
        body: Any = void_of(f"e{max(i - 1, 0)}") if kind == "void" else None if closed else value
        store.apply_writes("acme", [new_write(key, new_assertion(point * 10, body, closed, None, f"e{i}", 1000 + i))],
                           f"e{i}")
    entries = store.changes("acme", count=100).entries
    for i, (entry, row) in enumerate(zip(entries, change_rows(store, "acme", entries))):
        for field, prefix in (("old", entries[:i]), ("new", entries[:i + 1])):
            model = Timeline()
            for e in prefix:
                model.add(e.assertion)
            held = model.as_of(entry.assertion.point)
            assert row[field] == (None if held is None else held.assertion.value), (field, i)


def walk(store: Store, limit: int, **kwargs: Any) -> list[Any]:
    """Every answer of keel.changes.read_changes from the log's start, following cursors to the end."""
    from keel.changes import parse_cursor, read_changes
    out = [read_changes(store, "acme", since=None, after=None, limit=limit, type=None, scopes={"tenant"}, **kwargs)]
    while out[-1].more:
        out.append(read_changes(store, "acme", since=None, after=parse_cursor(out[-1].cursor), limit=limit,
                                type=None, scopes={"tenant"}, **kwargs))
    return out


def clamped(batches: list[Any]) -> list[Any]:
    """The batches with each write's recorded_at raised to the latest before it (as keel.envelope clamps)."""
    latest, out = 0, []
    for writes, event_id in batches:
        kept = []
        for w in writes:
            latest = max(latest, w.assertion.recorded_at)
            kept.append(new_write(w.key, w.assertion._replace(recorded_at=latest)))
        out.append((kept, event_id))
    return out


@pytest.mark.services
@pytest.mark.parametrize("seed,window,chunk", [(1, 4, None), (2, 4, 3), (3, 1, None), (4, 1, 5)])
def test_redis_pages_read_with_their_windows_give_the_memory_stores_answers(
        redis_store: RedisStore, seed: int, window: int, chunk: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page reads each change's window with it (Store.change_page, the windows from the segments): the answers (rows, cursors, `more`,
    from a cursor or from `since`) equal the memory store's, over a random workload (corrections at one point,
    voids, closes, late points, expiries, notes of scopes the caller does not see) committed in steps of several
    events, with windows of 4 and of 1 member of the point before, and chunks of the change log cut small (so
    that chunks end inside events and runs)."""
    import keel.changes
    from keel.changes import read_changes
    from keel.store.redis import changelog
    monkeypatch.setattr(keel.changes, "WINDOW", window)
    if chunk:
        monkeypatch.setattr(changelog, "CHUNK_WRITES", chunk)
        redis_store.roll_bytes = 100 * chunk        # many closed segments: the valid-time index bounds the reads
    memory = MemoryStore()
    batches = clamped(random_batches(seed, 150))
    for i in range(0, len(batches), 4):
        redis_store.commit_batch("acme", batches[i:i + 4], None)
        memory.commit_batch("acme", batches[i:i + 4], None)
    for limit in (7, 100):
        got, want = walk(redis_store, limit), walk(memory, limit)
        assert [(a.rows, a.cursor, a.more) for a in got] == [(a.rows, a.cursor, a.more) for a in want]
        assert sum(len(a.rows) for a in got) > 50
    times = sorted({e.assertion.recorded_at for e in memory.changes("acme", count=10_000).entries})
    for since in [times[0] - 1, *times[::9], times[-1]]:
        got1 = read_changes(redis_store, "acme", since=since, after=None, limit=5, type=None, scopes=set())
        want1 = read_changes(memory, "acme", since=since, after=None, limit=5, type=None, scopes=set())
        assert (got1.rows, got1.cursor, got1.more, got1.through) == \
            (want1.rows, want1.cursor, want1.more, want1.through)


@pytest.mark.services
def test_a_page_of_a_bulk_loaded_generation_is_the_applied_ones(redis_store: RedisStore) -> None:
    """A replay's bulk load applies its steps through the same APPLY script: its pages equal those of the same
    steps committed one by one."""
    batches = random_batches(5, 120)
    for i in range(0, len(batches), 9):
        redis_store.commit_batch("acme", batches[i:i + 9], None)
    applied = walk(redis_store, 11)
    gen = redis_store.new_generation("acme")
    loader = redis_store.load_generation("acme", gen)
    for i in range(0, len(batches), 9):
        loader.add(batches[i:i + 9], None)
        if i % 2:
            loader.flush()
    loader.flush()
    redis_store.switch_generation("acme", gen)
    loaded = walk(redis_store, 11)
    assert [a.rows for a in loaded] == [a.rows for a in applied] and len(loaded) > 5


@pytest.mark.services
def test_a_change_log_of_an_earlier_build_is_refused(redis_store: RedisStore) -> None:
    """A generation whose change log holds elements of the first format (one JSON element per write, before
    chunks) is never misread: reads are refused with what to run."""
    from keel.store.redis.changelog import ChangeLogIncompatible
    from keel.store.redis.keys import CHANGES
    redis_store.open_fact("acme", "thing:a", "p", 1, valid_from="2026-01-01")
    key = redis_store.data_prefix("acme", 1) + CHANGES
    old = '1790000000000000|[["f","thing:a","p",""],0,1,0,null,"e0",null,null]'
    redis_store.client.rpush(key, old)                  # a downgraded writer appended one after new chunks
    with pytest.raises(ChangeLogIncompatible, match="keel replay"):
        redis_store.changes("acme", count=1000)
    redis_store.client.lpush(key, old)                  # an upgraded one appended after old elements
    with pytest.raises(ChangeLogIncompatible):
        redis_store.changes("acme", start=0, generation=1, count=1)
    with pytest.raises(UsageError, match="tenant 'acme'"):
        Tools(load_cartridge(FINANCE), redis_store, "acme").history(since=SINCE)


def test_an_unknown_tenant_is_told_and_a_known_one_with_no_news_is_not(tmp_path: Path) -> None:
    """The tenant check runs only when a page comes back empty with nothing applied (one round trip less)."""
    with keel.open(FINANCE, events=copy_finance(tmp_path)) as graph:
        with pytest.raises(keel.UnknownTenant):
            graph.tools(tenant="nobody-here").history(since=SINCE)
        quiet = graph.tools(tenant=TENANT_A).history(since="2030-01-01")
        assert quiet["changes"] == [] and quiet["known_through"] is not None and not quiet["more"]
