"""The salon sample stream: the late visit, the price correction, cancellations and the lapsed rule."""
from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from keel import Tools, load_cartridge
from keel.embedded import build_embedded

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def tools() -> Tools:
    cartridge = load_cartridge(HERE)
    projector, report = build_embedded(cartridge, HERE / "events.jsonl")
    assert not report.rejected
    return Tools(cartridge, projector.store, "salon-lucia")


def value(ctx: dict, predicate: str) -> object:
    return next((f["value"] for f in ctx["facts"] if f["predicate"] == predicate), None)


def lapsed(ctx: dict, on: str) -> bool:
    """The rule computed here by hand, checked against Keel's own verdict (context asked at `on`)."""
    rule = ctx["rules"]["client_lapsed"]
    assert ctx["at"][:10] == on
    if value(ctx, "last_visit_on") is None:     # never visited yet: not lapsed, and Keel cannot tell
        assert (rule["holds"], rule["missing"]) == (None, ["last_visit_on"])
        return False
    by_hand = (date.fromisoformat(on) - date.fromisoformat(value(ctx, "last_visit_on"))).days > rule["days"]
    assert rule["holds"] is by_hand and len(rule["because"]) == 1
    return by_hand


def test_late_visit_makes_marta_active_but_she_looked_lapsed_before_it_arrived(tools: Tools) -> None:
    now = tools.context("client:C-0001", at="2026-11-28")
    assert value(now, "last_visit_on") == "2026-09-18" and not lapsed(now, "2026-11-28")
    before = tools.context("client:C-0001", at="2026-11-28", known_at="2026-11-19")
    assert value(before, "last_visit_on") == "2026-05-02" and lapsed(before, "2026-11-28")


def test_sofia_is_the_only_lapsed_client(tools: Tools) -> None:
    clients = [r["entity"] for r in tools.search("client", type="client", limit=50)["results"]]
    assert len(clients) >= 4
    assert [c for c in sorted(clients) if lapsed(tools.context(c, at="2026-11-28"), "2026-11-28")] == ["client:C-0003"]
    cancelled = tools.context("appointment:A-0006")
    assert value(cancelled, "status") == "cancelled" and value(cancelled, "starts_at") is None
    assert [r for r in cancelled["relations"] if r["relation"] == "with_stylist"] == []


def test_price_correction(tools: Tools) -> None:
    [was, v] = tools.history("visit:V-0011", "price_eur")["versions"]
    assert (was["superseded_by"], v["superseded_by"]) == (v["evidence"], None)
    assert (v["value"], v["corrected_by"]) == (85, "human:lucia")
    [old] = tools.history("visit:V-0011", "price_eur", known_at="2026-10-17")["versions"]
    assert old["value"] == 58


def test_preference_moves_to_another_stylist(tools: Tools) -> None:
    [r] = tools.related("client:C-0004", "prefers", at="2026-08-01")["relations"]
    assert (r["object"], r["valid_to"]) == ("stylist:lucia-ferrer", "2026-09-06T10:00:00Z")
    assert [r["object"] for r in tools.related("client:C-0004", "prefers")["relations"]] == ["stylist:ines-robles"]
