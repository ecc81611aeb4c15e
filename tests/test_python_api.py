"""The Python API of docs/python.md (keel.open → Graph.tools → Tools), on the embedded graph and on Redis.

Each method's result is the MCP tool's result for the same question (the same object, keys in the same order,
so the same bytes once JSON-encoded), each error is the documented keel exception whose text is MCP's tool
error, results match their declared types (keel/results.py), and README's example runs as written.
The Redis tests need KEEL_REDIS_URL (and KEEL_KAFKA_BOOTSTRAP for annotate); they use a private tenant
of a private copy of the finance cartridge (its own namespace, topic and worker group).
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import subprocess
import sys
import time
import types
import typing
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, date, datetime, timedelta, timezone
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
    stdio_session,
    stop_process,
)

import keel
from keel.cartridge import load_cartridge
from keel.config import resolve
from keel.embedded import replay_file
from keel.projector import Projector
from tools_server.backend import Backend
from tools_server.config import Identity, ServerConfig
from tools_server.server import build_server
from tools_server.surface import SPECS

AGENT, TASK = "debts", "visa-plan"
FIRST = {"context": "entity", "history": "entity", "search": "query", "related": "entity", "annotate": "entity"}

# (tool, positional arguments of the Python call, keyword arguments of both): the README tour's questions
QUESTIONS: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    ("context", ("debt:visa",), {}),
    ("context", ("debt:visa",), {"at": "2026-09-15"}),
    ("context", ("due:visa-2026-11",), {"at": "2026-11-06"}),
    ("context", ("due:visa-2026-09",), {"at": "2026-09-20", "known_at": "2026-10-01"}),
    ("history", ("debt:libranza",), {"predicate": "balance_cop"}),
    ("history", ("debt:libranza",), {"predicate": "balance_cop", "known_at": "2026-10-02"}),
    ("history", ("due:visa-2026-10",), {}),
    ("search", ("visa",), {}),
    ("search", ("Visa",), {"type": "debt", "limit": 2}),
    ("search", ("visa",), {"at": "2026-08-01"}),
    ("related", ("debt:visa",), {"relation": "for_debt"}),
    ("related", ("debt:visa",), {"at": "2026-09-15", "known_at": "2026-10-01"}),
]
# Python time objects and the text MCP gets for the same instant
TIMES: list[tuple[Any, str]] = [
    (date(2026, 9, 15), "2026-09-15"),
    (datetime(2026, 9, 15, tzinfo=UTC), "2026-09-15T00:00:00Z"),
    (datetime(2026, 9, 15, 2, 30, tzinfo=timezone(timedelta(hours=2))), "2026-09-15T00:30:00Z"),
]
# (tool, positional, keywords, the exception the Python call raises) — MCP answers a tool error with its text
ERRORS: list[tuple[str, tuple[Any, ...], dict[str, Any], type[keel.KeelError]]] = [
    ("context", ("debt:nope",), {}, keel.UnknownEntity),
    ("context", ("debt:visa",), {"at": "yesterday"}, keel.UsageError),
    ("context", ("planet:mars",), {}, keel.UsageError),
    ("history", ("debt:visa",), {"predicate": "nope"}, keel.UsageError),
    ("search", ("visa",), {"limit": 0}, keel.UsageError),
    ("search", ("visa",), {"type": "planet"}, keel.UsageError),
    ("related", ("debt:visa", "orbits"), {}, keel.UsageError),
    ("annotate", ("debt:visa", "next_step", "x"), {"scope": "tenant"}, keel.NoteRefused),   # needs evidence
    ("annotate", ("debt:visa", "next step!", "x"), {"scope": "agent"}, keel.UsageError),
]


def arguments(tool: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The MCP arguments of a Python call (positional ones by their names, in the tools' order)."""
    names = {"related": ("entity", "relation"), "annotate": ("entity", "predicate", "value")}.get(tool, (FIRST[tool],))
    return {**dict(zip(names, args)), **kwargs}


def same(python: Any, structured: Any, text: str) -> None:
    """The Python result is MCP's object: equal, keys in the same order (so the same JSON bytes), and what the
    text content decodes to."""
    assert python == structured
    assert json.dumps(python, ensure_ascii=False) == json.dumps(structured, ensure_ascii=False)
    assert json.loads(text) == python


class Mcp:
    """A real MCP client session over the SDK's in-memory transport, driven from synchronous test code: `ask`
    runs tool calls in one session and returns (is_error, structured content or None, text) per call."""

    def __init__(self, server: Any) -> None:
        self.server = server

    def ask(self, *calls: tuple[str, dict[str, Any]]) -> list[tuple[bool, Any, str]]:
        out: list[tuple[bool, Any, str]] = []

        async def go() -> None:
            async with memory_session(self.server) as session:
                for tool, args in calls:
                    r = await session.call_tool(tool, args)
                    out.append((r.is_error, r.structured_content, r.content[0].text))
        anyio.run(go)
        return out


def mcp_over(backend: Backend, tenant: str, agent: str | None = AGENT, task: str | None = TASK) -> Mcp:
    return Mcp(build_server(ServerConfig(backend, identity=Identity(tenant, agent, task))))


def assert_answers_equal(tools: keel.Tools, mcp: Mcp) -> int:
    """Every question of QUESTIONS and TIMES asked both ways; the number of comparisons."""
    calls = [(tool, arguments(tool, args, kwargs)) for tool, args, kwargs in QUESTIONS]
    calls += [("context", {"entity": "debt:visa", "at": text}) for _, text in TIMES]
    calls += [("related", {"entity": "debt:visa", "known_at": text}) for _, text in TIMES]
    answers = mcp.ask(*calls)
    python = [getattr(tools, tool)(*args, **kwargs) for tool, args, kwargs in QUESTIONS]
    python += [tools.context("debt:visa", at=value) for value, _ in TIMES]
    python += [tools.related("debt:visa", known_at=value) for value, _ in TIMES]
    for (tool, args), mine, (error, structured, text) in zip(calls, python, answers, strict=True):
        assert not error, (tool, args, text)
        same(mine, structured, text)
    return len(calls)


def assert_errors_equal(tools: keel.Tools, mcp: Mcp) -> None:
    answers = mcp.ask(*[(tool, arguments(tool, args, kwargs)) for tool, args, kwargs, _ in ERRORS])
    for (tool, args, kwargs, kind), (error, _, text) in zip(ERRORS, answers, strict=True):
        with pytest.raises(kind) as raised:
            getattr(tools, tool)(*args, **kwargs)
        assert error and text == mcp_error(tool, raised.value), (tool, args, text)


def mcp_error(tool: str, error: Exception) -> str:
    """The text of MCP's tool error for a keel exception: its message, after the SDK's prefix."""
    return f"Error executing tool {tool}: {error}"


def annotate_both(tools: keel.Tools, mcp: Mcp, *args: Any, **kwargs: Any) -> tuple[dict[str, Any], Any, str]:
    """One note written by the Python call, then asked again over MCP with the same arguments: a note's id is
    its idempotency key within a clock-aligned window (keel.notes.note_id), so MCP answers with the same note.
    When a window boundary fell between the two calls (ids differ), both are asked again in the new window."""
    for _ in range(2):
        mine = tools.annotate(*args, **kwargs)
        [(error, structured, text)] = mcp.ask(("annotate", arguments("annotate", args, kwargs)))
        assert not error, text
        if structured["event_id"] == mine["event_id"]:
            return dict(mine), structured, text
    raise AssertionError("two clock windows turned between two calls")


# ---- the embedded graph ---------------------------------------------------------------------------

@pytest.fixture
def events(tmp_path: Path) -> Path:
    return copy_finance(tmp_path)


@pytest.fixture
def graph(events: Path) -> Iterator[keel.Graph]:
    with keel.open(FINANCE, events=events) as g:
        yield g


def test_embedded_answers_are_the_mcp_answers(graph: keel.Graph) -> None:
    tools = graph.tools(tenant=TENANT_A, agent=AGENT, task=TASK)
    mcp = mcp_over(Backend.of(graph, resolve({})), TENANT_A)
    assert assert_answers_equal(tools, mcp) == len(QUESTIONS) + 2 * len(TIMES)
    assert_errors_equal(tools, mcp)


def test_embedded_annotate_is_the_mcp_annotate(graph: keel.Graph, events: Path) -> None:
    tools = graph.tools(tenant=TENANT_A, agent=AGENT, task=TASK)
    mcp = mcp_over(Backend.of(graph, resolve({})), TENANT_A)
    lines, ids = len(events.read_text().splitlines()), []
    for args, kwargs in [(("debt:visa", "next_step", "prepay"), {"scope": "task", "evidence": "snap-visa-2026-10"}),
                         (("debt:visa", "limit_cop", {"max": 500000, "why": ["rate"]}), {"scope": "agent"}),
                         (("due:visa-2026-11", "called"), {"value": True, "scope": "tenant",
                                                            "evidence": "sched-visa-2026-11"})]:
        mine, structured, text = annotate_both(tools, mcp, *args, **kwargs)
        same(mine, structured, text)
        assert mine["applied"] is True and mine["fact"]["by"] == f"agent:{AGENT}"
        assert mine["fact"]["value"] == (kwargs.get("value") if len(args) < 3 else args[2])
        ids.append(mine["event_id"])
    written = [json.loads(line) for line in events.read_text().splitlines()[lines:]]
    assert {e["type"] for e in written} == {"keel.annotated"}
    assert [e["id"] for e in written if e["id"] in ids] == ids       # each note once: MCP's call wrote nothing
    notes = {f["predicate"]: f["scope"] for f in tools.context("debt:visa")["facts"] if f["scope"]}
    assert notes == {"next_step": "task", "limit_cop": "agent"}


def test_keel_serve_answers_as_keel_open(tmp_path: Path, graph: keel.Graph) -> None:
    """`keel serve --events` (a subprocess over stdio) and keel.open of the same file give the same answers."""
    tools = graph.tools(tenant=TENANT_A, agent=AGENT, task=TASK)
    (tmp_path / "served").mkdir()
    served = copy_finance(tmp_path / "served")

    async def go() -> list[tuple[bool, Any, str]]:
        out = []
        async with stdio_session(str(FINANCE), "--events", str(served), "--tenant", TENANT_A, "--agent", AGENT,
                                 "--task", TASK, "--no-call-log") as s:
            for tool, args, kwargs in QUESTIONS:
                r = await s.call_tool(tool, arguments(tool, args, kwargs))
                out.append((r.is_error, r.structured_content, r.content[0].text))
        return out
    answers = anyio.run(go)
    for (tool, args, kwargs), (error, structured, text) in zip(QUESTIONS, answers, strict=True):
        assert not error, text
        same(getattr(tools, tool)(*args, **kwargs), structured, text)


def test_errors_are_the_documented_exceptions(graph: keel.Graph) -> None:
    tools = graph.tools(tenant=TENANT_A, agent=AGENT)
    with pytest.raises(keel.NoteRefused, match="bound to no task"):       # a task note needs a task
        tools.annotate("debt:visa", "next_step", "x", scope="task")
    with pytest.raises(keel.UsageError, match="no time zone"):
        tools.context("debt:visa", at=datetime(2026, 9, 15))
    assert isinstance(keel.UnknownEntity("t", "e"), LookupError) and issubclass(keel.NoteRefused, keel.DomainError)
    nobody = graph.tools(tenant="nobody-here")
    mcp = mcp_over(Backend.of(graph, resolve({})), "nobody-here", None, None)
    for tool, args in [("context", ("debt:visa",)), ("search", ("visa",)), ("related", ("debt:visa",))]:
        with pytest.raises(keel.UnknownTenant) as raised:
            getattr(nobody, tool)(*args)
        [(error, _, text)] = mcp.ask((tool, arguments(tool, args, {})))
        assert error and text == mcp_error(tool, raised.value)
    for bad in [{"tenant": "no spaces"}, {"tenant": TENANT_A, "agent": ""}, {"tenant": TENANT_A, "task": "x" * 300}]:
        with pytest.raises(keel.UsageError):
            graph.tools(**bad)


def test_open_resolves_like_the_cli(events: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KEEL_REDIS_URL", raising=False)
    with pytest.raises(keel.UsageError, match="events= .* or redis="):
        keel.open(FINANCE)
    with pytest.raises(keel.UsageError, match="not both"):
        keel.open(FINANCE, events=events, redis="redis://127.0.0.1:1/0")
    with pytest.raises(keel.UsageError, match="not found"):
        keel.open(FINANCE, events=events.with_name("missing.jsonl"))
    with pytest.raises(keel.CartridgeInvalid):
        keel.open(events.parent, events=events)
    monkeypatch.setenv("KEEL_REDIS_URL", "redis://127.0.0.1:1/0")      # an events file wins, as in the CLI
    with keel.open(load_cartridge(FINANCE), events=str(events)) as g:   # a loaded Cartridge, a str path
        assert g.embedded and g.tenants == [TENANT_A]
        assert g.tools(tenant=TENANT_A).context("debt:visa")["entity"] == "debt:visa"
    monkeypatch.setenv("KEEL_ALLOW_GLOBAL_NOTES", "1")                 # the operator switch, as for `keel serve`
    with keel.open(FINANCE, events=events) as g:
        note = g.tools(tenant=TENANT_A, agent=AGENT).annotate("type:debt", "tip", "compare rates", scope="global",
                                                              evidence="snap-visa-2026-10")
        assert note["applied"] and note["fact"]["scope"] == "global"


def test_one_graph_serves_many_threads(events: Path) -> None:
    """Readers on eight threads while other threads annotate the same tenant (agent notes the readers do not
    see): every read is the one-thread answer but for the freshness the notes move, and every note is written
    once, whole."""
    def answers(tools: keel.Tools) -> list[Any]:
        out = []
        for tool, args, kwargs in QUESTIONS:
            result = dict(getattr(tools, tool)(*args, **kwargs))
            for moved in ("known_through", "applied_through"):
                result.pop(moved, None)
            out.append(result)
        return out

    with keel.open(FINANCE, events=events) as graph:
        expected = answers(graph.tools(tenant=TENANT_A, agent=AGENT, task=TASK))
        writer = graph.tools(tenant=TENANT_A, agent="w")

        def write(i: int) -> Any:
            return writer.annotate(("debt:visa", "debt:libranza", "due:visa-2026-11")[i % 3], "seen", i, scope="agent")
        with ThreadPoolExecutor(8) as pool:
            reads = [pool.submit(answers, graph.tools(tenant=TENANT_A, agent=AGENT, task=TASK)) for _ in range(24)]
            writes = [pool.submit(write, i) for i in range(48)]
            assert all(r.result() == expected for r in reads)
            assert sorted(w.result()["fact"]["value"] for w in writes) == list(range(48))
    lines = [json.loads(line) for line in events.read_text().splitlines()]        # every line whole JSON
    assert sum(e["type"] == "keel.annotated" for e in lines) == 48


# ---- the declared types --------------------------------------------------------------------------

def problems(value: Any, hint: Any, path: str = "$") -> list[str]:
    """Where a value departs from a type of keel/results.py (TypedDicts, lists, dicts, unions, Any)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return []
    if typing.is_typeddict(hint):
        if not isinstance(value, dict):
            return [f"{path}: {type(value).__name__}, not an object"]
        hints = typing.get_type_hints(hint)
        out = [f"{path}.{k}: missing" for k in sorted(hint.__required_keys__ - value.keys())]
        out += [f"{path}.{k}: not declared" for k in sorted(value.keys() - hints.keys())]
        return out + [p for k, v in value.items() if k in hints for p in problems(v, hints[k], f"{path}.{k}")]
    if origin in (typing.Union, types.UnionType):
        found = [problems(value, a, path) for a in args]
        return [] if any(not p for p in found) else found[0]
    if origin is list:
        return [f"{path}: not a list"] if not isinstance(value, list) else \
            [p for i, v in enumerate(value) for p in problems(v, args[0], f"{path}[{i}]")]
    if origin is dict:
        return [f"{path}: not an object"] if not isinstance(value, dict) else \
            [p for k, v in value.items() for p in problems(v, args[1], f"{path}.{k}")]
    if hint is type(None):
        return [] if value is None else [f"{path}: {value!r} is not null"]
    kinds = (int, float) if hint is float else (hint,)
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and hint is not bool)
    return [] if ok else [f"{path}: {value!r} is not {hint.__name__}"]


RESULT_TYPES = {"context": keel.ContextResult, "history": keel.HistoryResult, "search": keel.SearchResult,
                "related": keel.RelatedResult, "annotate": keel.AnnotateResult}


def test_results_match_their_types(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEEL_ALLOW_GLOBAL_NOTES", "1")
    with keel.open(FINANCE, events=copy_finance(tmp_path)) as graph:
        tools = graph.tools(tenant=TENANT_A, agent=AGENT, task=TASK)
        notes = [tools.annotate("debt:visa", "next_step", "prepay", scope="task"),
                 tools.annotate("type:debt", "tip", {"compare": "rates"}, scope="global", evidence="snap-visa-2026-10")]
        results = [(tool, getattr(tools, tool)(*args, **kwargs)) for tool, args, kwargs in QUESTIONS]
        results += [("annotate", n) for n in notes] + [("context", tools.context("debt:visa"))]
    found = {p for tool, r in results for p in problems(r, RESULT_TYPES[tool], tool)}
    assert found == set()
    assert any("attached_to" in f for f in results[-1][1]["facts"])    # a global note, NotRequired key seen
    assert problems({"applied": "yes", "event_id": 1}, keel.AnnotateResult) == [   # the check is not vacuous
        "$.known_through: missing", "$.applied: 'yes' is not bool", "$.event_id: 1 is not str"]


def test_changes_match_their_type(tmp_path: Path) -> None:
    with keel.open(FINANCE, events=copy_finance(tmp_path)) as graph:
        tools = graph.tools(tenant=TENANT_A, agent=AGENT, task=TASK)
        tools.annotate("debt:visa", "next_step", "prepay", scope="task")
        tools.annotate("debt:visa", "next_step", scope="task", withdraw=True, reason="done")
        result = tools.history(since="2026-11-01", limit=500)
    assert {c["change"] for c in result["changes"]} >= {"version", "withdrawn"}
    assert problems(result, keel.ChangesResult) == []


def test_mcp_output_schemas_are_within_the_types() -> None:
    for spec in SPECS:
        declared = typing.get_type_hints(RESULT_TYPES[spec.name])
        if spec.name == "history":          # without an entity: the changes since a time
            declared |= typing.get_type_hints(keel.ChangesResult)
        assert set(spec.output_schema["properties"]) <= set(declared), spec.name


# ---- the docs -------------------------------------------------------------------------------------

def test_public_names_are_listed_once_and_documented() -> None:
    assert len(keel.__all__) == len(set(keel.__all__))
    assert all(hasattr(keel, name) for name in keel.__all__)
    text = (ROOT / "docs" / "python.md").read_text(encoding="utf-8")
    table = text.split("## Public names", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([\w.]+)` \| (stable|provisional) \|", table, re.MULTILINE)
    assert sorted(name for name, _ in rows) == sorted(keel.__all__)


def readme_example() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Calling the tools from Python", 1)[1].split("\n## ", 1)[0]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_readme_example_runs(tmp_path: Path) -> None:
    code = readme_example()
    assert "keel.open(" in code and ".annotate(" in code and len(code.strip().splitlines()) <= 14
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("KEEL_REDIS_URL", None)
    out = subprocess.run([sys.executable, "-c", code], cwd=str(ROOT), env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    expected = "due:visa-2026-11 overdue because of ['sched-visa-2026-11'] -> call the bank today"
    assert out.stdout.splitlines() == [expected]
    [copy] = tmp_path.glob("*/events.jsonl")
    note = json.loads(copy.read_text().splitlines()[-1])
    assert note["type"] == "keel.annotated" and note["payload"]["task"] == TASK


# ---- the Redis graph ------------------------------------------------------------------------------

def tenant_events(tmp_path: Path, tenant: str) -> Path:
    """The finance stream moved to `tenant`."""
    out = tmp_path / "events.jsonl"
    with out.open("w", encoding="utf-8") as f:
        for line in (FINANCE / "events.jsonl").read_text(encoding="utf-8").splitlines():
            f.write(json.dumps({**json.loads(line), "tenant": tenant}) + "\n")
    return out


@pytest.fixture
def tenant() -> str:
    return f"py-{secrets.token_hex(4)}"


@pytest.fixture
def redis_store(redis_url: str, private_finance: Path) -> Iterator[Any]:
    from keel.store.redis import RedisStore
    store = RedisStore.from_url(redis_url, namespace=load_cartridge(private_finance).name)
    try:
        yield store
    finally:
        store.drop_namespace()
        store.close()


@pytest.mark.services
def test_redis_answers_are_the_mcp_answers(tmp_path: Path, tenant: str, redis_store: Any, redis_url: str,
                                           kafka_bootstrap: str, private_finance: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The replay path fills Redis; keel.open finds it through KEEL_REDIS_URL (no argument), `keel serve`'s
    backend through its flag. The cartridge's topic exists, empty, so both measure the same `lag` (without it,
    Kafka may create it between the two measures)."""
    from keel.kafka import TopicSpec, ensure_topics
    from keel.wire import events_topic
    cartridge = load_cartridge(private_finance)
    asyncio.run(ensure_topics(kafka_bootstrap, [events_topic(cartridge.name)], TopicSpec()))
    report = replay_file(Projector(cartridge, redis_store), tenant_events(tmp_path, tenant))
    assert report.applied == 17 and not report.rejected
    monkeypatch.setenv("KEEL_REDIS_URL", redis_url)
    served = Backend.redis(cartridge, redis_url, resolve({}))
    try:
        with keel.open(private_finance) as graph:
            assert not graph.embedded
            tools = graph.tools(tenant=tenant, agent=AGENT, task=TASK)
            mcp = mcp_over(served, tenant)
            assert assert_answers_equal(tools, mcp) == len(QUESTIONS) + 2 * len(TIMES)
            assert_errors_equal(tools, mcp)

            async def side_by_side() -> list[Any]:       # docs/python.md: asyncio callers use to_thread
                return await asyncio.gather(*[asyncio.to_thread(tools.context, "debt:visa", at="2026-09-15")
                                              for _ in range(8)])
            answers = asyncio.run(side_by_side())
            assert answers == [tools.context("debt:visa", at="2026-09-15")] * 8
    finally:
        served.close()


@pytest.fixture
def worker(tmp_path: Path, tenant: str, redis_url: str, kafka_bootstrap: str, redis_store: Any,
           private_finance: Path) -> Iterator[None]:
    """The tenant's events published to the cartridge's topic and a worker applying them to Redis."""
    events = tenant_events(tmp_path, tenant)
    env = {**os.environ, "KEEL_REDIS_URL": redis_url, "KEEL_KAFKA_BOOTSTRAP": kafka_bootstrap}
    cli = [sys.executable, "-m", "keel.cli"]
    subprocess.run([*cli, "publish", str(private_finance), str(events)], cwd=str(ROOT), env=env, check=True,
                   capture_output=True, timeout=120)
    with (tmp_path / "worker.log").open("wb") as log:
        proc = subprocess.Popen([*cli, "worker", str(private_finance)], cwd=str(ROOT), env=env, stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        wait(lambda: redis_store.has_event(tenant, "pay-libranza-2026-11"), proc, tmp_path / "worker.log")
        yield
    finally:
        stop_process(proc, 30)


def wait(done: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while not done():
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "the worker did not apply the stream in 120 s"
        time.sleep(0.2)


@pytest.mark.services
def test_redis_annotate_is_the_mcp_annotate(worker: None, tenant: str, redis_url: str, kafka_bootstrap: str,
                                            private_finance: Path) -> None:
    """annotate through Kafka and a worker: the Python call returns once the note is applied, like MCP's."""
    settings = resolve({"redis": redis_url, "kafka": kafka_bootstrap})
    served = Backend.redis(load_cartridge(private_finance), redis_url, settings)
    try:
        with keel.open(private_finance, redis=redis_url, kafka=kafka_bootstrap) as graph:
            tools = graph.tools(tenant=tenant, agent=AGENT, task=TASK)
            mcp = mcp_over(served, tenant)
            mine, structured, text = annotate_both(tools, mcp, "debt:visa", "next_step", "prepay", scope="task",
                                                   evidence="snap-visa-2026-10")
            assert "lag" in mine and "lag" in structured    # measured from the log's end by each call: it may
            text = json.dumps({k: v for k, v in json.loads(text).items() if k != "lag"})  # differ between the two
            mine, structured = ({k: v for k, v in r.items() if k != "lag"} for r in (mine, structured))
            same(mine, structured, text)
            assert mine["applied"] is True
            seen = tools.context("debt:visa")["facts"]
            assert [f["value"] for f in seen if f["predicate"] == "next_step"] == ["prepay"]
            with pytest.raises(keel.NoteRefused) as raised:
                tools.annotate("debt:visa", "n", 1, scope="tenant")
            [(error, _, text)] = mcp.ask(("annotate", {"entity": "debt:visa", "predicate": "n", "value": 1,
                                                       "scope": "tenant"}))
            assert error and text == mcp_error("annotate", raised.value)
    finally:
        served.close()


def test_results_are_the_callers_to_change(graph: keel.Graph) -> None:
    """Changing a result or the value given to annotate changes nothing in the graph: the objects and arrays in
    a result are copies, not the embedded graph's, the search index's or the cartridge's own."""
    tools = graph.tools(tenant=TENANT_A, agent=AGENT)
    plan = {"steps": ["call", "prepay"]}
    note = tools.annotate("debt:visa", "plan", plan, scope="agent")
    plan["steps"].append("given")
    note["fact"]["value"]["steps"].append("returned")
    first = tools.context("debt:visa")
    [seen] = [f for f in first["facts"] if f["predicate"] == "plan"]
    seen["value"]["steps"].append("read")
    tools.history("debt:visa", "plan")["versions"][0]["value"]["steps"].append("history")
    first["rules"]["debt_expensive"]["rate_ea_pct"] = 0
    tools.search("visa")["results"][0]["labels"]["creditor"] = "changed"
    again = tools.context("debt:visa")
    assert [f["value"] for f in again["facts"] if f["predicate"] == "plan"] == [{"steps": ["call", "prepay"]}]
    assert again["rules"]["debt_expensive"]["rate_ea_pct"] == 25
    assert tools.search("visa")["results"][0]["labels"]["creditor"] == "Banco Andino"
    with pytest.raises(keel.UsageError, match="tuple is not a JSON value"):
        tools.annotate("debt:visa", "pair", (1, 2), scope="agent")
