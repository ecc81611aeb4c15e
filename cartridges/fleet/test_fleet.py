"""The fleet sample stream: the late trip reading, the fuel correction, reassignments and the service rule."""
from __future__ import annotations

from pathlib import Path

import pytest

from keel import MemoryStore, Tools, load_cartridge
from keel.embedded import build_embedded

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def tools() -> Tools:
    cartridge = load_cartridge(HERE)
    projector, report = build_embedded(cartridge, HERE / "events.jsonl")
    assert not report.rejected and isinstance(projector.store, MemoryStore)
    return Tools(cartridge, projector.store, "transportes-andes")


def value(ctx: dict, predicate: str) -> object:
    return next(f["value"] for f in ctx["facts"] if f["predicate"] == predicate)


def overdue(ctx: dict) -> bool:
    """The rule computed here by hand, checked against Keel's own verdict and its evidence."""
    rule = ctx["rules"]["vehicle_overdue_service"]
    by_hand = value(ctx, "odometer_km") > value(ctx, "next_service_km") + rule["grace_km"]
    evidence = {f["evidence"] for f in ctx["facts"] if f["predicate"] in ("odometer_km", "next_service_km")}
    assert rule["holds"] is by_hand and rule["because"] == sorted(evidence)
    return by_hand


def test_late_trip_reading_changes_what_was_true_but_not_what_was_known(tools: Tools) -> None:
    now_view = tools.context("vehicle:KXTP-21", at="2026-09-08")
    assert value(now_view, "odometer_km") == 50335 and overdue(now_view)
    then_view = tools.context("vehicle:KXTP-21", at="2026-09-08", known_at="2026-09-09")
    assert value(then_view, "odometer_km") == 49968 and not overdue(then_view)


def test_only_one_truck_is_overdue_now(tools: Tools) -> None:
    plates = ["vehicle:FDSW-73", "vehicle:KXTP-21", "vehicle:HJRL-58", "vehicle:GZBY-64"]
    assert [p for p in plates if overdue(tools.context(p))] == ["vehicle:FDSW-73"]
    assert not overdue(tools.context("vehicle:FDSW-73", at="2026-10-02"))


def test_fuel_correction(tools: Tools) -> None:
    [was, v] = tools.history("fuel_fill:F-2006", "fuel_litres")["versions"]
    assert (v["value"], v["corrected_by"], v["evidence"]) == (58, "human:marcela", "evt-fl-0032")
    assert (was["value"], was["superseded_by"], v["superseded_by"]) == (580, "evt-fl-0032", None)
    [old] = tools.history("fuel_fill:F-2006", "fuel_litres", known_at="2026-09-16")["versions"]
    assert (old["value"], old["evidence"]) == (580, "evt-fl-0031")


def test_reassignments_unlink_drivers(tools: Tools) -> None:
    [r] = tools.related("vehicle:HJRL-58", "assigned_to", at="2026-09-01")["relations"]
    assert (r["object"], r["valid_to"]) == ("driver:D-101", "2026-09-21T09:30:00Z")
    assert tools.related("vehicle:FDSW-73", "assigned_to", at="2026-11-01")["relations"] == []
    assert [r["object"] for r in tools.related("vehicle:FDSW-73", "assigned_to")["relations"]] == ["driver:D-105"]
