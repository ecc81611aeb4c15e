"""Write-side integrity in file mode, through the public CLI and the Python API (issue 12): recorded_at never
goes backwards and is never in the future, ids are idempotency keys, handlers write JSON within limits."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.integrity import acct_set, correction_log, ledger_cartridge, odd, retracted, write_events

from keel import reading, render
from keel.cartridge import load_cartridge
from keel.cli import main
from keel.commandline import emit
from keel.digest import digest
from keel.embedded import build_embedded
from keel.tools import Tools


def run(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ledger_cartridge(tmp_path_factory.mktemp("cart") / "ledger")


def balances(capsys, cartridge: Path, events: Path, *extra: object) -> list[tuple[object, str | None]]:
    code, out, err = run(capsys, "history", cartridge, events, "acct:a1", "--predicate", "balance", "--json", *extra)
    assert code == 0, err
    return [(v["value"], v["recorded_at"]) for v in json.loads(out)["versions"]]


# ---- 1. recorded_at never goes backwards ------------------------------------------------------------

def test_recorded_at_going_backwards_is_taken_as_the_tenants_latest(ledger: Path, tmp_path: Path, capsys) -> None:
    events = write_events(tmp_path / "e.jsonl", [
        acct_set("e1", "a1", 100, "2026-01-01", "2026-01-10T00:00:00Z"),
        acct_set("e2", "a1", 200, "2026-01-05", "2026-01-03T00:00:00Z"),     # learned "before" e1: impossible
    ])
    code, out, err = run(capsys, "validate", ledger, "--events", events)
    assert code == 0
    assert "line 2: event e2: warning: recorded_at 2026-01-03T00:00:00Z is earlier than the tenant's latest" in err
    assert "2 events ok" in out
    assert balances(capsys, ledger, events) == [(100, "2026-01-10T00:00:00Z"), (200, "2026-01-10T00:00:00Z")]
    # Keel had neither event on 2026-01-04: no known_at shows e2 without e1
    code, _, err = run(capsys, "context", ledger, events, "acct:a1", "--known-at", "2026-01-04")
    assert code == 1 and "unknown entity" in err


def test_recorded_at_in_the_future_is_refused_and_the_default_known_at_is_now(ledger: Path, tmp_path: Path,
                                                                              capsys) -> None:
    events = write_events(tmp_path / "e.jsonl", [
        acct_set("e1", "a1", 100, "2026-01-01", "2026-01-02T00:00:00Z"),
        acct_set("e2", "a1", 999, "2026-02-01", "2099-01-01T00:00:00Z"),
    ])
    code, _, err = run(capsys, "validate", ledger, "--events", events)
    assert code == 2
    assert "line 2: event e2: recorded_at 2099-01-01T00:00:00Z is in the future: more than 5m" in err
    assert balances(capsys, ledger, events) == [(100, "2026-01-02T00:00:00Z")]
    now = balances(capsys, ledger, events, "--known-at", "2099-12-31")
    assert now == balances(capsys, ledger, events)


def test_future_tolerance_is_configurable(tmp_path: Path) -> None:
    cartridge = load_cartridge(ledger_cartridge(tmp_path / "c", extra="limits: {future_tolerance: 100000d}\n"))
    events = write_events(tmp_path / "e.jsonl", [acct_set("e1", "a1", 1, "2026-01-01", "2099-01-01T00:00:00Z")])
    projector, report = build_embedded(cartridge, events)
    assert report.applied == 1 and not report.rejected
    # accepted within the tolerance, but taken as recorded when Keel read it: never after "now"
    (version,) = reading.history(projector.store, "t1", "acct:a1")
    assert version["recorded_at"] < "2099"


# ---- 2. ids are idempotency keys ------------------------------------------------------------------

def test_identical_duplicates_are_ignored_and_a_reused_id_is_refused(ledger: Path, tmp_path: Path, capsys) -> None:
    first = acct_set("e1", "a1", 100, "2026-01-01")
    same_but_broker_time = {**first, "recorded_at": "2026-01-01T00:00:00Z", "source": "ledger"}
    events = write_events(tmp_path / "e.jsonl", [
        first, same_but_broker_time, acct_set("e1", "a1", 555, "2026-01-01"),
    ])
    code, _, err = run(capsys, "validate", ledger, "--events", events)
    assert code == 2
    assert "line 3: event e1: id 'e1' was first seen at line 1 with different content" in err
    assert "line 2" not in err
    assert balances(capsys, ledger, events) == [(100, "2026-01-01T00:00:00Z")]


# ---- 3. handlers write JSON values within limits ----------------------------------------------------

@pytest.mark.parametrize(("kind", "size", "expected"), [
    ("set", None, "a set is not a JSON value"),
    ("datetime", None, "a datetime is not a JSON value"),
    ("nan", None, "nan is not a finite number"),
    ("intkey", None, "key 1 is not a string"),
    ("deep", None, "inf at a[1].b is not a finite number"),
    ("swallow", None, "a set is not a JSON value"),
    ("big", 5000, "value of 5000 bytes is over the 4096-byte limit (limits.value_bytes)"),
    ("label", 5000, "label note: value of 5000 bytes is over the 4096-byte limit"),
])
def test_a_handler_writing_a_bad_value_refuses_its_whole_event(ledger: Path, tmp_path: Path, capsys,
                                                               kind: str, size: int | None, expected: str) -> None:
    events = write_events(tmp_path / "e.jsonl", [acct_set("e1", "a1", 100, "2026-01-01"), odd("e2", kind, size)])
    code, _, err = run(capsys, "validate", ledger, "--events", events)
    assert code == 2
    assert "line 2: event e2: handler acct_odd for acct.odd wrote" in err and expected in err
    code, out, _ = run(capsys, "context", ledger, events, "acct:a1", "--json")
    assert code == 0
    assert [f["predicate"] for f in json.loads(out)["facts"]] == ["balance"]    # nothing of e2, not even `before`
    assert run(capsys, "digest", ledger, "--events", events)[0] == 0
    assert run(capsys, "search", ledger, events, "a1")[0] == 0


def test_limits_are_overridable_and_the_envelope_is_limited(tmp_path: Path, capsys) -> None:
    roomy = ledger_cartridge(tmp_path / "roomy", extra="limits: {value_bytes: 10000}\n")
    events = write_events(tmp_path / "e.jsonl", [odd("e1", "big", 5000)])
    assert run(capsys, "validate", roomy, "--events", events)[0] == 0
    huge = acct_set("e2", "a1", 1, "2026-01-01", holder="h" * 300_000)
    events = write_events(tmp_path / "big.jsonl", [acct_set("e1", "a1", 1, "2026-01-01"), huge])
    code, _, err = run(capsys, "validate", roomy, "--events", events)
    assert code == 2 and "line 2: event e2: envelope of 300" in err and "over the 262144-byte limit" in err


# ---- the known_at definition with out-of-order recorded_at ---------------------------------------

DAYS = [f"2026-01-{d:02d}" for d in range(1, 29)]


def _answers(tools: Tools, entities: list[str], known_at: str | None) -> dict[str, object]:
    out: dict[str, object] = {}
    for entity in entities:
        try:
            out[entity] = (tools.context(entity, at="2026-06-01", known_at=known_at),
                           tools.history(entity, known_at=known_at)["versions"])
        except LookupError:
            out[entity] = None
    for answer in out.values():
        if answer is not None:
            answer[0]["known_at"] = None       # the echo of the question is not part of the answer
            answer[0].pop("known_through")     # nor is how far the store had read (freshness)
            answer[0].pop("applied_through", None)
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["a1", "a2"]), st.integers(0, 9), st.sampled_from(DAYS),
                          st.sampled_from(DAYS), st.sampled_from(["", "h1", "h2"])), min_size=1, max_size=12))
def test_known_at_is_the_log_prefix_keel_had_then(ledger: Path, tmp_path: Path, log: list) -> None:
    cartridge = load_cartridge(ledger)
    envelopes = [acct_set(f"e{i}", acct, balance, occurred, f"{recorded}T12:00:00Z",
                          **({"holder": holder} if holder else {}))
                 for i, (acct, balance, occurred, recorded, holder) in enumerate(log)]
    full = write_events(tmp_path / "full.jsonl", envelopes)
    projector, _ = build_embedded(cartridge, full)
    whole = Tools(cartridge, projector.store, "t1")
    entities = ["acct:a1", "acct:a2", "owner:h1", "owner:h2"]
    learned = [v["recorded_at"] for v in reading.history(projector.store, "t1", "acct:a1")
               + reading.history(projector.store, "t1", "acct:a2")]
    for day in DAYS[::3] + [r[:10] for r in learned]:
        known_at = f"{day}T12:00:00Z"
        # the prefix Keel had at known_at: the events read until the first one learned later
        effective, latest = [], ""
        for env in envelopes:
            latest = max(latest, env["recorded_at"])
            effective.append(latest)
        prefix = [env for env, t in zip(envelopes, effective) if t <= known_at]
        assert prefix == envelopes[:len(prefix)]
        part = write_events(tmp_path / "prefix.jsonl", prefix)
        then, _ = build_embedded(cartridge, part)
        assert _answers(whole, entities, known_at) == _answers(Tools(cartridge, then.store, "t1"), entities, None)


def test_digest_unchanged_by_a_rejected_conflict(ledger: Path, tmp_path: Path) -> None:
    cartridge = load_cartridge(ledger)
    clean = write_events(tmp_path / "a.jsonl", [acct_set("e1", "a1", 1, "2026-01-01")])
    noisy = write_events(tmp_path / "b.jsonl", [acct_set("e1", "a1", 1, "2026-01-01"),
                                                acct_set("e1", "a1", 2, "2026-01-01"), odd("e3", "set")])
    assert digest(build_embedded(cartridge, clean)[0].store, "t1") == digest(build_embedded(cartridge, noisy)[0].store,
                                                                               "t1")


# ---- 5. history shows what was superseded ---------------------------------------------------------

def test_history_lists_superseded_versions_and_known_at_keeps_its_meaning(ledger: Path, tmp_path: Path,
                                                                          capsys) -> None:
    events = write_events(tmp_path / "e.jsonl", [
        acct_set("e1", "a1", 100, "2026-01-01", "2026-01-02T00:00:00Z"),
        acct_set("e2", "a1", 90, "2026-01-01", "2026-01-05T00:00:00Z", ),    # same valid_from: a correction
    ])
    code, out, _ = run(capsys, "history", ledger, events, "acct:a1", "--json")
    assert code == 0
    got = [(v["value"], v["superseded_at"], v["superseded_by"], v["corrected_by"]) for v in json.loads(out)["versions"]]
    assert got == [(100, "2026-01-05T00:00:00Z", "e2", None), (90, None, None, "ledger")]
    code, out, _ = run(capsys, "history", ledger, events, "acct:a1")
    assert "balance=100 valid 2026-01-01 -> open" in out and "superseded 2026-01-05 by e2" in out
    code, out, _ = run(capsys, "history", ledger, events, "acct:a1", "--known-at", "2026-01-03", "--json")
    got = [(v["value"], v["superseded_at"]) for v in json.loads(out)["versions"]]
    assert got == [(100, None)]


# ---- 6. input hygiene ------------------------------------------------------------------------------

def test_bom_surrogates_ids_and_long_values_get_clear_messages(ledger: Path, tmp_path: Path, capsys) -> None:
    good = json.dumps(acct_set("e1", "a1", 1, "2026-01-01"))
    lines = [
        good,
        json.dumps(acct_set("e2", "a1", 1, "2026-01-01")).replace('"e2"', '"e2\\ud800"'),
        json.dumps(acct_set("e3", "aü", 1, "2026-01-01")),
        json.dumps(acct_set("e4", "a1", "x" * 10_000, "2026-01-01")),
        json.dumps(acct_set("e5", "a1", "\x1b[31mred\x00", "2026-01-01")),
    ]
    events = tmp_path / "e.jsonl"
    events.write_bytes(b"\xef\xbb\xbf" + "\n".join(lines).encode() + b"\n\xff\xfe\n")
    code, _, err = run(capsys, "validate", ledger, "--events", events)
    assert code == 2
    assert "line 1" not in err                                                  # the BOM is no problem
    assert "line 2: event e2\\ud800: not valid JSON: a \\uD800-\\uDFFF escape must be one half of a surrogate pair" in err
    assert "line 3: event e3: subject: 'acct:aü' is not allowed; use '<entity type>:<id>'" in err
    assert "ASCII letters, digits and . _ @ -" in err
    line4 = next(x for x in err.splitlines() if "line 4" in x)
    assert "(9802 more characters)" in line4 and len(line4) < 600      # repr adds its quotes
    line5 = next(x for x in err.splitlines() if "line 5" in x)
    assert "\x1b" not in line5 and "\x00" not in line5 and "\\x1b[31mred\\x00" in line5
    assert "line 6: event ?: not UTF-8 text (byte 0xff at position 0); save the file as UTF-8" in err   # a file's line


def test_terminal_output_escapes_control_characters(ledger: Path, tmp_path: Path, capsys) -> None:
    events = write_events(tmp_path / "e.jsonl", [acct_set("e1", "a1", 1, "2026-01-01", holder="\x1b[2Jh\x07")])
    code, out, err = run(capsys, "validate", ledger, "--events", events)
    assert code == 2 and "\x1b" not in err and "\\x1b[2Jh\\x07" in err     # the id check quotes it escaped
    projector, _ = build_embedded(load_cartridge(ledger), events)
    projector.store.upsert_entity("t1", "acct", "a9", valid_from="2026-01-01", note="\x1b[2J\x00bell\x07")
    emit(argparse.Namespace(json=False), Tools(load_cartridge(ledger), projector.store, "t1").context("acct:a9"),
         render.context)
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x00" not in out and "\\x1b[2J\\x00bell\\x07" in out


@pytest.mark.parametrize("where", ["folder", "unreadable"])
def test_a_folder_or_unreadable_events_path_is_a_usage_error(ledger: Path, tmp_path: Path, capsys, where: str) -> None:
    path = tmp_path / "dir"
    path.mkdir()
    if where == "unreadable":
        path = write_events(tmp_path / "e.jsonl", [acct_set("e1", "a1", 1, "2026-01-01")])
        path.chmod(0)
        if path.open("rb").readable() if _can_read(path) else False:
            pytest.skip("running as a user who reads every file")
    for argv in (["validate", ledger, "--events", path], ["context", ledger, path, "acct:a1"],
                 ["digest", ledger, "--events", path]):
        code, _, err = run(capsys, *argv)
        assert code == 2 and "Traceback" not in err
        assert ("is a folder" if where == "folder" else "cannot be read") in err


def _can_read(path: Path) -> bool:
    try:
        path.open("rb").close()
    except OSError:
        return False
    return True


def test_validate_reports_every_cartridge_problem_in_one_pass(tmp_path: Path, capsys) -> None:
    folder = ledger_cartridge(tmp_path / "c")
    text = (folder / "cartridge.yaml").read_text()
    text = text.replace("  owner: {description: who holds accounts}\n",
                        "  owner: {description: who holds accounts}\n  owner: {description: again}\n")
    (folder / "cartridge.yaml").write_text(text)
    code, _, err = run(capsys, "validate", folder)
    assert code == 2 and "duplicate key 'owner' (first at line 5)" in err
    text = text.replace("  owner: {description: again}\n", "")
    text = text.replace("    owner: ledger\n    payload: {balance: number", "    payload: {balance: number")
    text = text.replace("to: owner}", "to: nobody}").replace("kind: string", "kind: strng")
    (folder / "cartridge.yaml").write_text(text + "memory: {ttl: {task: soon}}\n")
    code, _, err = run(capsys, "validate", folder)
    assert code == 2
    assert "events.acct.set.owner: Field required" in err
    assert "relations.held_by.to: 'nobody' is not a declared entity type" in err
    assert "events.acct.odd.payload.kind: bad type 'strng'" in err
    assert "memory.ttl.task: bad duration 'soon'" in err
    assert "handler for 'acct.set'" not in err          # its entry is invalid, not its handler


# ---- 4. event-level corrections: corrects and keel.retracted ----------------------------------------

def test_corrects_and_retracted_supersede_a_whole_event(ledger: Path, tmp_path: Path, capsys) -> None:
    events = write_events(tmp_path / "e.jsonl", correction_log())
    code, _, err = run(capsys, "validate", ledger, "--events", events)
    assert code == 2
    assert "line 5: event e5: cannot retract event 'e1': it was already retracted or corrected" in err
    assert "line 6: event e6: cannot correct event 'nope': it is not an applied event of tenant 't1'" in err
    assert "line 7: event e7: cannot retract event 'e2': it is not an applied event of tenant 't2'" in err
    assert "line 3" not in err and "line 4" not in err
    cartridge = load_cartridge(ledger)
    projector, _ = build_embedded(cartridge, events)
    tools = Tools(cartridge, projector.store, "t1")
    versions = tools.history("acct:a1", "balance")["versions"]
    got = [(v["value"], v["valid_from"][:10], v["valid_to"] and v["valid_to"][:10], v["superseded_by"])
           for v in versions]
    assert got == [(100, "2026-01-01", "2026-02-01", "e4"), (200, "2026-02-01", None, None),
                   (200, "2026-03-01", None, "e3")]
    balance = lambda at, known_at=None: [f["value"] for f in tools.context("acct:a1", at=at, known_at=known_at)["facts"]
                                         if f["predicate"] == "balance"]
    assert balance("2026-01-15") == []                           # e1 retracted: nothing before February
    assert balance("2026-02-15") == [200]                        # e3: the right date
    assert balance("2026-01-15", known_at="2026-03-05") == [100]   # before the retraction
    assert balance("2026-02-15", known_at="2026-03-04") == [100]   # before the correction: the wrong date
    assert balance("2026-03-15", known_at="2026-03-04") == [200]
    assert tools.related("acct:a1", "held_by")["relations"] == []              # e1's link is gone with it
    assert [r["object"] for r in tools.related("acct:a1", "held_by", at="2026-01-15")["relations"]] == []
    old = Tools(cartridge, projector.store, "t1").context("acct:a1", at="2026-01-15", known_at="2026-03-05")
    assert [r["object"] for r in old["relations"]] == ["owner:h1"]


def test_a_retraction_restores_what_was_believed_at_that_point(ledger: Path, tmp_path: Path) -> None:
    log = [acct_set("e1", "a1", 100, "2026-01-01", "2026-01-02T00:00:00Z"),
           acct_set("e2", "a1", 150, "2026-01-01", "2026-01-03T00:00:00Z"),      # a correction at the same point
           acct_set("e3", "a1", 300, "2026-02-01", "2026-01-04T00:00:00Z"),
           retracted("e4", "e2", recorded_at="2026-01-05T00:00:00Z"),
           retracted("e5", "e3", recorded_at="2026-01-06T00:00:00Z")]
    cartridge = load_cartridge(ledger)
    projector, report = build_embedded(cartridge, write_events(tmp_path / "e.jsonl", log))
    assert not report.rejected
    [fact] = reading.facts(projector.store, "t1", "acct:a1", at="2026-06-01")
    assert (fact["value"], fact["valid_from"], fact["valid_to"]) == (100, "2026-01-01T00:00:00Z", None)
    assert fact["evidence"] == "e4"          # the restoring assertion is the retraction's


def test_a_mirror_keeps_marks_of_waiting_writes_and_still_applies_them_on_read() -> None:
    from keel.store.base import event_key, fact_write
    from workers.mirror import RecordingStore
    mirror = RecordingStore()
    mirror.recording = True
    write = fact_write("acct:a1", "balance", 1, "2026-01-01", False, source=None, evidence="e1", recorded_at=None,
                       by=None)
    mirror.apply_writes("t1", [write], event_key("e1", "abc at line 1", 5))
    mirror.recording = False
    assert mirror.event_mark("t1", "e1") == "abc at line 1" and mirror.latest_recorded("t1") == 5
    assert [f["value"] for f in reading.facts(mirror, "t1", "acct:a1", at="2026-02-01")] == [1]


def test_declarative_projections_write_within_the_same_limits(tmp_path: Path, capsys) -> None:
    finance = Path(__file__).resolve().parents[1] / "cartridges" / "finance"
    snapshot = {"id": "s1", "tenant": "h", "type": "debt.snapshot", "subject": "debt:visa", "occurred_at": "2026-01-01",
                "payload": {"creditor": "c" * 5000, "product": "Visa", "balance_cop": 1, "rate_ea_pct": 20.0,
                            "installment_cop": 1, "month": "2026-01"}}
    events = write_events(tmp_path / "e.jsonl", [snapshot])
    code, _, err = run(capsys, "validate", finance, "--events", events)
    assert code == 2
    assert "line 1: event s1: handler" in err and "label creditor: value of 5000 bytes is over the 4096-byte" in err
