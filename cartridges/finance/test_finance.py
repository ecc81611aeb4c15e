"""The finance story (README, "A five-minute tour"), exactly, from the sample stream."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from keel import NoteRefused, Tools, load_cartridge
from keel.embedded import build_embedded
from keel.eventlog import FileLog
from keel.times import parse_time

HERE = Path(__file__).resolve().parent
NOW = parse_time("2026-11-30T12:00:00Z")


@pytest.fixture
def tools(tmp_path: Path) -> Tools:
    events = tmp_path / "events.jsonl"
    shutil.copyfile(HERE / "events.jsonl", events)
    cartridge = load_cartridge(HERE)
    projector, _ = build_embedded(cartridge, events)
    return Tools(cartridge, projector.store, "hogar-demo", agent="debts", task="visa-plan",
                 log=FileLog(projector, events), clock=lambda: NOW)


def fact(context: dict, predicate: str) -> dict:
    return next(f for f in context["facts"] if f["predicate"] == predicate)


def test_visa_balance_now_and_on_15_september(tools: Tools) -> None:
    now = tools.context("debt:visa")
    assert fact(now, "balance_cop")["value"] == 3_870_000
    assert fact(now, "balance_cop")["evidence"] == "snap-visa-2026-10"
    then = tools.context("debt:visa", at="2026-09-15")
    assert fact(then, "balance_cop")["value"] == 4_200_000
    assert fact(then, "balance_cop")["valid_to"] == "2026-10-01T00:00:00Z"
    assert now["labels"]["product"] == "Visa" and now["ref"] == "debts#visa"


def test_rule_comes_from_the_cartridge_and_the_rate_makes_the_visa_expensive(tools: Tools) -> None:
    ctx = tools.context("debt:visa")
    rule = ctx["rules"]["debt_expensive"]
    assert rule == {"definition": "A debt is expensive when its effective annual rate is above 25%.",
                    "rate_ea_pct": 25, "when": "facts.rate_ea_pct > params.rate_ea_pct",
                    "holds": True, "because": ["snap-visa-2026-10"]}
    assert fact(ctx, "rate_ea_pct")["value"] == 29.22 > rule["rate_ea_pct"]


def test_keel_says_which_debts_are_expensive_at_each_time(tools: Tools) -> None:
    def verdict(entity: str, **times: str) -> tuple[object, list[str]]:
        rule = tools.context(entity, **times)["rules"]["debt_expensive"]
        return rule["holds"], rule["because"]
    assert verdict("debt:visa", at="2026-09-15") == (True, ["snap-visa-2026-09"])
    assert verdict("debt:libranza") == (False, ["snap-libranza-2026-11"])
    assert verdict("debt:libranza", at="2026-10-15", known_at="2026-10-02") == (False, ["snap-libranza-2026-10"])
    before = tools.context("debt:visa", at="2026-08-15")["rules"]["debt_expensive"]   # no snapshot yet
    assert (before["holds"], before["missing"], before["because"]) == (None, ["rate_ea_pct"], [])


def test_the_pending_november_due_is_overdue_only_after_its_day(tools: Tools) -> None:
    def overdue(entity: str, **times: str) -> object:
        return tools.context(entity, **times)["rules"]["due_overdue"]["holds"]
    assert overdue("due:visa-2026-11", at="2026-11-05T23:59:59Z") is False
    assert overdue("due:visa-2026-11", at="2026-11-06") is True
    assert overdue("due:visa-2026-11") is True                                   # now: 2026-11-30
    assert overdue("due:visa-2026-10", at="2026-10-20") is False                 # paid on 3 October
    # the late September payment: as known on 1 October the due looked overdue, as known now it was paid
    assert overdue("due:visa-2026-09", at="2026-09-20", known_at="2026-10-01") is True
    assert overdue("due:visa-2026-09", at="2026-09-20") is False


def test_dues_september_and_october_paid_november_pending(tools: Tools) -> None:
    dues = [r["subject"] for r in tools.related("debt:visa", "for_debt")["relations"]]
    assert dues == ["due:visa-2026-09", "due:visa-2026-10", "due:visa-2026-11"]
    status = {d: fact(tools.context(d), "status")["value"] for d in dues}
    assert status == {"due:visa-2026-09": "paid", "due:visa-2026-10": "paid", "due:visa-2026-11": "pending"}
    october = tools.context("due:visa-2026-10")
    assert fact(october, "paid_on")["value"] == "2026-10-03"
    assert [r["object"] for r in october["relations"] if r["relation"] == "paid_from"] == ["account:ahorros"]
    november = tools.context("due:visa-2026-11")
    assert (fact(november, "due_on")["value"], fact(november, "amount_cop")["value"]) == ("2026-11-05", 380_000)


def test_the_late_september_payment_was_not_known_before_it_arrived(tools: Tools) -> None:
    before = tools.context("due:visa-2026-09", at="2026-09-20", known_at="2026-10-01")
    assert fact(before, "status")["value"] == "pending"
    after = tools.context("due:visa-2026-09", at="2026-09-20")
    assert fact(after, "status")["value"] == "paid"


def test_the_libranza_correction_keeps_both_beliefs(tools: Tools) -> None:
    [oct_was, oct_now] = [v for v in tools.history("debt:libranza", "balance_cop")["versions"]
                          if v["valid_from"].startswith("2026-10-01")]
    assert (oct_now["value"], oct_now["corrected_by"], oct_now["superseded_by"]) == (12_150_000, "human:ana", None)
    assert (oct_was["value"], oct_was["superseded_at"], oct_was["superseded_by"]) == \
        (12_180_000, "2026-10-04T09:00:00Z", "snap-libranza-2026-10-fix")
    [oct_then] = [v for v in tools.history("debt:libranza", "balance_cop", known_at="2026-10-02")["versions"]
                  if v["valid_from"].startswith("2026-10-01")]
    assert (oct_then["value"], oct_then["corrected_by"]) == (12_180_000, None)


def test_debt_is_owed_by_the_household(tools: Tools) -> None:
    [r] = tools.related("debt:visa", "owed_by")["relations"]
    assert (r["object"], r["valid_from"]) == ("household:hogar-demo", "2026-09-01T00:00:00Z")


def test_the_agent_notes_in_task_scope_with_the_rate_evidence(tools: Tools) -> None:
    rate = fact(tools.context("debt:visa"), "rate_ea_pct")
    note = tools.annotate("debt:visa", "next_step", "pay November first", "task", evidence=rate["evidence"])["fact"]
    assert (note["scope"], note["evidence"], note["by"]) == ("task", "snap-visa-2026-10", "agent:debts")
    assert note["expires_at"] == "2026-12-30T12:00:00Z"
    assert any(v["predicate"] == "next_step" for v in tools.history("debt:visa")["versions"])
    with pytest.raises(NoteRefused):
        tools.annotate("debt:visa", "next_step", "x", "tenant")   # tenant scope requires evidence
