"""The msgspec fast path (keel/decoding.py) against the pydantic-only path: the same Event, or the same refusal.

Envelopes are the shipped cartridges' events and notes, mutated: fields of the wrong type, missing or extra,
bad or future times, huge numbers, long and non-ASCII strings, lone surrogates, deep nesting, malformed JSON."""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter
from typing_extensions import TypedDict

from keel import EnvelopeRejected, load_cartridge
from keel.cartridge import FieldSpec
from keel.decoding import SAFE_DEPTH, TypedDecoder, canonical_json
from keel.envelope import _TYPED, ANNOTATED, RETRACTED, Catalog, PayloadCheck
from keel.times import now_micros, parse_time

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("finance", "fleet", "salon")
CARTRIDGES = {name: load_cartridge(ROOT / "cartridges" / name) for name in NAMES}
FAST = {name: Catalog(c) for name, c in CARTRIDGES.items()}
SLOW = {name: Catalog(c, typed_decoding=False) for name, c in CARTRIDGES.items()}
ENVELOPE_FIELDS = ["id", "tenant", "type", "subject", "occurred_at", "recorded_at", "source", "by", "corrects",
                   "version", "payload"]


def _samples() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for name in NAMES:
        for line in (ROOT / "cartridges" / name / "events.jsonl").read_text().splitlines():
            if line.strip():
                out.append((name, json.loads(line)))
        first = out[-1][1]
        out.append((name, {"id": "note-1", "tenant": first["tenant"], "type": ANNOTATED, "subject": first["subject"],
                           "occurred_at": "2026-09-05T10:00:00Z", "by": "agent-7",
                           "payload": {"predicate": "next_step", "value": {"a": [1, 2.5, None]}, "scope": "tenant",
                                       "evidence": first["id"]}}))
        out.append((name, {"id": "retract-1", "tenant": first["tenant"], "type": RETRACTED,
                           "subject": first["subject"], "occurred_at": "2026-09-06",
                           "payload": {"event": first["id"], "reason": "typo"}}))
    return out


SAMPLES = _samples()
TYPES = sorted({t for c in CARTRIDGES.values() for t in c.spec.events} | {ANNOTATED, RETRACTED})
PAYLOAD_NAMES = sorted({f for c in CARTRIDGES.values() for spec in c.spec.events.values() for f in spec.fields()}
                       | {"predicate", "value", "scope", "evidence", "task", "agent", "event", "reason", "extra"})

_TEXTS = st.one_of(
    st.text(max_size=8),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=250, max_size=260),        # around the 256 limit
    st.sampled_from(["", "x", "tenant-1", "hogar-demo", "debt:visa", "due:visa-2026-09", "Debt:visa", "debt:",
                     "debt:visa\n", "hogar-demo\n", "a" * 64, "a" * 65, "debt:" + "v" * 128, "debt:" + "v" * 129,
                     "é", "😀" * 129, "2026-09-05", "2026-09-05T10:00:00Z", "2026-09-05T10:00:00", "2026-13-01",
                     "2026-09-05t10:00:00z", "9999-12-31T23:59:59Z", "2999-01-01", "last tuesday",
                     "2026-09-05T10:00:00.123456+05:30", "keel", "payments", ANNOTATED, RETRACTED]),
    st.sampled_from(TYPES))
_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(), st.integers(min_value=2**63 - 2, max_value=2**70),
                     st.floats(allow_nan=False, allow_infinity=False), _TEXTS)
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(st.text(max_size=4), inner, max_size=3)),
                       max_leaves=6)


@st.composite
def envelopes(draw: st.DrawFn) -> tuple[str, dict[str, Any]]:
    """A sample envelope with up to four mutations (none or one most often: valid events must be common)."""
    name, env = draw(st.sampled_from(SAMPLES))
    env = json.loads(json.dumps(env))
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 2, 4]))):
        payload = env.get("payload")
        action = draw(st.sampled_from(["set", "drop", "set_payload", "drop_payload", "type"]))
        if action == "set":
            env[draw(st.sampled_from([*ENVELOPE_FIELDS, "extra"]))] = draw(_VALUES)
        elif action == "drop" and env:
            env.pop(draw(st.sampled_from(sorted(env))))
        elif action == "set_payload" and isinstance(payload, dict):
            payload[draw(st.sampled_from(PAYLOAD_NAMES))] = draw(_VALUES)
        elif action == "drop_payload" and isinstance(payload, dict) and payload:
            payload.pop(draw(st.sampled_from(sorted(payload))))
        elif action == "type":
            env["type"] = draw(st.sampled_from(TYPES))
    return name, env


_TEXT_EDITS = ["none"] * 20 + ["ascii", "bom", "garbage", "truncate", "nan", "huge_float", "lone_surrogate",
               "pair", "raw_surrogate", "bad_utf8", "duplicate_key", "whitespace", "control", "deep", "array"]


def _encode(env: dict[str, Any], edit: str, data: st.DataObject) -> bytes | str:
    text = json.dumps(env, ensure_ascii=edit == "ascii")
    key = data.draw(st.sampled_from(ENVELOPE_FIELDS))
    if edit == "bom":
        text = "\ufeff" + text
    elif edit == "garbage":
        text += data.draw(st.sampled_from(["}", " x", ",", "\n\n", "\x00"]))
    elif edit == "truncate":
        text = text[:data.draw(st.integers(0, max(0, len(text) - 1)))]
    elif edit in ("nan", "huge_float", "lone_surrogate", "pair"):
        value = {"nan": "NaN", "huge_float": data.draw(st.sampled_from(["1e400", "-1e400", "1.8e308", "Infinity"])),
                 "lone_surrogate": '"x\\ud800"', "pair": '"\\ud83d\\ude00"'}[edit]
        where = data.draw(st.sampled_from(["payload", "top"]))
        text = text.replace('"payload": {', '"payload": {"zz": ' + value + ", ", 1) if where == "payload" \
            else text.replace('"' + key + '": ', '"' + key + '": ' + value + ', "' + key + '_": ', 1)
    elif edit == "raw_surrogate":      # a lone surrogate in a Python str (as bytes: surrogatepass, not UTF-8)
        text = text.replace('": "', '": "\udc80', 1)
    elif edit == "bad_utf8":
        raw = text.encode()
        at = data.draw(st.integers(0, len(raw)))
        return raw[:at] + b"\xff" + raw[at:]
    elif edit == "duplicate_key":
        text = text.replace("{", '{"' + key + '": ' + json.dumps(data.draw(_SCALARS)) + ", ", 1)
    elif edit == "whitespace":
        text = data.draw(st.sampled_from([" ", "\n", "\t", "\r\n", "\f"])) + text + "\n"
    elif edit == "control":
        text = text.replace('": "', '": "\t', 1)
    elif edit == "deep":
        depth = data.draw(st.integers(SAFE_DEPTH - 5, 215))
        text = text.replace('"payload": {', '"payload": {"value": ' + "[" * depth + "]" * depth + ", ", 1)
    elif edit == "array":
        text = "[" + text + "]"
    return text if data.draw(st.booleans()) else text.encode("utf-8", "surrogatepass")


def outcome(catalog: Catalog, raw: bytes | str | dict[str, Any], recorded: int | None, before: int) -> tuple:
    """Everything observable of one parse: each field of the Event (types of payload values included) and its
    content hash, or the refusal's reason and ids."""
    try:
        e = catalog.parse(raw, default_recorded_at=recorded)
    except EnvelopeRejected as r:
        # file mode reads the clock: "read the event at <now>" differs between two parses, by design
        reason = r.reason if recorded is not None else re.sub(r"read the event at \S+", "read at now", r.reason)
        return ("refused", reason, r.event_id, r.tenant)
    # the same for a time clamped to now
    recorded_at = int(e.recorded_at) if e.recorded_at < before else "now"
    return ("event", e.id, e.tenant, e.type, e.subject, e.subject_type, e.subject_id, int(e.occurred_at),
            type(e.occurred_at).__name__, recorded_at, e.source, e.by, e.corrects, repr(e.payload),
            e.clamped_from, e.content_hash(), e.to_envelope()["payload"] == e.payload, e.version)


# a Kafka record's time (default_recorded_at) around the samples' times, so that recorded_at is mostly accepted
_RECORD_TIMES = st.integers(parse_time("2026-01-01"), parse_time("2027-01-01"))


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(envelopes(), st.sampled_from(_TEXT_EDITS), st.one_of(st.none(), st.integers(0, 2**53), _RECORD_TIMES), st.data())
def test_fast_path_and_pydantic_give_the_same_event_or_refusal(sample: tuple[str, dict[str, Any]], edit: str,
                                                                recorded: int | None, data: st.DataObject) -> None:
    name, env = sample
    raw = _encode(env, edit, data)
    before = now_micros()
    fast = outcome(FAST[name], raw, recorded, before)
    assert fast == outcome(SLOW[name], raw, recorded, before)
    event(f"{fast[0]}, fast path {'taken' if _TYPED.decode(raw) is not None else 'declined'}")


@pytest.mark.parametrize("name, env", SAMPLES)
def test_valid_sample_events_take_the_fast_path(name: str, env: dict[str, Any]) -> None:
    """The comparison above means something only if valid envelopes really are decoded by msgspec."""
    line = json.dumps(env).encode() + b"\n"
    assert _TYPED.decode(line) is not None
    assert _TYPED.decode(line.decode()) is not None
    before = now_micros()
    assert outcome(FAST[name], line, None, before)[0] == "event"
    assert outcome(FAST[name], line, None, before) == outcome(SLOW[name], line, None, before)


@pytest.mark.parametrize("shape", ["list", "object"])
def test_nesting_around_the_pydantic_limit(shape: str) -> None:
    """pydantic refuses nesting about 200 deep and msgspec does not: deep envelopes are pydantic's to judge."""
    name, env = next(s for s in SAMPLES if s[1]["type"] == ANNOTATED)
    seen = set()
    for depth in range(SAFE_DEPTH - 10, 230):
        value = "[" * depth + "]" * depth if shape == "list" else '{"a": ' * depth + "1" + "}" * depth
        raw = json.dumps({**env, "payload": {**env["payload"], "value": 0}}).replace('"value": 0', '"value": ' + value)
        before = now_micros()
        fast = outcome(FAST[name], raw.encode(), 5, before)
        assert fast == outcome(SLOW[name], raw.encode(), 5, before), depth
        seen.add(fast[0])
    assert seen == {"event", "refused"}     # the range crosses pydantic's limit


def test_dict_envelopes_take_the_pydantic_path() -> None:
    name, env = SAMPLES[0]
    before = now_micros()
    assert outcome(FAST[name], dict(env), 7, before) == outcome(SLOW[name], json.dumps(env), 7, before)


def test_a_schema_without_a_fast_path_is_refused_when_built() -> None:
    class Other(TypedDict):
        count: int

    with pytest.raises(TypeError, match="count"):
        TypedDecoder({**TypeAdapter(Other).core_schema, "extra_behavior": "forbid"})


# the shipped catalogs, and one with every field kind, each required and optional, optional ones first
_PAYLOAD_CHECKS = [check for catalog in SLOW.values() for check, _, _ in catalog._types.values()] + [
    PayloadCheck("every.kind", {f"{kind}_{optional}": FieldSpec(type=kind, optional=optional)
                                for optional in (True, False)
                                for kind in ("string", "number", "integer", "boolean", "object", "array", "date",
                                             "datetime")})]
_VALID = {"string": "x", "number": 1.5, "integer": 2, "boolean": False, "object": {"a": 1}, "array": [1],
          "date": "2026-09-05", "datetime": "2026-09-05T10:00:00+01:00"}


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(_PAYLOAD_CHECKS), st.data())
def test_the_msgspec_payload_check_refuses_exactly_what_the_python_check_refuses(check, data: st.DataObject) -> None:
    """PayloadCheck lets msgspec decide JSON payloads (typed=True); the reasons come from the Python pass."""
    payload = data.draw(st.dictionaries(st.sampled_from([*check.names, "extra"]), _VALUES,
                                        max_size=len(check.names) + 1))
    if data.draw(st.booleans()):     # often a payload that is valid but for one drawn value
        payload = {**{n: _VALID[kind] for n, kind, _, optional, _ in check.fields
                      if not optional or data.draw(st.booleans())}, **payload}
    payload = json.loads(json.dumps(payload))        # JSON values, as decoded from text

    def verdict(typed: bool) -> str | None:
        try:
            check(SimpleNamespace(id="e1", tenant="t", payload=payload), typed)
        except EnvelopeRejected as e:
            return e.reason
        return None

    assert verdict(True) == verdict(False)


def test_an_envelope_over_the_byte_limit_is_refused_alike() -> None:
    name, env = SAMPLES[0]
    limit = CARTRIDGES[name].spec.limits.envelope_bytes
    for size in (limit - 200, limit + 1):
        raw = json.dumps({**env, "payload": {**env["payload"], "extra": "x" * size}}).encode()
        before = now_micros()
        assert outcome(FAST[name], raw, 5, before) == outcome(SLOW[name], raw, 5, before)
    assert outcome(FAST[name], raw, 5, before)[1].startswith(f"envelope of {len(raw)} bytes is over")


# ---- content hashes: msgspec's canonical bytes are json's, byte for byte -----------------------------------

_CANONICAL_SLOW = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=12)


@settings(max_examples=3000, deadline=None)
@given(st.tuples(st.text(), st.text(), st.integers(), st.none() | st.text()), _JSON_VALUES)
def test_canonical_json_is_the_json_encoders_bytes(head: tuple[Any, ...], payload: Any) -> None:
    """Stored content hashes (Redis `eh`) were made with json; a hash made with msgspec must equal them, or a
    redelivered event would be refused as different content."""
    assert canonical_json(head, payload, _CANONICAL_SLOW) == \
        _CANONICAL_SLOW.encode((*head, payload)).encode("utf-8", "surrogatepass")


@pytest.mark.parametrize("x", [1e-4, math.nextafter(1e-4, 0), 1.5e-5, 1e16, math.nextafter(1e16, 0), 1e300,
                               5e-324, 0.0, -0.0, 29.22, math.inf, -math.inf, math.nan])
def test_canonical_json_floats_at_the_notation_edges(x: float) -> None:
    payload = {"k": [x, {"n": -x}], "m": x}
    assert canonical_json(("id",), payload, _CANONICAL_SLOW) == _CANONICAL_SLOW.encode(("id", payload)).encode()


@given(st.recursive(st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
                    | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12))
def test_json_value_reads_what_json_loads_reads(value: object) -> None:
    """keel.decoding.json_value (msgspec, the json module beyond 64-bit integers) is json.loads, faster: on compact
    and ASCII-escaped text alike."""
    import json

    from keel.decoding import json_value
    for text in (json.dumps(value, ensure_ascii=False, separators=(",", ":")), json.dumps(value)):
        assert json_value(text) == json.loads(text)
        assert json_value(text.encode()) == json.loads(text)
