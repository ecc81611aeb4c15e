"""Property: a compiled projection makes exactly the writes (and the failures) of the same steps carried out
through the handler API by a small interpreter written independently of the compiler (keel.projection)."""
from __future__ import annotations

import re
from pathlib import Path
from string import Formatter
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keel import MemoryStore, Projector, load_cartridge
from keel.errors import KeelError
from keel.projector import EventStore
from keel.times import format_time, parse_time

CATALOG = {
    "name": "prop",
    "entities": {"alpha": {}, "beta": {}},
    "relations": {"touches": {"from": "alpha", "to": "beta"}},
    "events": {"alpha.did": {"subject": "alpha", "owner": "src", "payload": {
        "x": "string", "n": "number", "when": "date", "at": "datetime", "maybe": "optional string",
        "mnum": "optional number"}}},
}
VALUES = ["{x}", "{n}", "{maybe}", "{mnum}", "fixed", 7, True, None, "{x}-{maybe}", "{event.id}/{n}",
          "{event.occurred_at}", "{event.recorded_at}", "at {event.occurred_at}", "{event.by}", "by {event.by}",
          "{when:date}", "{at:date}", "{{x}}"]
BETA = ["beta:{x}", "beta:{maybe}", "beta:k{n}", "beta:fixed", "beta:{x} bad", "beta:{event.by}"]
TIMES = [None, "{when}", "{at}", "2026-02-03", "{event.recorded_at}", "{event.occurred_at}"]
PREDICATES = ["p1", "p2", "p3"]
WHOLE = re.compile(r"^\{([a-z_.]+)(:date)?\}$")


def maybe_at(draw: st.DrawFn, step: dict[str, Any]) -> dict[str, Any]:
    at = draw(st.sampled_from(TIMES))
    return step if at is None else {**step, "at": at}


@st.composite
def steps(draw: st.DrawFn) -> list[dict[str, Any]]:
    out = []
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["upsert", "facts", "close", "link", "unlink"]))
        if kind == "upsert":
            body: dict[str, Any] = {}
            if draw(st.booleans()):
                body = {"type": "beta", "id": draw(st.sampled_from(["{x}", "{maybe}", "k{n}"]))}
            if draw(st.booleans()):
                body["ref"] = draw(st.sampled_from(["r#{x}", "{maybe}", "plain"]))
            body["labels"] = draw(st.dictionaries(st.sampled_from(["l1", "l2", "l3"]), st.sampled_from(VALUES),
                                                  max_size=3))
        elif kind == "facts":
            body = {"set": draw(st.dictionaries(st.sampled_from(PREDICATES), st.sampled_from(VALUES), min_size=1,
                                                max_size=3))}
            if draw(st.booleans()):
                body["subject"] = draw(st.sampled_from(BETA))
            body = maybe_at(draw, body)
        elif kind == "close":
            body = maybe_at(draw, {"facts": draw(st.lists(st.sampled_from(PREDICATES), min_size=1, max_size=2,
                                                         unique=True))})
        else:
            body = maybe_at(draw, {"relation": "touches", "to": draw(st.sampled_from(BETA))})
        out.append({kind: body})
    return out


events = st.fixed_dictionaries({
    "x": st.sampled_from(["a", "b1", "c.d"]), "n": st.sampled_from([1, 2.5, 40]),
    "when": st.sampled_from(["2026-01-01", "2025-12-31"]),
    "at": st.sampled_from(["2026-01-01T23:00:00-05:00", "2026-01-01T01:00:00Z"]),
}, optional={"maybe": st.sampled_from(["m", "n2", None]), "mnum": st.sampled_from([3, None])})


def resolve(raw: Any, event: Any) -> tuple[bool, Any]:
    """(present, value) of a step value: False when it uses an optional field the event does not carry."""
    if not isinstance(raw, str):
        return True, raw
    values = []
    for _, name, spec, _ in Formatter().parse(raw):
        if name is None:
            continue
        value = getattr(event, name[6:]) if name.startswith("event.") else event.payload.get(name)
        if value is None:
            return False, None
        if spec == "date":
            value = format_time(parse_time(value))[:10]
        elif name in ("event.occurred_at", "event.recorded_at"):
            value = format_time(value)      # a time projects its RFC 3339 text, as Keel prints it (docs/cartridges.md)
        values.append(value)
    m = WHOLE.match(raw)
    if m:
        return True, values[0]
    return True, raw.format_map(_Lookup(event))


class _Lookup(dict):
    def __init__(self, event: Any) -> None:
        super().__init__()
        self.event = event

    def __missing__(self, name: str) -> Any:
        return self.event if name == "event" else self.event.payload[name]


def interpret(program: list[dict[str, Any]], event: Any, store: EventStore) -> None:
    """The steps through the handler API, as a cartridge author would write them by hand."""
    tenant = event.tenant
    for step in program:
        (kind, body), = step.items()
        when_ok, when = resolve(body.get("at"), event)
        when = event.occurred_at if "at" not in body else when
        if kind == "upsert":
            ok, ident = resolve(body.get("id", "{event.subject_id}"), event)
            if not ok:
                continue
            labels = {}
            for name, raw in body.get("labels", {}).items():
                present, value = resolve(raw, event)
                if present:
                    labels[name] = value
            present, ref = resolve(body["ref"], event) if "ref" in body else (True, None)
            store.upsert_entity(tenant, body.get("type", "alpha"), str(ident), ref=ref if present else None,
                                **labels)
        elif kind in ("facts", "close"):
            ok, subject = resolve(body.get("subject", "{event.subject}"), event)
            if not ok or not when_ok:
                continue
            if kind == "facts":
                for name, raw in body["set"].items():
                    present, value = resolve(raw, event)
                    if present:
                        store.open_fact(tenant, subject, name, value, valid_from=when)
            else:
                for name in body["facts"]:
                    store.close_fact(tenant, subject, name, valid_to=when)
        else:
            ok, obj = resolve(body["to"], event)
            if not ok or not when_ok:
                continue
            call = store.link if kind == "link" else store.unlink
            call(tenant, event.subject, body["relation"], obj, when)


def outcome(fn: Any, event: Any, projector: Projector) -> tuple[str, Any]:
    view = EventStore(projector.store, projector.checks)
    view.bind(event)
    try:
        fn(event, view)
        if getattr(fn, "declarative", False):
            view.check_written()        # as the Projector does after a compiled projection (keel.limits)
    except (KeelError, ValueError) as e:
        return "failed", type(e).__name__
    return "writes", view.writes


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(program=steps(), payload=events, by=st.sampled_from([None, "ana"]))
def test_compiled_steps_write_what_the_handler_api_writes(tmp_path_factory: Any, program: list, payload: dict,
                                                          by: str | None) -> None:
    folder = tmp_path_factory.mktemp("prop")
    doc = {**CATALOG, "events": {"alpha.did": {**CATALOG["events"]["alpha.did"], "project": program}}}
    (Path(folder) / "cartridge.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    cartridge = load_cartridge(folder)
    projector = Projector(cartridge, MemoryStore())
    event = projector.parse({"id": "e-1", "tenant": "t", "type": "alpha.did", "subject": "alpha:s1",
                             "occurred_at": "2026-01-02T03:04:05Z", "recorded_at": "2026-01-03T00:00:00.25Z",
                             "by": by, "payload": payload})
    compiled = cartridge.registry.handler("alpha.did")
    got, want = outcome(compiled, event, projector), outcome(lambda e, s: interpret(program, e, s), event, projector)
    if got[0] == want[0] == "failed" and "ValueRefused" in (got[1], want[1]):
        # Both refuse the event as a whole. A compiled projection checks its values (keel.limits) after its
        # steps, so with a bad value AND a bad step in one event the two may name a different first problem.
        return
    assert got == want
