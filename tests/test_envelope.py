"""Envelope checks: every rejection carries a clear reason and the ids involved."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keel import EnvelopeRejected, load_cartridge
from keel.envelope import Catalog, PayloadCheck
from keel.times import parse_time

ROOT = Path(__file__).resolve().parents[1]
CATALOG = Catalog(load_cartridge(ROOT / "cartridges" / "finance"))
GOOD = {"id": "e1", "tenant": "hogar-demo", "type": "due.paid", "subject": "due:visa-2026-09",
        "occurred_at": "2026-09-05", "payload": {"paid_on": "2026-09-05", "amount_cop": 380000,
                                                 "account_id": "nomina", "movement_id": "m1"}}


def rejected(**changes: object) -> EnvelopeRejected:
    env = {**GOOD, **changes}
    env = {k: v for k, v in env.items() if v is not ...}
    with pytest.raises(EnvelopeRejected) as e:
        CATALOG.parse(json.dumps(env))
    return e.value


def test_good_envelope_defaults() -> None:
    e = CATALOG.parse(json.dumps(GOOD))
    assert (e.subject_type, e.subject_id, e.source, e.by) == ("due", "visa-2026-09", "payments", None)
    assert e.occurred_at == e.recorded_at == parse_time("2026-09-05")
    assert str(e.occurred_at) == "2026-09-05T00:00:00Z"
    assert CATALOG.parse(json.dumps(GOOD), default_recorded_at=5).recorded_at == 5
    kept = CATALOG.parse(json.dumps({**GOOD, "recorded_at": "2026-10-01T10:00:00Z", "source": "bank"}))
    assert kept.recorded_at == parse_time("2026-10-01T10:00:00Z") and kept.source == "bank"


def test_optional_payload_field() -> None:
    env = {**GOOD, "payload": {**GOOD["payload"], "note": "early"}}
    assert CATALOG.parse(json.dumps(env)).payload["note"] == "early"


@pytest.mark.parametrize("changes, reason", [
    ({"tenant": "bad tenant!"}, "tenant"),
    ({"tenant": ...}, "tenant: required field missing"),
    ({"subject": "visa"}, "subject"),
    ({"subject": "debt:visa"}, "takes a 'due' subject"),
    ({"type": "due.lost"}, "unknown event type 'due.lost'"),
    ({"occurred_at": "last tuesday"}, "occurred_at: 'last tuesday' is neither RFC 3339"),
    ({"occurred_at": "2026-09-05T10:00:00"}, "occurred_at"),           # no offset: ambiguous
    ({"recorded_at": "2026-13-01"}, "recorded_at"),
    ({"color": "red"}, "color: unknown envelope field"),
    ({"payload": {"paid_on": "2026-09-05"}}, "payload.amount_cop: required number missing"),
    ({"payload": {**GOOD["payload"], "amount_cop": True}}, "payload.amount_cop: expected number"),
    ({"payload": {**GOOD["payload"], "extra": 1}}, "payload.extra: unknown field"),
    ({"payload": "nope"}, "payload"),
])
def test_rejections_name_the_field(changes: dict, reason: str) -> None:
    e = rejected(**changes)
    assert reason in e.reason
    assert e.event_id == "e1"


def test_not_json_and_not_an_object() -> None:
    for raw in (b"{nope", b"[1, 2]", b"\xff\xfe"):
        with pytest.raises(EnvelopeRejected):
            CATALOG.parse(raw)


def test_annotation_payload_is_checked() -> None:
    env = {**GOOD, "type": "keel.annotated", "subject": "debt:visa", "payload": {"predicate": "n", "value": 1}}
    with pytest.raises(EnvelopeRejected, match="scope"):
        CATALOG.parse(json.dumps(env))


_JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=12),
                         st.sampled_from(["2026-09-05", "2026-09-05T10:00:00Z", "2026-13-01", "2026-09-05T10:00:00"]),
                         st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
_CHECKS = [check for cartridge in ("finance", "fleet", "salon")
           for check, _, _ in Catalog(load_cartridge(ROOT / "cartridges" / cartridge))._types.values()]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(_CHECKS), st.data())
def test_the_fast_payload_pass_never_accepts_what_the_field_checks_refuse(check: PayloadCheck, data: st.DataObject
                                                                         ) -> None:
    """PayloadCheck decides the common payload at C speed; it must agree with the field-by-field reasons."""
    names = st.sampled_from([*check.names, "extra"])
    payload = data.draw(st.dictionaries(names, _JSON_VALUES, max_size=len(check.names) + 1))
    if data.draw(st.booleans()):     # often a payload that is valid but for one drawn value
        payload = {**{n: _valid_value(kind) for n, kind, *_ in check.fields}, **payload}
    if check.plainly_valid(payload):
        assert check.problems(payload) == []


def _valid_value(kind: str) -> object:
    return {"string": "x", "number": 1.5, "integer": 2, "boolean": True, "object": {}, "array": [],
            "date": "2026-09-05", "datetime": "2026-09-05T10:00:00Z"}[kind]
