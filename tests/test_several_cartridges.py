"""Several cartridges per tenant (issue 27, item 3): the finance and appointments samples read as one, with
the appointments' cross-cartridge relations to finance's household and debts, on the embedded graph and on
Redis; `validate` refusing clashes; qualified names; one MCP server over both."""
from __future__ import annotations

import json
import shutil
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml
from support.mcp_sessions import FINANCE, ROOT, TENANT_A, ok, stdio_session
from support.services import service_env
from support.workers import WorkerProcess, services_env, unique_cartridge, wait_applied
from support.workers import keel as run_keel
from test_python_api import Mcp

import keel
from keel.audit import AuditFile, read_records
from keel.cartridge import load_cartridge
from keel.cartridge_set import CartridgeSet
from keel.cli import main
from keel.connect import Graph, GraphSet
from keel.digest import digest, set_digest
from keel.embedded import replay_file
from keel.errors import CartridgeInvalid, UnknownTenant, UsageError
from keel.projector import Projector
from keel.store.redis import RedisStore
from tools_server.backend import Backend
from tools_server.config import Identity, ServerConfig
from tools_server.server import build_server

APPOINTMENTS = ROOT / "cartridges" / "appointments"
SALON = ROOT / "cartridges" / "salon"
SINCE = "2026-08-01"


@pytest.fixture
def files(tmp_path: Path) -> list[Path]:
    """Scratch copies of both sample streams (annotate appends to them)."""
    out = []
    for folder in (FINANCE, APPOINTMENTS):
        path = tmp_path / f"{folder.name}.jsonl"
        shutil.copyfile(folder / "events.jsonl", path)
        out.append(path)
    return out


@pytest.fixture
def both(files: list[Path]) -> Iterator[GraphSet]:
    with keel.open_several([FINANCE, APPOINTMENTS], events=files) as graph:
        yield graph


def copy_cartridge(tmp_path: Path, folder: Path, **changes: Any) -> Path:
    """A copy of a sample cartridge with top-level keys of its cartridge.yaml changed."""
    target = tmp_path / folder.name
    shutil.copytree(folder, target)
    doc = yaml.safe_load((target / "cartridge.yaml").read_text())
    doc.update(changes)
    (target / "cartridge.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return target


def relations(result: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(r["subject"], r["relation"], r["object"]) for r in result["relations"]}


def apply(projector: Projector, envelope: dict[str, Any]) -> None:
    projector.apply(projector.parse(envelope))


def walk(tools: Any, limit: int) -> list[dict[str, Any]]:
    """Every change from SINCE on, following cursors until the logs' end."""
    answers = [tools.history(since=SINCE, limit=limit)]
    while answers[-1]["more"]:
        answers.append(tools.history(cursor=answers[-1]["cursor"], limit=limit))
    return [c for a in answers for c in a["changes"]]


# ---- checked together ------------------------------------------------------------------------------------

def test_validate_refuses_a_clash_naming_both_cartridges(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", f"{FINANCE},{APPOINTMENTS},{SALON}"]) == 2
    err = capsys.readouterr().err
    assert "entity type 'appointment' is declared by both appointments and salon" in err
    assert "qualified: true" in err
    qualified = copy_cartridge(tmp_path, SALON, qualified=True)
    assert main(["validate", f"{FINANCE},{APPOINTMENTS},{qualified}"]) == 0
    assert "together: ok (3 cartridges" in capsys.readouterr().out


def test_a_relation_to_a_cartridge_not_given_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(APPOINTMENTS)]) == 0          # alone it is valid: the other end is named
    assert main(["validate", f"{APPOINTMENTS},{SALON}"]) == 2
    err = capsys.readouterr().err
    assert "relations.for_household.to: 'finance.household' names cartridge 'finance', which is not among" in err
    with pytest.raises(CartridgeInvalid):
        CartridgeSet([load_cartridge(APPOINTMENTS), load_cartridge(SALON)])


def test_a_foreign_end_the_cartridge_also_declares_is_refused(tmp_path: Path) -> None:
    doc = yaml.safe_load((APPOINTMENTS / "cartridge.yaml").read_text())
    folder = copy_cartridge(tmp_path, APPOINTMENTS, entities={**doc["entities"], "debt": {}})
    with pytest.raises(CartridgeInvalid) as e:
        load_cartridge(folder)
    assert any("this cartridge declares 'debt' too" in p for p in e.value.problems)


def test_one_events_file_per_cartridge(files: list[Path]) -> None:
    with pytest.raises(UsageError, match="one events file per cartridge"):
        keel.open_several([FINANCE, APPOINTMENTS], events=files[:1])


# ---- the five tools over both ------------------------------------------------------------------------------

def test_each_entity_is_answered_by_its_cartridge(both: GraphSet) -> None:
    tools = both.tools(tenant=TENANT_A)
    visa = tools.context("debt:visa")
    assert visa["type"] == "debt" and "debt_expensive" in visa["rules"]
    dentist = tools.context("appointment:dentist-1")
    assert dentist["labels"]["title"] == "Dentist check-up" and set(dentist["rules"]) == {"appointment_costly"}
    assert {f["predicate"]: f["value"] for f in dentist["facts"]}["fee_cop"] == 230000    # the late correction
    with pytest.raises(UsageError, match="not an entity type of the cartridges; use one of account, appointment"):
        tools.context("client:ana")


def test_a_cross_cartridge_relation_is_followed_both_ways(both: GraphSet) -> None:
    tools = both.tools(tenant=TENANT_A)
    household = tools.related("household:hogar-demo")
    assert {("debt:visa", "owed_by", "household:hogar-demo"),
            ("appointment:dentist-1", "for_household", "household:hogar-demo"),
            ("appointment:bank-1", "for_household", "household:hogar-demo")} <= relations(household)
    only = tools.related("household:hogar-demo", "for_household")
    assert relations(only) == {("appointment:dentist-1", "for_household", "household:hogar-demo"),
                               ("appointment:bank-1", "for_household", "household:hogar-demo")}
    assert ("appointment:dentist-1", "charged_to", "debt:visa") in relations(tools.context("debt:visa"))
    assert ("appointment:dentist-1", "charged_to", "debt:visa") in relations(tools.related("appointment:dentist-1"))
    before = tools.related("debt:visa", at="2026-09-15")     # charged on 2026-09-20
    assert not any(r["relation"] == "charged_to" for r in before["relations"])
    with pytest.raises(UsageError, match="has no end at"):
        tools.related("debt:visa", "with_provider")
    assert tools.history("debt:visa", "balance_cop")["versions"]           # its own facts, by name
    with pytest.raises(UsageError, match="is not a fact, label or relation of debt:visa"):
        tools.history("debt:visa", "with_provider")
    versions = tools.history("debt:visa", "charged_to")
    assert [(r["subject"], r["evidence"]) for r in versions["relations"]] == [("appointment:dentist-1",
                                                                               "charge-dentist-1")]


def test_search_spans_both_and_type_narrows(both: GraphSet) -> None:
    tools = both.tools(tenant=TENANT_A)
    hits = [h["entity"] for h in tools.search("visa dentist", limit=20)["results"]]
    assert "debt:visa" in hits and "appointment:dentist-1" in hits
    assert "household:hogar-demo" not in [h["entity"] for h in tools.search("hogar", type="appointment")["results"]]
    narrowed = tools.search("visa", type="appointment")["results"]
    assert [h["entity"] for h in narrowed] == ["appointment:bank-1"]      # "Refinance the Visa"
    scores = [h["score"] for h in tools.search("visa dentist", limit=20)["results"]]
    assert scores == sorted(scores, reverse=True)


def test_changes_since_merge_both_logs_in_recorded_order(both: GraphSet) -> None:
    tools = both.tools(tenant=TENANT_A)
    whole = tools.history(since=SINCE, limit=500)
    assert not whole["more"]
    mine = whole["changes"]
    alone = [c for name in ("finance", "appointments")
             for c in both.graphs[name].tools(tenant=TENANT_A).history(since=SINCE, limit=500)["changes"]]
    key = lambda c: json.dumps(c, sort_keys=True)
    assert Counter(map(key, mine)) == Counter(map(key, alone))               # every change, once
    stamps = [c["recorded_at"] for c in mine]
    assert stamps == sorted(stamps)
    for limit in (1, 2, 3, 7):
        assert walk(tools, limit) == mine, limit                            # paging misses and repeats nothing
    later = tools.history(cursor=whole["cursor"])
    assert later["changes"] == [] and not later["more"]
    tools.annotate("appointment:bank-1", "reminder", "call the bank", scope="tenant", evidence="cancel-bank-1")
    news = tools.history(cursor=whole["cursor"])["changes"]
    assert [(c["entity"], c["what"], c["name"]) for c in news] == [("appointment:bank-1", "note", "reminder")]
    assert [c["entity"] for c in tools.history(since=SINCE, type="appointment", limit=500)["changes"]
            ] == [c["entity"] for c in mine + news if c["entity"].startswith("appointment:")]


def test_notes_go_to_the_entitys_cartridge_and_can_be_withdrawn(both: GraphSet, files: list[Path]) -> None:
    tools = both.tools(tenant=TENANT_A, agent="a1", task="t1")
    tools.annotate("appointment:dentist-1", "bring", "x-rays", scope="task")
    assert "x-rays" in files[1].read_text() and "x-rays" not in files[0].read_text()
    closed = tools.annotate("appointment:dentist-1", "bring", scope="task", withdraw=True, reason="not needed")
    assert closed["fact"]["withdrawn"]["reason"] == "not needed"
    with pytest.raises(UsageError):
        tools.annotate("type:client", "hint", "x", scope="global")


def test_digest_covers_each_cartridge_and_all(files: list[Path], both: GraphSet,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["digest", f"{FINANCE},{APPOINTMENTS}", "--events", f"{files[0]},{files[1]}"]) == 0
    lines = capsys.readouterr().out.split()
    assert lines[0::2] == ["appointments", "finance", "all"]
    assert lines[3] == digest(both.graphs["finance"].store, TENANT_A)
    with keel.open(FINANCE, events=files[0]) as alone:
        assert digest(alone.store, TENANT_A) == lines[3]


def test_qualified_names_read_with_their_cartridge(tmp_path: Path, files: list[Path]) -> None:
    salon = copy_cartridge(tmp_path, SALON, qualified=True)
    salon_events = tmp_path / "salon.jsonl"
    shutil.copyfile(SALON / "events.jsonl", salon_events)
    tenant = json.loads(salon_events.read_text().splitlines()[0])["tenant"]
    with keel.open_several([FINANCE, APPOINTMENTS, salon], events=[*files, salon_events]) as graph:
        tools = graph.tools(tenant=tenant)
        hits = tools.search("appointment", limit=50)["results"]
        assert hits and all(h["entity"].startswith("salon.") and h["type"].startswith("salon.") for h in hits)
        entity = next(h["entity"] for h in hits if h["type"] == "salon.appointment")
        context = tools.context(entity)
        assert context["entity"] == entity and context["type"] == "salon.appointment"
        assert context["relations"] and all(r["relation"].startswith("salon.") and r["subject"].startswith("salon.")
                                            for r in context["relations"])
        assert tools.related(entity, context["relations"][0]["relation"])["relations"]
        with pytest.raises(UnknownTenant):        # appointments' own type: its graph has nothing of this tenant
            tools.context(entity.removeprefix("salon."))
        assert all(c["entity"].startswith("salon.") for c in tools.history(since=SINCE, limit=50)["changes"])


def test_one_mcp_server_serves_both(both: GraphSet) -> None:
    settings = keel.config.resolve({})
    mcp = Mcp(build_server(ServerConfig(Backend.of(both, settings), identity=Identity(TENANT_A, "a1", "t1"))))
    calls = [("context", {"entity": "appointment:dentist-1"}), ("related", {"entity": "household:hogar-demo"}),
             ("search", {"query": "visa dentist"}), ("history", {"since": SINCE, "limit": 5}),
             ("history", {"entity": "debt:visa"})]
    tools = both.tools(tenant=TENANT_A, agent="a1", task="t1")
    python = [tools.context("appointment:dentist-1"), tools.related("household:hogar-demo"),
              tools.search("visa dentist"), tools.history(since=SINCE, limit=5), tools.history("debt:visa")]
    for (error, structured, _), mine in zip(mcp.ask(*calls), python, strict=True):
        assert not error and structured == json.loads(json.dumps(mine))


def test_keel_serve_takes_several_cartridges(files: list[Path]) -> None:
    """`keel serve A,B --events a,b` as an agent starts it: one stdio server, one tool list, both graphs."""
    async def go() -> None:
        async with stdio_session(f"{FINANCE},{APPOINTMENTS}", "--events", f"{files[0]},{files[1]}",
                                 "--no-call-log") as session:
            listed = await session.list_tools()
            assert sorted(t.name for t in listed.tools) == ["annotate", "context", "history", "related", "search"]
            answer = await ok(session, "related", {"entity": "debt:visa", "relation": "charged_to"})
            assert relations(answer) == {("appointment:dentist-1", "charged_to", "debt:visa")}
    anyio.run(go)


def test_a_recorded_call_of_both_is_replayed(files: list[Path], tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """The audit record of a two-cartridge server names the set; `keel audit replay` of the same folders
    reproduces the answer."""
    log = tmp_path / "audit.jsonl"
    graph = keel.open_several([FINANCE, APPOINTMENTS], events=files)
    backend = Backend.of(graph, keel.config.resolve({}))
    backend.audit = AuditFile(log)
    mcp = Mcp(build_server(ServerConfig(backend, identity=Identity(TENANT_A, "a1", "t1"))))
    try:
        [(error, _, _)] = mcp.ask(("related", {"entity": "debt:visa", "relation": "charged_to"}))
    finally:
        backend.close()
    assert not error
    [record] = list(read_records(log))
    assert record["cartridge"] == "appointments-finance"
    assert main(["audit", "replay", record["id"], f"{FINANCE},{APPOINTMENTS}", "--events", f"{files[0]},{files[1]}",
                 "--audit", str(log), "--entity", "debt:visa"]) == 0, capsys.readouterr()


# ---- Redis ----------------------------------------------------------------------------------------------

@pytest.fixture
def on_redis(files: list[Path]) -> Iterator[GraphSet]:
    url = service_env("KEEL_REDIS_URL")
    probe = RedisStore.from_url(url, namespace=f"probe{uuid.uuid4().hex[:12]}")    # private: stamped, then dropped
    cartridges = [load_cartridge(FINANCE), load_cartridge(APPOINTMENTS)]
    graphs = {}
    for cartridge, path in zip(cartridges, files):
        store = RedisStore(probe.client, namespace=f"sev{uuid.uuid4().hex[:12]}", owns_client=False)
        replay_file(Projector(cartridge, store), path)
        graphs[cartridge.name] = Graph(cartridge, store, None)
    yield GraphSet(CartridgeSet(cartridges), graphs)
    for graph in graphs.values():
        graph.store.drop_namespace()          # type: ignore[attr-defined]
    probe.drop_namespace()
    probe.close()


@pytest.mark.services
def test_redis_answers_as_the_embedded_graph(both: GraphSet, on_redis: GraphSet) -> None:
    mine, theirs = both.tools(tenant=TENANT_A), on_redis.tools(tenant=TENANT_A)
    for ask in (lambda t: t.context("debt:visa"), lambda t: t.related("household:hogar-demo"),
                lambda t: t.related("debt:visa", at="2026-09-25"), lambda t: t.search("visa dentist"),
                lambda t: t.history("debt:visa", "charged_to"), lambda t: t.history("appointment:dentist-1"),
                lambda t: t.history(since=SINCE, limit=500)):
        assert ask(theirs) == ask(mine)
    assert walk(theirs, 3) == walk(mine, 3)
    stores = lambda g: {n: x.store for n, x in g.graphs.items()}
    assert set_digest(stores(on_redis), TENANT_A) == set_digest(stores(both), TENANT_A)


@pytest.mark.services
def test_redis_paging_while_both_logs_grow_misses_and_repeats_nothing(on_redis: GraphSet) -> None:
    tools = on_redis.tools(tenant=TENANT_A)
    projectors = {n: Projector(g.cartridge, g.store) for n, g in on_redis.graphs.items()}
    seen: list[dict[str, Any]] = []
    answer = tools.history(since=SINCE, limit=4)
    n = 0
    while True:
        seen += answer["changes"]
        n += 1
        if n <= 6:                 # both logs grow between pages, later than everything before
            day = f"2026-12-{n:02d}"
            apply(projectors["appointments"], {"id": f"more-{n}", "tenant": TENANT_A, "type": "appointment.booked",
                                              "subject": f"appointment:extra-{n}", "occurred_at": day,
                                              "payload": {"provider": "dr-rojas", "title": f"Extra {n}",
                                                          "starts_at": f"{day}T10:00:00Z", "fee_cop": 1000 * n}})
            apply(projectors["finance"], {"id": f"snap-{n}", "tenant": TENANT_A, "type": "debt.snapshot",
                                         "subject": "debt:visa", "occurred_at": day,
                                         "payload": {"creditor": "Banco Andino", "product": "Visa",
                                                     "balance_cop": 1000 * n, "rate_ea_pct": 29.22,
                                                     "installment_cop": 380000, "month": day[:7]}})
        elif not answer["more"]:
            break
        answer = tools.history(cursor=answer["cursor"], limit=4)
    assert seen == tools.history(since=SINCE, limit=500)["changes"]


# ---- workers, status, replay and digest over Kafka and Redis --------------------------------------------

def unique_pair(tmp_path: Path) -> tuple[Path, Path]:
    """Copies of finance and appointments under fresh names (fresh topics and namespaces), the appointments'
    cross-cartridge ends renamed with them."""
    finance = unique_cartridge(tmp_path, "finance")
    appointments = unique_cartridge(tmp_path, "appointments")
    name = load_cartridge(finance).name
    yaml_file = appointments / "cartridge.yaml"
    yaml_file.write_text(yaml_file.read_text().replace("finance.", f"{name}."))
    return finance, appointments


@pytest.mark.services
def test_one_worker_status_replay_and_digest_take_both(tmp_path: Path) -> None:
    env = services_env()
    finance, appointments = unique_pair(tmp_path)
    both = f"{finance},{appointments}"
    for folder in (finance, appointments):
        run_keel("publish", str(folder), str(folder / "events.jsonl"), env=env)
    worker = WorkerProcess([Path(both)], env, tmp_path / "worker.log")
    try:
        for folder in (finance, appointments):
            wait_applied(folder, env, len((folder / "events.jsonl").read_text().splitlines()), worker)
        shown = json.loads(run_keel("status", both, "--json", env=env).stdout)
        assert set(shown) == {load_cartridge(finance).name, load_cartridge(appointments).name}
        assert all(doc["lag"] == 0 and not doc["unavailable"] for doc in shown.values())
        embedded = run_keel("digest", both, "--events", f"{finance / 'events.jsonl'},{appointments / 'events.jsonl'}",
                        "--tenant", TENANT_A, env=env).stdout
        assert run_keel("digest", both, "--redis", env["KEEL_REDIS_URL"], "--tenant", TENANT_A, env=env).stdout == embedded
        related = json.loads(run_keel("related", both, "--redis", env["KEEL_REDIS_URL"], "--tenant", TENANT_A,
                                  "debt:visa", "charged_to", "--json", env=env).stdout)
        assert relations(related) == {("appointment:dentist-1", "charged_to", "debt:visa")}
        replayed = run_keel("replay", both, "--all", "--quiet", env=env)
        assert replayed.returncode == 0
        assert run_keel("digest", both, "--redis", env["KEEL_REDIS_URL"], "--tenant", TENANT_A, env=env).stdout == embedded
    finally:
        assert worker.terminate() == 0
