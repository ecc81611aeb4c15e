"""Rule verdicts (`when:` in CEL, keel/rules.py) on a cartridge written here, unlike the shipped ones."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from keel import CartridgeInvalid, Tools, load_cartridge
from keel.embedded import build_embedded
from keel.rules import cel_value, names_used
from keel.times import parse_time

HANDLERS = '''from keel import Registry
registry = Registry()


@registry.on("tank.read")
def tank_read(event, store):
    p = event.payload
    store.upsert_entity(event.tenant, "tank", event.subject_id, site=p["site"], inspected_on=p["inspected_on"])
    store.open_fact(event.tenant, event.subject, "level_l", p["level_l"], valid_from=event.occurred_at)
    if "capacity_l" in p:
        store.open_fact(event.tenant, event.subject, "capacity_l", p["capacity_l"], valid_from=event.occurred_at)
    store.open_fact(event.tenant, event.subject, "grade", p["grade"], valid_from=event.occurred_at)
    store.link(event.tenant, event.subject, "at_site", f"site:{p['site']}", event.occurred_at)
'''
CATALOG = {
    "name": "tanks",
    "entities": {"tank": {}, "site": {}},
    "relations": {"at_site": {"from": "tank", "to": "site"}},
    "events": {"tank.read": {"subject": "tank", "owner": "scada",
                             "payload": {"site": "string", "level_l": "number", "capacity_l": "optional integer",
                                         "grade": "string", "inspected_on": "date"}}},
}
RULES = {
    "nearly_full": {"applies_to": "tank", "definition": "Above the share of capacity.",
                    "when": "facts.level_l / facts.capacity_l > params.share", "share": 0.9},
    "low": {"applies_to": "tank", "definition": "Below the floor.", "when": "facts.level_l < params.floor_l",
            "floor_l": 100},
    "graded": {"applies_to": "tank", "definition": "Grade compared as a number (a mistake).",
               "when": "facts.grade > 3"},
    "share_of_nothing": {"applies_to": "tank", "definition": "Divides by zero.", "when": "1 / int(params.zero) > 0",
                         "zero": 0},
    "not_boolean": {"applies_to": "tank", "definition": "Gives a number.", "when": "facts.level_l + 1.0"},
    "inspection_due": {"applies_to": "tank", "definition": "Inspected more than 30 days before at.",
                       "when": "at - labels.inspected_on > duration('720h') && 'site:' + labels.site in "
                               "relations.at_site"},
    "described": {"applies_to": "tank", "definition": "No condition: parameters only.", "limit": 3},
}
EVENTS = [
    {"id": "r1", "tenant": "t1", "type": "tank.read", "subject": "tank:a", "occurred_at": "2026-03-01",
     "payload": {"site": "north", "level_l": 950, "capacity_l": 1000, "grade": "B", "inspected_on": "2026-02-01"}},
    {"id": "r2", "tenant": "t1", "type": "tank.read", "subject": "tank:a", "occurred_at": "2026-03-05",
     "recorded_at": "2026-03-10T00:00:00Z",
     "payload": {"site": "north", "level_l": 80.0, "capacity_l": 1000, "grade": "B", "inspected_on": "2026-02-01"}},
    {"id": "r3", "tenant": "t1", "type": "tank.read", "subject": "tank:b", "occurred_at": "2026-03-01",
     "payload": {"site": "south", "level_l": 400, "grade": "A", "inspected_on": "2026-02-25"}},
]
NOW = parse_time("2026-03-20T00:00:00Z")


def write_cartridge(folder: Path, rules: dict, events: list[dict] = EVENTS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cartridge.yaml").write_text(json.dumps({**CATALOG, "rules": rules}))   # JSON is YAML
    (folder / "handlers.py").write_text(HANDLERS)
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    return folder


@pytest.fixture
def tools(tmp_path: Path) -> Tools:
    folder = write_cartridge(tmp_path / "tanks", RULES)
    cartridge = load_cartridge(folder)
    projector, report = build_embedded(cartridge, folder / "events.jsonl")
    assert not report.rejected
    return Tools(cartridge, projector.store, "t1", clock=lambda: NOW)


def rules(tools: Tools, entity: str, **times: str) -> dict:
    return tools.context(entity, **times)["rules"]


def test_verdicts_follow_world_and_knowledge_time(tools: Tools) -> None:
    assert rules(tools, "tank:a", at="2026-03-02")["nearly_full"] == {
        "definition": "Above the share of capacity.", "share": 0.9,
        "when": "facts.level_l / facts.capacity_l > params.share", "holds": True, "because": ["r1"]}
    assert rules(tools, "tank:a")["nearly_full"]["holds"] is False
    assert (rules(tools, "tank:a")["low"]["holds"], rules(tools, "tank:a")["low"]["because"]) == (True, ["r2"])
    # on 8 March the low reading of 5 March was not known yet: Keel answered with the reading it had
    before = rules(tools, "tank:a", at="2026-03-06", known_at="2026-03-08")
    assert (before["low"]["holds"], before["low"]["because"]) == (False, ["r1"])


def test_a_missing_fact_gives_null_with_its_name(tools: Tools) -> None:
    verdict = rules(tools, "tank:b")["nearly_full"]
    assert verdict["holds"] is None and verdict["missing"] == ["capacity_l"] and verdict["because"] == ["r3"]


def test_failed_evaluations_are_null_with_a_reason(tools: Tools) -> None:
    r = rules(tools, "tank:a")
    assert r["graded"]["holds"] is None and "overload" in r["graded"]["reason"].lower()     # string > number
    assert r["share_of_nothing"]["holds"] is None and "zero" in r["share_of_nothing"]["reason"].lower()
    assert r["not_boolean"]["holds"] is None and "not true or false" in r["not_boolean"]["reason"]
    assert "missing" not in r["graded"]


def test_dates_compare_in_time_order_and_relations_are_ids(tools: Tools) -> None:
    assert rules(tools, "tank:a", at="2026-03-02")["inspection_due"]["holds"] is False
    assert rules(tools, "tank:a", at="2026-03-04")["inspection_due"]["holds"] is True
    assert rules(tools, "tank:b")["inspection_due"]["holds"] is False


def test_a_rule_without_when_is_unchanged(tools: Tools) -> None:
    assert rules(tools, "tank:a")["described"] == {"definition": "No condition: parameters only.", "limit": 3}


def test_identical_bytes_across_runs(tmp_path: Path) -> None:
    folder = write_cartridge(tmp_path / "tanks", RULES)
    code = ("import sys, json; from keel import load_cartridge, Tools; from keel.embedded import build_embedded\n"
            "c = load_cartridge(sys.argv[1]); p, _ = build_embedded(c, sys.argv[1] + '/events.jsonl')\n"
            "t = Tools(c, p.store, 't1')\n"
            "print(json.dumps([t.context(e, at='2026-03-06') for e in ('tank:a', 'tank:b')]))")
    outs = {subprocess.run([sys.executable, "-c", code, str(folder)], capture_output=True, check=True).stdout
            for _ in range(2)}
    assert len(outs) == 1 and b'"holds"' in outs.pop()


def test_validate_reports_compile_errors_and_unknown_names_by_rule(tmp_path: Path) -> None:
    bad = {"broken": {"applies_to": "tank", "definition": "d", "when": "facts.level_l >"},
           "stray": {"applies_to": "tank", "definition": "d", "when": "level_l > params.limit", "limit": 1},
           "unset": {"applies_to": "tank", "definition": "d", "when": "facts.level_l > params.limt", "limit": 1},
           "nowhere": {"applies_to": "tank", "definition": "d", "when": "relations.owned_by.size() > 0"},
           "reserved": {"applies_to": "tank", "definition": "d", "holds": 1}}
    with pytest.raises(CartridgeInvalid) as e:
        load_cartridge(write_cartridge(tmp_path / "bad", bad))
    text = str(e.value)
    assert "rules.broken.when: does not compile" in text
    assert "rules.stray.when: unknown name 'level_l'" in text
    assert "rules.unset.when: params.limt is not a parameter" in text
    assert "rules.nowhere.when: relations.owned_by" in text
    assert "rules.reserved.holds: a reserved key" in text


def test_validate_with_events_checks_names_and_types_against_the_stream(tmp_path: Path) -> None:
    rules = {"low": {"applies_to": "tank", "definition": "d", "when": "facts.levl_l < 1.0"},
             "graded": RULES["graded"], "fine": RULES["low"]}
    folder = write_cartridge(tmp_path / "typo", rules)
    run = subprocess.run([sys.executable, "-m", "keel.cli", "validate", str(folder), "--events",
                          str(folder / "events.jsonl")], check=False, capture_output=True, text=True)
    assert run.returncode == 2 and "rules.low.when: facts.levl_l is not a fact" in run.stderr
    assert "rules.graded.when: on tank:a (tenant t1): TypeError: No such overload" in run.stderr
    assert "rules.fine" not in run.stderr


def test_numbers_are_one_type_and_date_strings_are_timestamps() -> None:
    assert cel_value(20) == 20.0 and isinstance(cel_value(20), float) and cel_value(True) is True
    assert cel_value("2026-11-05").isoformat() == "2026-11-05T00:00:00+00:00"
    assert cel_value("2026-11-05T10:00:00-05:00").isoformat() == "2026-11-05T15:00:00+00:00"
    assert cel_value("2026-11") == "2026-11" and cel_value("2026-13-45") == "2026-13-45"
    assert cel_value({"a": [1, "x"]}) == {"a": [1.0, "x"]}


def test_names_used_ignores_strings_fields_and_bound_variables() -> None:
    n = names_used("facts.a > 1.0 && facts['b'] == 'facts.c' && x.facts.d && [1].all(y, y > params.p) && q")
    assert n.selected["facts"] == {"a", "b"} and n.selected["params"] == {"p"}
    assert n.free == {"x", "q"} and not n.whole
    assert names_used("'a' in facts").whole == {"facts"}


def test_a_declared_relation_without_a_link_is_an_empty_list(tmp_path: Path) -> None:
    """Issue 21: `size(relations.x) == 0` gave `KeyError: 'x'` for an entity with no link (never linked, or
    unlinked); every relation the cartridge declares for the rule's type is in `relations`."""
    unlinked = {"applies_to": "tank", "definition": "No site.", "when": "size(relations.at_site) == 0"}
    events = [*EVENTS,
              {"id": "r4", "tenant": "t1", "type": "tank.read", "subject": "tank:c", "occurred_at": "2026-03-01",
               "payload": {"site": "east", "level_l": 1, "grade": "A", "inspected_on": "2026-02-25"}},
              {"id": "r5", "tenant": "t1", "type": "keel.retracted", "subject": "tank:c",
               "occurred_at": "2026-03-02", "payload": {"event": "r4"}}]
    folder = write_cartridge(tmp_path / "tanks", {"unlinked": unlinked}, events)
    cartridge = load_cartridge(folder)
    projector, report = build_embedded(cartridge, folder / "events.jsonl")
    assert not report.rejected
    t = Tools(cartridge, projector.store, "t1", clock=lambda: NOW)
    assert rules(t, "tank:a")["unlinked"]["holds"] is False
    assert rules(t, "tank:a", at="2026-02-01", known_at="2026-03-20")["unlinked"] == {   # no link yet: []
        **{k: v for k, v in rules(t, "tank:a")["unlinked"].items() if k not in ("holds", "because")},
        "holds": True, "because": []}
    assert rules(t, "tank:c")["unlinked"]["holds"] is True                          # its link was retracted
    run = subprocess.run([sys.executable, "-m", "keel.cli", "validate", str(folder), "--events",
                          str(folder / "events.jsonl")], check=False, capture_output=True, text=True)
    assert run.returncode == 0 and "KeyError" not in run.stderr, run.stderr


def test_the_finance_due_without_payment_answers(tmp_path: Path) -> None:
    """The issue's reproduction on the shipped finance cartridge: a due never paid has no `paid_from` link."""
    import shutil
    folder = tmp_path / "finance"
    shutil.copytree(Path(__file__).resolve().parents[1] / "cartridges" / "finance", folder)
    text = (folder / "cartridge.yaml").read_text()
    (folder / "cartridge.yaml").write_text(text.replace("memory:", '  due_unpaid: {applies_to: due, definition: x, '
                                                                   'when: "size(relations.paid_from) == 0"}\nmemory:'))
    cartridge = load_cartridge(folder)
    projector, _ = build_embedded(cartridge, folder / "events.jsonl")
    t = Tools(cartridge, projector.store, "hogar-demo")
    assert t.context("due:visa-2026-11")["rules"]["due_unpaid"]["holds"] is True
    assert t.context("due:visa-2026-09")["rules"]["due_unpaid"]["holds"] is False


def test_validate_does_not_fail_a_rule_whose_type_the_sample_lacks(tmp_path: Path) -> None:
    """Issue 21: a rule over an entity type with no entity in the stream failed with "known: none"."""
    folder = write_cartridge(tmp_path / "tanks", {})
    catalog = {**CATALOG, "entities": {**CATALOG["entities"], "pump": {}}}
    (folder / "cartridge.yaml").write_text(json.dumps({**catalog, "rules": {
        "pump_hot": {"applies_to": "pump", "definition": "Runs hot.", "when": "facts.temp_c > 80.0"},
        "site_busy": {"applies_to": "site", "definition": "d", "when": "facts.visits > 3.0"}}}))
    run = subprocess.run([sys.executable, "-m", "keel.cli", "validate", str(folder), str(folder / "events.jsonl")],
                         check=False, capture_output=True, text=True)
    assert "rules.pump_hot" not in run.stderr and "rules.pump_hot: not checked against the stream: it holds no " \
        "pump entity" in run.stdout
    # a type the stream has (sites are relation ends) is still checked: its entities lack the fact
    assert run.returncode == 2 and "rules.site_busy.when: facts.visits is not a fact met on the stream's site " \
        "entities (known: none)" in run.stderr
