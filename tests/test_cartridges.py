"""Checks every cartridge folder gets for free: valid, clean sample stream, deterministic, known_at holds."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from keel import MemoryStore, Projector, load_cartridge, reading
from keel.digest import digest
from keel.embedded import build_embedded
from keel.rule_checks import stream_problems
from keel.times import format_time, parse_time

ROOT = Path(__file__).resolve().parents[1]
CARTRIDGES = sorted(p.parent for p in (ROOT / "cartridges").glob("*/cartridge.yaml"))


@pytest.fixture(params=CARTRIDGES, ids=lambda p: p.name)
def folder(request: pytest.FixtureRequest) -> Path:
    return request.param


def envelopes(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines() if line.strip()]


def test_there_are_at_least_three_cartridges() -> None:
    assert {"finance", "fleet", "salon"} <= {p.name for p in CARTRIDGES}


def test_sample_stream_applies_cleanly_and_covers_the_catalog(folder: Path) -> None:
    cartridge = load_cartridge(folder)
    err = io.StringIO()
    _, report = build_embedded(cartridge, folder / "events.jsonl", stream=err)
    assert err.getvalue() == "" and not report.rejected
    assert report.applied == len(envelopes(folder))
    assert {e["type"] for e in envelopes(folder)} == set(cartridge.spec.events)


def test_every_rule_has_a_condition_that_fits_the_sample_stream(folder: Path) -> None:
    """Each cartridge ships a rule Keel evaluates; its names exist and its evaluation fits the data, at
    the stream's first and last days."""
    cartridge = load_cartridge(folder)
    assert any(r.program is not None for r in cartridge.rules.values())
    projector, _ = build_embedded(cartridge, folder / "events.jsonl")
    days = sorted(parse_time(e["occurred_at"]) for e in envelopes(folder))
    for at in (days[0], days[-1]):
        assert stream_problems(cartridge, projector.store, at) == []


def test_sample_stream_has_a_late_event_and_a_correction(folder: Path) -> None:
    events = envelopes(folder)
    latest, late = None, []
    for e in events:
        t = parse_time(e["occurred_at"])
        if latest is not None and t < latest:
            late.append(e["id"])
        latest = t if latest is None else max(latest, t)
    assert late, "no event arrives after a later-occurring one"
    projector, _ = build_embedded(load_cartridge(folder), folder / "events.jsonl")
    store = projector.store
    tenant = events[0]["tenant"]
    corrected = [v for key, assertions in store.dump(tenant) if key[0] == "f"
                 for v in [assertions] if len({a.point for a in assertions}) < len(assertions)]
    assert corrected, "no correction (two versions at the same valid_from)"


def test_replay_is_deterministic(folder: Path) -> None:
    cartridge = load_cartridge(folder)
    a, _ = build_embedded(cartridge, folder / "events.jsonl")
    b, _ = build_embedded(cartridge, folder / "events.jsonl")
    for tenant in a.store.tenants():
        assert digest(a.store, tenant) == digest(b.store, tenant)


def test_known_at_equals_a_rebuild_from_the_events_recorded_by_then(folder: Path) -> None:
    """The bitemporal definition (docs/semantics.md), on the real handlers and sample stream, at every recorded time."""
    cartridge = load_cartridge(folder)
    full = Projector(cartridge, MemoryStore())
    events = [full.parse(e) for e in envelopes(folder)]
    for e in events:
        full.apply(e)
    tenant = events[0].tenant
    entities = sorted({e for key, _ in full.store.dump(tenant) for e in (key[1],)})
    checkpoints = sorted({int(e.recorded_at) for e in events})
    for k in checkpoints[:: max(1, len(checkpoints) // 12)] + [checkpoints[-1]]:
        partial = Projector(cartridge, MemoryStore())
        for e in events:
            if e.recorded_at <= k:
                partial.apply(e)
        when = format_time(k)
        for entity in entities:
            assert reading.exists(full.store, tenant, entity, known_at=when) == reading.exists(partial.store, tenant, entity)
            if not reading.exists(partial.store, tenant, entity):
                continue
            for at in (when, format_time(k - 86_400_000_000)):
                assert reading.facts(full.store, tenant, entity, at=at, known_at=when) == reading.facts(partial.store, tenant, entity, at=at)
                assert (reading.relations(full.store, tenant, entity, at=at, known_at=when)
                        == reading.relations(partial.store, tenant, entity, at=at))
                assert reading.entity_info(full.store, tenant, entity, at=at, known_at=when) == reading.entity_info(partial.store, tenant, entity, at=at)
            assert reading.history(full.store, tenant, entity, known_at=when) == reading.history(partial.store, tenant, entity)
