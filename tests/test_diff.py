"""Issue 29: `keel validate <new> --events` checks a cartridge change against the whole log, and `keel diff <old>
<new>` says per tenant what the change does to the graph, with exit codes a CI gate can use (0 unchanged,
1 changes, 2 events lost). The Kafka side (`--kafka`) is in tests/test_cartridge_rollout.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.versions import (
    EVENTS,
    FINANCE,
    UPCASTER_2_TO_3,
    add_currency,
    breaking,
    label_currency,
    variant,
    version_3,
)

from keel.cartridge import load_cartridge
from keel.cli import main
from keel.diff import compare
from keel.log_check import LogBuild, read_file

LINES = [json.loads(line) for line in EVENTS.read_text().splitlines() if line.strip()]
SNAPSHOTS = [e["id"] for e in LINES if e["type"] == "debt.snapshot"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(map(str, argv)))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_validate_finds_the_change_that_loses_history(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's example: a required field added without a version makes every recorded snapshot invalid;
    with version 2 and an upcast step every line reads again."""
    code, _, err = run(capsys, "validate", variant(tmp_path / "bad", breaking), "--events", EVENTS)
    assert code == 2
    assert f"{EVENTS}: 6 bad line(s) of 17" in err
    assert f"{EVENTS}:line 1: event snap-visa-2026-09: payload.currency: required string missing" in err
    assert err.count("payload.currency: required string missing") == len(SNAPSHOTS) == 6
    code, out, err = run(capsys, "validate", variant(tmp_path / "v2", add_currency), EVENTS)
    assert code == 0 and f"{EVENTS}: 17 events ok" in out and err == ""
    code, out, _ = run(capsys, "validate", variant(tmp_path / "v3", version_3, handlers=UPCASTER_2_TO_3), EVENTS)
    assert code == 0 and f"{EVENTS}: 17 events ok" in out


def test_validate_reports_a_newer_version_in_the_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    newer = {**LINES[0], "id": "snap-v2", "version": 2, "payload": {**LINES[0]["payload"], "currency": "USD"}}
    events = tmp_path / "e.jsonl"
    events.write_text("".join(json.dumps(e) + "\n" for e in [*LINES, newer]))
    code, _, err = run(capsys, "validate", FINANCE, events)
    assert code == 2 and f"{events}:line 18: event snap-v2: debt.snapshot version 2 is newer than this cartridge " \
                          "knows (version 1)" in err
    assert run(capsys, "validate", variant(tmp_path / "v2", add_currency), events)[0] == 0


def test_diff_of_a_change_that_keeps_every_graph(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Version 2 with the same projection: every event reads, no graph changes: exit 0."""
    code, out, err = run(capsys, "diff", FINANCE, variant(tmp_path / "v2", add_currency), EVENTS)
    assert code == 0, err
    assert "tenant hogar-demo: unchanged" in out
    assert "1 tenant(s), 0 whose graph changes with the new cartridge; 17 envelope(s) read" in out
    assert run(capsys, "diff", FINANCE, FINANCE, "--events", EVENTS)[0] == 0


def test_diff_says_what_changes_per_tenant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    other = [{**e, "tenant": "casa-otra", "id": "o-" + e["id"]} for e in LINES if e["type"] != "debt.snapshot"]
    events = tmp_path / "two.jsonl"
    events.write_text("".join(json.dumps(e) + "\n" for e in [*LINES, *other]))
    new = variant(tmp_path / "v2", label_currency)
    code, out, _ = run(capsys, "diff", FINANCE, new, events)
    assert code == 1
    assert "tenant casa-otra: unchanged" in out
    assert "tenant hogar-demo: changes\n  entities: 0 added, 0 removed, 2 changed" in out
    assert "  labels: 2 added, 0 removed, 0 changed\n    added: debt:libranza currency = 'COP'\n" \
           "    added: debt:visa currency = 'COP'" in out
    assert "facts:" not in out and "relations:" not in out            # only what changes is listed
    code, out, _ = run(capsys, "diff", FINANCE, new, events, "--json")
    doc = json.loads(out)
    assert code == 1 and doc["changed_tenants"] == 1 and doc["read"] == len(LINES) + len(other)
    hogar = next(t for t in doc["tenants"] if t["tenant"] == "hogar-demo")
    assert hogar["labels"] == {"added": 2, "removed": 0, "changed": 0, "examples": {
        "added": ["debt:libranza currency = 'COP'", "debt:visa currency = 'COP'"], "removed": [], "changed": []}}
    assert hogar["facts"]["added"] == hogar["relations"]["removed"] == 0


def test_diff_counts_renamed_facts_and_lost_events(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "diff", FINANCE, variant(tmp_path / "v3", version_3, handlers=UPCASTER_2_TO_3),
                       EVENTS)
    assert code == 1
    assert "  facts: 4 added, 2 removed, 0 changed" in out              # balance, period_start; balance_cop
    assert "    removed: debt:visa balance_cop (was 3870000)" in out
    code, out, err = run(capsys, "diff", FINANCE, variant(tmp_path / "bad", breaking), EVENTS)
    assert code == 2
    assert "events: 6 applied now and refused by the new cartridge" in out
    assert "keel replay" not in out
    assert f"{EVENTS}:line 1: event snap-visa-2026-09: payload.currency: required string missing (refused by" in err
    assert "refuses 6 event(s) that" in err


def test_a_changed_timeline_says_where_it_first_differs(tmp_path: Path) -> None:
    def halve(doc: dict) -> None:
        doc["events"]["debt.snapshot"]["project"][2]["facts"]["set"]["balance_cop"] = "{installment_cop}"
    old, new = LogBuild(load_cartridge(FINANCE)), LogBuild(load_cartridge(variant(tmp_path / "h", halve)))
    report = compare(old, new, read_file(EVENTS, [old, new]))
    facts = report.tenants[0].kinds["facts"]
    assert (facts.added, facts.removed, facts.changed) == (0, 0, 2)
    assert facts.examples["changed"][0] == "debt:libranza balance_cop: at 2026-09-01T00:00:00Z: 12600000 -> 520000"


def test_diff_needs_a_log(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "diff", FINANCE, FINANCE)
    assert code == 2 and "give the log to compare on" in err
    code, _, err = run(capsys, "diff", FINANCE, FINANCE, EVENTS, "--kafka")
    assert code == 2 and "give one of an events file or --kafka" in err


def test_the_report_ends_with_a_whole_sentence_naming_the_new_cartridge(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 40: the report ended with "…rebuilds them so", which read as cut off."""
    new = variant(tmp_path / "v2", label_currency)
    code, out, _ = run(capsys, "diff", FINANCE, new, EVENTS)
    assert code == 1
    assert out.rstrip("\n").splitlines()[-1] == (
        f"to apply it: deploy {new} to the workers, then `keel replay {new} --all` rebuilds the 1 tenant(s) whose "
        f"graph changes as shown above.")
