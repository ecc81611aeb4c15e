"""Hybrid search (issue 46): BM25 fused with a semantic signal from a model shipped in a pinned package.

What is checked: a query finds by meaning what its words miss, and says so (`found_by`); the semantic side sees
exactly what the lexical side sees (`at`, `known_at`, note scopes, the tenant); equal graphs give equal answers;
a cartridge can turn the signal off and add synonyms; the model loads with the network namespace closed; `keel
digest` names the model beside a digest that does not depend on it."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import keel
from keel import MemoryStore, Tools, load_cartridge
from keel.cartridge import Cartridge
from keel.errors import CartridgeInvalid
from keel.search import SearchIndex
from keel.times import parse_time

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "corpus" / "directory"
APPOINTMENTS = ROOT / "cartridges" / "appointments"
FINANCE = ROOT / "cartridges" / "finance"
KEEL = [sys.executable, "-m", "keel.cli"]
T0, T1, T2 = parse_time("2026-01-01"), parse_time("2026-06-01"), parse_time("2026-09-01")
NOW = parse_time("2026-11-30T12:00:00Z")


def with_search(tmp_path: Path, base: Path, search: dict) -> Path:
    """A copy of a cartridge folder with a `search:` section in its cartridge.yaml (the format itself tested)."""
    folder = tmp_path / f"{base.name}-{len(list(tmp_path.iterdir()))}"
    shutil.copytree(base, folder)
    doc = yaml.safe_load((folder / "cartridge.yaml").read_text(encoding="utf-8"))
    doc["search"] = search
    (folder / "cartridge.yaml").write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
    return folder


def directory(cartridge: Cartridge | None = None) -> tuple[Cartridge, MemoryStore]:
    """The corpus cartridge over a store of its own: members labelled with everyday things, a label that
    starts mid-year, one renamed, one recorded late, a note of one agent, and a second tenant."""
    store = MemoryStore()
    store.upsert_entity("t", "member", "dentist", name="Dentist appointment", valid_from=T0, recorded_at=T0)
    store.upsert_entity("t", "member", "rent", name="rent invoice apartment 301", valid_from=T1, recorded_at=T0)
    store.upsert_entity("t", "member", "late", name="Tarjeta de crédito Visa", valid_from=T0, recorded_at=T2)
    store.upsert_entity("t", "member", "renamed", name="Dentist appointment two", valid_from=T0, recorded_at=T0)
    store.upsert_entity("t", "member", "renamed", name="Zeta", valid_from=T1, recorded_at=T1)
    store.upsert_entity("t", "member", "plain", name="Zorro", valid_from=T0, recorded_at=T0)
    store.open_fact("t", "member:plain", "memo", "rent invoice apartment 301", valid_from=T0, recorded_at=T0,
                    scope="agent", owner="a1")
    store.upsert_entity("u", "member", "dentist-u", name="Dentist appointment", valid_from=T0, recorded_at=T0)
    return cartridge or load_cartridge(CORPUS), store


def hits(tools: Tools, query: str, **options: object) -> list[tuple[str, str]]:
    return [(h["entity"], h["found_by"]) for h in tools.search(query, **options)["results"]]


def test_meaning_finds_what_words_miss_and_says_so() -> None:
    cartridge, store = directory()
    tools = Tools(cartridge, store, "t", clock=lambda: NOW)
    assert hits(tools, "dentista") == [("member:dentist", "semantic")]
    assert hits(tools, "housing") == [("member:rent", "semantic")]
    words = tools.search("Dentist appointment")["results"]
    assert words[0]["entity"] == "member:dentist" and words[0]["found_by"] == "both"
    assert {h["found_by"] for h in words} <= {"lexical", "both"}     # the words hit: no neighbours join
    assert hits(tools, "zebra unicorn") == [("member:plain", "semantic")]   # Zorro: a fox, an animal too
    miss = tools.search("xylophone quartet")
    assert miss["results"] == [] and "broader" in miss["message"]    # nothing near either: said so, as before


def test_the_semantic_side_sees_what_the_lexical_side_sees() -> None:
    cartridge, store = directory()
    a1 = Tools(cartridge, store, "t", agent="a1", clock=lambda: NOW)
    a2 = Tools(cartridge, store, "t", agent="a2", clock=lambda: NOW)
    assert ("member:plain", "semantic") in hits(a1, "housing")       # a1's own note, found by meaning
    assert "member:plain" not in [e for e, _ in hits(a2, "housing")]   # another agent's note: never
    assert hits(a1, "housing", at="2026-03-01") == [("member:plain", "semantic")]   # the label starts in June
    assert hits(a1, "tarjeta de crédito") == [("member:late", "both")]
    assert "member:late" not in [e for e, _ in hits(a1, "tarjeta de crédito", known_at="2026-08-01")]  # September
    assert "member:renamed" not in [e for e, _ in hits(a1, "dentista")]   # a former name, today
    assert ("member:renamed", "semantic") in hits(a1, "dentista", at="2026-03-01")   # when it was the name
    other = Tools(cartridge, store, "u", clock=lambda: NOW)
    assert hits(other, "dentista") == [("member:dentist-u", "semantic")]   # the tenant's own entities only


def test_equal_graphs_give_equal_answers_and_a_rebuild_reuses_vectors(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = []
    for _ in range(2):
        cartridge, store = directory()
        tools = Tools(cartridge, store, "t", agent="a1", clock=lambda: NOW)
        answers.append(json.dumps([tools.search(q) for q in ("dentista", "housing", "Dentist", "crédito visa")]))
    assert answers[0] == answers[1]
    cartridge, store = directory()
    tools = Tools(cartridge, store, "t", clock=lambda: NOW)
    first = SearchIndex(store.search_entities("t"), tools.search_options())
    def refuse(text: str) -> None:
        raise AssertionError(f"embedded again: {text!r}")
    monkeypatch.setattr("keel.semantic.embed", refuse)
    again = SearchIndex(store.search_entities("t"), tools.search_options(), previous=first)
    monkeypatch.undo()
    assert again.text_rows == first.text_rows and (again.matrix == first.matrix).all()   # taken, not embedded
    assert (again._cosines(first.matrix[0]) == first._cosines(first.matrix[0])).all()


def test_a_cartridge_turns_the_semantic_signal_off_and_adds_synonyms(tmp_path: Path) -> None:
    cartridge, store = directory(load_cartridge(with_search(tmp_path, CORPUS, {"semantic": False})))
    tools = Tools(cartridge, store, "t", clock=lambda: NOW)
    assert hits(tools, "dentista") == []
    assert all(found == "lexical" for _, found in hits(tools, "Dentist appointment"))
    index = tools._search_index()
    assert index.matrix is None                                   # no vectors, the model never asked
    synonyms = load_cartridge(with_search(tmp_path, CORPUS, {"semantic": False, "synonyms": [
        ["dentista", "dentist"], ["housing", "rent invoice"]]}))
    tools = Tools(synonyms, store, "t", clock=lambda: NOW)
    assert hits(tools, "dentista") == [("member:dentist", "lexical")]   # the cartridge's own list, by words
    assert hits(tools, "housing") == [("member:rent", "lexical")]       # a phrase member: all its words


@pytest.mark.parametrize(("search", "problem"), [
    ({"semantic": "maybe"}, "search.semantic"),
    ({"synonyms": [["alone"]]}, "two or more"),
    ({"synonyms": [["a", " "]]}, "two or more"),
    ({"colour": 1}, "this part takes semantic, synonyms"),
])
def test_a_bad_search_section_is_refused_with_its_reason(tmp_path: Path, search: dict, problem: str) -> None:
    with pytest.raises(CartridgeInvalid, match=problem):
        load_cartridge(with_search(tmp_path, CORPUS, search))


def test_search_loads_its_model_with_the_network_namespace_closed(tmp_path: Path) -> None:
    """`unshare -rn`: a user and network namespace with no interface but loopback, down; a download attempt
    fails there. The model is read from its package, so search answers by meaning all the same."""
    events = tmp_path / "events.jsonl"
    shutil.copyfile(APPOINTMENTS / "events.jsonl", events)
    probe = subprocess.run(["unshare", "-rn", sys.executable, "-c",
                            "import socket; socket.create_connection(('1.1.1.1', 443), timeout=3)"],
                           capture_output=True, text=True, timeout=60, check=False)
    assert probe.returncode != 0 and "unreachable" in probe.stderr.lower()   # the namespace has no network
    out = subprocess.run(["unshare", "-rn", *KEEL, "search", str(APPOINTMENTS), str(events), "dentista", "--json"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    assert out.returncode == 0, out.stderr
    results = json.loads(out.stdout)["results"]
    assert [(r["entity"], r["found_by"]) for r in results][:1] == [("appointment:dentist-1", "semantic")]


def digest(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KEEL, "digest", *args], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          check=False)


def test_keel_digest_names_the_model_beside_a_digest_that_does_not_depend_on_it(tmp_path: Path) -> None:
    from keel.semantic import identity
    assert identity().startswith("wordllama 0.4.0.post1 l2_supercat-256 sha256:")
    events = str(FINANCE / "events.jsonl")
    plain = digest(str(FINANCE), events)
    assert plain.returncode == 0 and plain.stdout.startswith("sha256:") and len(plain.stdout.splitlines()) == 1
    assert "search" not in plain.stderr                                # the default output is the digest alone
    named = digest(str(FINANCE), events, "--search-model")
    assert named.returncode == 0, named.stderr
    assert named.stdout.splitlines() == [plain.stdout.strip(), f"search-model {identity()}"]
    off = digest(str(with_search(tmp_path, FINANCE, {"semantic": False})), events, "--search-model")
    assert off.returncode == 0 and off.stdout.splitlines() == [plain.stdout.strip(), "search-model none"]
    several = digest(f"{FINANCE},{APPOINTMENTS}", f"{events},{APPOINTMENTS / 'events.jsonl'}", "--tenant",
                     "hogar-demo", "--search-model")
    assert several.returncode == 0, several.stderr
    lines = several.stdout.splitlines()
    assert lines[-2].startswith("all sha256:") and lines[-1] == f"search-model {identity()}"


def test_search_hits_carry_found_by_through_several_cartridges() -> None:
    with keel.open_several([FINANCE, APPOINTMENTS], events=[FINANCE / "events.jsonl",
                                                           APPOINTMENTS / "events.jsonl"]) as graph:
        tools = graph.tools(tenant="hogar-demo")
        results = tools.search("dentista")["results"]
        assert [(r["entity"], r["found_by"]) for r in results][:1] == [("appointment:dentist-1", "semantic")]
        assert all(r["found_by"] in ("lexical", "semantic", "both") for r in tools.search("visa")["results"])
