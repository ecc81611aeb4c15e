"""Declarative projections: the `project:` steps of an event type in cartridge.yaml, compiled once.

Most handlers are pure mappings from an event to writes (upsert the subject with labels from the payload,
open facts from payload fields, link to an entity whose id is built from a field). Written as data, such a
mapping is checked against the catalog before any event is applied (`keel validate` lists every problem
at once) and compiled, once per event type, into one Python function with the handler signature
`fn(event, store)`. That function is registered like a handler of handlers.py and builds exactly the writes
the same calls of the handler API would make (same keys, values, provenance, order and catalog checks),
appending them straight to the projector's EventStore buffer instead of going through its methods.
Everything else (reads, branches, loops) stays a Python handler; one cartridge may mix both.

Steps, applied in order (each a mapping with one key):
    upsert: {type, id, ref, labels: {label: value}}   store.upsert_entity(tenant, type, id, ref=…, **labels)
    facts:  {subject, at, set: {predicate: value}}      store.open_fact(tenant, subject, predicate, value, valid_from=at)
    close:  {subject, at, facts: [predicate, …]}        store.close_fact(tenant, subject, predicate, valid_to=at)
    link:   {relation, from, to, at}                    store.link(tenant, from, relation, to, at)
    unlink: {relation, from, to, at}                    store.unlink(tenant, from, relation, to, at)
Defaults: `type`/`id` are the event's subject, `subject` and `from` are `{event.subject}`, `at` is the event's
occurred_at. A value is a YAML scalar; a string may hold placeholders: `{field}` is a payload field,
`{event.X}` an attribute of the event (id tenant type subject subject_type subject_id source by occurred_at
recorded_at), `{name:date}` the UTC calendar day (YYYY-MM-DD) of a time; `{{` and `}}` are literal braces.
A string that is exactly one placeholder keeps the value's JSON type; any other string is text. Every placeholder
names a JSON value: `{event.occurred_at}` and `{event.recorded_at}` are RFC 3339 text (format_time: what Keel prints
times as), never the Instant a Python handler sees. A label, fact or ref whose value uses an optional payload field
that is absent (or null), or `{event.by}` of an event without `by`, is left out; a step whose entity, relation end
or time uses one is skipped. What could only fail at run time is refused here, naming the step: an object or array
field inside text (it has no text form), a ref that is not text, a time inside an entity id (its `:` is not an id
character), a step time that names a field never holding one.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from typing import Any

from .cartridge_spec import CartridgeSpec, EventSpec
from .errors import BadTime
from .store.writes import REF_LABEL, Write, checked_label_writes
from .templates import DAY, template_pieces
from .timeline import Assertion
from .times import format_time, parse_time

EVENT_ATTRIBUTES = ("id", "tenant", "type", "subject", "subject_type", "subject_id", "source", "by",
                    "occurred_at", "recorded_at")
NAME = re.compile(r"^[a-z][a-z0-9_]*$")
TIMES = ("occurred_at", "recorded_at")      # the event attributes that hold a time (an Instant)
OPTIONAL_ATTRIBUTES = ("by",)               # event attributes that may be None: left out like an absent field
NO_TIME = ("number", "boolean", "object", "array")     # payload types no step time can be read from
_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
STEPS: dict[str, tuple[frozenset[str], frozenset[str]]] = {     # step -> (allowed keys, required keys)
    "upsert": (frozenset({"type", "id", "ref", "labels"}), frozenset()),
    "facts": (frozenset({"subject", "at", "set"}), frozenset({"set"})),
    "close": (frozenset({"subject", "at", "facts"}), frozenset({"facts"})),
    "link": (frozenset({"relation", "from", "to", "at"}), frozenset({"relation", "to"})),
    "unlink": (frozenset({"relation", "from", "to", "at"}), frozenset({"relation", "to"})),
}
Handler = Callable[[Any, Any], None]


@dataclass(frozen=True)
class Ref:
    """A placeholder: `event.<attribute>` or a payload field; `day`: its `:date` form (the UTC calendar day)."""
    name: str
    day: bool = False

    @property
    def attribute(self) -> str | None:
        return self.name[6:] if self.name.startswith("event.") else None


@dataclass(frozen=True)
class Template:
    """Text with placeholders: literal strings and Refs, in order."""
    parts: tuple[str | Ref, ...]


Value = Any    # a constant (YAML scalar), a Ref or a Template


class _Problems:
    """Problems of one event type's steps, each prefixed with where it is."""

    def __init__(self, event_type: str) -> None:
        self.where = f"events.{event_type}.project"
        self.lines: list[str] = []

    def add(self, at: str, text: str) -> None:
        self.lines.append(f"{self.where}{at}: {text}")


def parse_value(raw: object, at: str, event: EventSpec, problems: _Problems) -> Value:
    """A YAML scalar as a constant, a Ref or a Template; names checked against the event."""
    if not isinstance(raw, str):
        if raw is not None and not isinstance(raw, bool | int | float):
            problems.add(at, f"expected a JSON scalar, got a YAML {type(raw).__name__} (quote it to keep it as text)")
        return raw
    pieces, bad = template_pieces(raw)
    for text in bad:
        problems.add(at, text)
    if pieces is None:
        return raw
    parts: list[str | Ref] = []
    for piece in pieces:
        if isinstance(piece, str):
            parts.append(piece)
            continue
        field = piece.name
        ref = Ref(field, piece.day)
        attribute = ref.attribute
        if attribute is not None:
            if attribute not in EVENT_ATTRIBUTES:
                problems.add(at, f"{{{field}}}: the event has no attribute {attribute!r}; use one of "
                                 f"{' '.join(EVENT_ATTRIBUTES)}")
            elif ref.day and attribute not in TIMES:
                problems.add(at, f"{{{field}:{DAY}}}: only occurred_at and recorded_at are times")
        elif not _FIELD.match(field) or field not in event.payload:
            problems.add(at, f"{{{field}}}: not a payload field of this event type")
        elif ref.day and event.fields()[field].type not in ("date", "datetime"):
            problems.add(at, f"{{{field}:{DAY}}}: {field} is not a date or datetime field")
        parts.append(ref)
    if not any(isinstance(p, Ref) for p in parts):
        return "".join(p for p in parts if isinstance(p, str))
    if len(parts) == 1:
        return parts[0]
    for ref in parts:
        if isinstance(ref, Ref) and kind_of(ref, event) in ("object", "array"):
            problems.add(at, f"{raw!r}: {{{ref.name}}} is an {kind_of(ref, event)} field, which has no text form; "
                             f"use it alone (\"{{{ref.name}}}\") to keep it as JSON")
    return Template(tuple(parts))


def kind_of(ref: Ref, event: EventSpec) -> str | None:
    """What a placeholder projects: `time` (an event time as RFC 3339 text), `string` (every other attribute and
    every `:date` form), or the payload field's declared type (None when the name is not known)."""
    if ref.day:
        return "string"
    attribute = ref.attribute
    if attribute is not None:
        return "time" if attribute in TIMES else "string"
    field = event.fields().get(ref.name)
    return None if field is None else field.type


def _check_kind(value: Value, role: str, at: str, event: EventSpec, problems: _Problems) -> None:
    """Refuse, before any event, a value that could only fail when applied: a ref that is not text, a time in
    an entity id (RFC 3339 holds `:`, which ids cannot), a step time naming a field that never holds one (a string
    may hold RFC 3339 text, an integer microseconds)."""
    refs = refs_of(value)
    if role == "ref" and isinstance(value, Ref) and kind_of(value, event) not in (None, "string", "time", "date",
                                                                                 "datetime"):
        problems.add(at, f"{{{value.name}}} is a {kind_of(value, event)} field; a ref is a pointer, text: write "
                         f"it inside text (\"<system>#{{{value.name}}}\")")
    elif role == "entity":
        for ref in refs:
            if kind_of(ref, event) == "time":
                problems.add(at, f"{{{ref.name}}} is a time (RFC 3339 holds ':', which an entity id cannot); "
                                 f"use {{{ref.name}:{DAY}}}, the calendar day")
    elif role == "time" and isinstance(value, Ref) and kind_of(value, event) in NO_TIME:
        problems.add(at, f"{{{value.name}}} is a {kind_of(value, event)} field, never a time: name a date or "
                         f"datetime field, or {{event.occurred_at}} / {{event.recorded_at}}")


def refs_of(value: Value) -> list[Ref]:
    if isinstance(value, Ref):
        return [value]
    if isinstance(value, Template):
        return [p for p in value.parts if isinstance(p, Ref)]
    return []


def entity_type_of(value: Value, event: EventSpec) -> str | None:
    """The entity type an entity-valued template names, when it is known before any event (else None)."""
    if isinstance(value, Ref):
        return event.subject if value.name == "event.subject" else None
    if isinstance(value, str):
        return value.partition(":")[0]
    if isinstance(value, Template) and isinstance(value.parts[0], str) and ":" in value.parts[0]:
        return value.parts[0].partition(":")[0]
    return None


@dataclass(frozen=True)
class Step:
    kind: str
    args: dict[str, Value]


def parse_steps(event_type: str, spec: CartridgeSpec, event: EventSpec) -> tuple[list[Step], list[str]]:
    """One event type's `project:` steps, checked against the catalog; (steps, problems)."""
    problems = _Problems(event_type)
    steps: list[Step] = []
    for i, raw in enumerate(event.project or []):
        where = f"[{i}]"
        if not isinstance(raw, dict) or len(raw) != 1 or next(iter(raw)) not in STEPS:
            problems.add(where, f"a step is a mapping with one key, one of {', '.join(STEPS)}")
            continue
        kind, body = next(iter(raw.items()))
        where = f"[{i}].{kind}"
        if body is None:
            body = {}
        if not isinstance(body, dict):
            problems.add(where, "expected a mapping")
            continue
        allowed, required = STEPS[kind]
        for key in sorted(set(body) - allowed):
            problems.add(f"{where}.{key}", f"unknown key; {kind} takes {', '.join(sorted(allowed))}")
        for key in sorted(required - set(body)):
            problems.add(f"{where}.{key}", "required")
        parse = _STEP_PARSERS[kind]
        args = parse(body, where, spec, event, problems)
        if args is not None:
            steps.append(Step(kind, args))
    return steps, problems.lines


def _time(body: dict[str, Any], where: str, event: EventSpec, problems: _Problems) -> Value:
    """The step's time: a placeholder, or a fixed time parsed now (YAML reads an unquoted date as a date)."""
    raw = body.get("at", "{event.occurred_at}")
    at = raw if isinstance(raw, date) else parse_value(raw, f"{where}.at", event, problems)
    _check_kind(at, "time", f"{where}.at", event, problems)
    if isinstance(at, str | date):
        try:
            return parse_time(at)
        except BadTime:
            problems.add(f"{where}.at", f"{at!r} is not a time (RFC 3339 with its offset, or a date)")
    elif not isinstance(at, Ref | Template):
        problems.add(f"{where}.at", f"{at!r} is not a time")
    return at


def _entity(raw: object, where: str, spec: CartridgeSpec, event: EventSpec, problems: _Problems,
            foreign: str | None = None) -> Value:
    """An entity reference of a step: a type of the cartridge, or the other cartridge's type a relation end
    names (`foreign`: `<cartridge>.<type>`)."""
    value = parse_value(raw, where, event, problems)
    _check_kind(value, "entity", where, event, problems)
    kind = entity_type_of(value, event)
    if isinstance(value, str) and ":" not in value:
        problems.add(where, f"{value!r} is not an entity ('<entity type>:<id>')")
    elif foreign is not None and kind is not None and kind != foreign.rpartition(".")[2]:
        problems.add(where, f"{kind!r} is not {foreign!r}")
    elif foreign is None and kind is not None and kind not in spec.entities:
        problems.add(where, f"{kind!r} is not an entity type of the cartridge")
    return value


def _parse_upsert(body: dict[str, Any], where: str, spec: CartridgeSpec, event: EventSpec,
                  problems: _Problems) -> dict[str, Value] | None:
    kind = body.get("type", event.subject)
    if kind not in spec.entities:
        problems.add(f"{where}.type", f"{kind!r} is not an entity type of the cartridge")
    if "type" in body and "id" not in body:
        problems.add(f"{where}.id", "required when type is given")
    ident = parse_value(body.get("id", "{event.subject_id}"), f"{where}.id", event, problems)
    _check_kind(ident, "entity", f"{where}.id", event, problems)
    ref = parse_value(body["ref"], f"{where}.ref", event, problems) if "ref" in body else None
    _check_kind(ref, "ref", f"{where}.ref", event, problems)
    labels = body.get("labels") or {}
    if not isinstance(labels, dict):
        problems.add(f"{where}.labels", "expected a mapping of label names to values")
        labels = {}
    parsed = {}
    for name, raw in labels.items():
        if not isinstance(name, str) or not NAME.match(name) or name == REF_LABEL:
            problems.add(f"{where}.labels.{name}", f"label names look like lowercase_words (not {REF_LABEL!r})")
        parsed[name] = parse_value(raw, f"{where}.labels.{name}", event, problems)
    return {"type": kind, "id": ident, "ref": ref, "labels": parsed}


def _parse_facts(body: dict[str, Any], where: str, spec: CartridgeSpec, event: EventSpec,
                 problems: _Problems) -> dict[str, Value] | None:
    """`facts` (key `set`: predicate -> value) and `close` (key `facts`: predicates) steps."""
    key, shape, what = ("set", dict, "a mapping of predicates to values") if where.endswith(".facts") \
        else ("facts", list, "a list of predicates")
    given = body.get(key)
    if not isinstance(given, shape) or not given:
        if key in body:
            problems.add(f"{where}.{key}", f"expected {what}")
        return None
    for name in given:
        if not isinstance(name, str) or not NAME.match(name):
            problems.add(f"{where}.{key}", f"predicate {name!r}: predicates look like lowercase_words")
    values = {name: parse_value(raw, f"{where}.set.{name}", event, problems) for name, raw in given.items()} \
        if key == "set" else {name: None for name in given}
    return {"subject": _entity(body.get("subject", "{event.subject}"), f"{where}.subject", spec, event, problems),
            "at": _time(body, where, event, problems), "set": values}


def _parse_link(body: dict[str, Any], where: str, spec: CartridgeSpec, event: EventSpec,
                problems: _Problems) -> dict[str, Value] | None:
    relation = body.get("relation")
    declared = spec.relations.get(relation) if isinstance(relation, str) else None
    if "relation" in body and declared is None:
        problems.add(f"{where}.relation", f"{relation!r} is not a relation of the cartridge")
    ends = {}
    for end in ("from", "to"):
        expected = None if declared is None else (declared.from_ if end == "from" else declared.to)
        value = _entity(body.get(end, "{event.subject}"), f"{where}.{end}", spec, event, problems,
                        expected if expected is not None and "." in expected else None)
        kind = entity_type_of(value, event)
        if expected is not None and kind is not None and kind in spec.entities and kind != expected:
            problems.add(f"{where}.{end}", f"{relation}: the {end} end is a {expected!r}, not a {kind!r}")
        ends[end] = value
    if "to" not in body:
        return None
    return {"relation": relation, "from": ends["from"], "to": ends["to"], "at": _time(body, where, event, problems)}


_STEP_PARSERS = {"upsert": _parse_upsert, "facts": _parse_facts, "close": _parse_facts, "link": _parse_link,
                 "unlink": _parse_link}


class _Source:
    """The text of one compiled function. Every constant is a name bound in its namespace, never text in the
    source, so no cartridge value can change the code; field and attribute names are checked identifiers."""

    def __init__(self, event: EventSpec) -> None:
        self.optional = {name for name, f in event.fields().items() if f.optional}
        self.subject_type = event.subject
        self.namespace: dict[str, Any] = {"_new": tuple.__new__, "_W": Write, "_A": Assertion,
                                          "_labels": checked_label_writes, "_point": _point, "_day": _day,
                                          "_time": format_time}
        self.lines: list[str] = []
        self.reads: list[str] = []              # the payload reads, done once at the top
        self.fields: dict[str, str] = {}        # payload field -> its local name

    def const(self, value: object) -> str:
        name = f"_k{len(self.namespace)}"
        self.namespace[name] = value
        return name

    def ref(self, ref: Ref) -> str:
        """The expression of a placeholder's value, a JSON value: its `:date` form applied, an event time as its
        RFC 3339 text (an Instant is no JSON value)."""
        if ref.day:
            return f"_day({self.read(ref)})"
        if ref.attribute in TIMES:
            return f"_time({self.read(ref)})"
        return self.read(ref)

    def read(self, ref: Ref) -> str:
        """The expression of the value a placeholder names: an event attribute (a time as its micros, `occ` or
        `rec`), or a payload field read once."""
        attribute = ref.attribute
        if attribute is not None:
            if attribute in TIMES:
                return "occ" if attribute == "occurred_at" else "rec"
            return f"event.{attribute}"         # a checked name of EVENT_ATTRIBUTES
        local = self.fields.get(ref.name)
        if local is None:
            local = self.fields[ref.name] = f"_v{len(self.fields)}"
            key = self.const(ref.name)
            self.reads.append(f"    {local} = p.get({key})" if ref.name in self.optional else f"    {local} = p[{key}]")
        return local

    def expr(self, value: Value) -> str:
        if isinstance(value, Ref):
            return self.ref(value)
        if isinstance(value, Template):
            inner = "".join("{" + (self.ref(p) if isinstance(p, Ref) else self.const(p)) + "}" for p in value.parts)
            return f'f"{inner}"'
        return self.const(value)

    def guard(self, *values: Value) -> str | None:
        """The condition under which every optional payload field (and optional attribute, `event.by`) the values
        use is present."""
        names = sorted({self.read(r) for v in values for r in refs_of(v)
                        if (r.name in self.optional and r.attribute is None) or r.attribute in OPTIONAL_ATTRIBUTES})
        return " and ".join(f"{n} is not None" for n in names) or None

    def point(self, at: Value) -> str:
        if isinstance(at, Ref) and at.attribute in TIMES and not at.day:
            return self.read(at)                # the event's own time, already micros
        if isinstance(at, int):
            return self.const(at)
        return f"_point({self.expr(at)})"

    def emit(self, indent: int, line: str) -> None:
        self.lines.append("    " * indent + line)

    def block(self, guard: str | None) -> int:
        return self.block_at(1, guard)

    def block_at(self, indent: int, guard: str | None) -> int:
        """The indent of lines that run only when `guard` holds (an `if` is emitted for a guard)."""
        if guard is None:
            return indent
        self.emit(indent, f"if {guard}:")
        return indent + 1


def _point(when: object) -> int:
    """The valid-time point of a value the way EventStore reads one (an Instant is already micros)."""
    return int(when) if isinstance(when, int) and not isinstance(when, bool) else parse_time(when)


def _day(when: object) -> str:
    """The UTC calendar day of a time, as `str(event.occurred_at)[:10]` gives it in a Python handler."""
    return format_time(_point(when))[:10]


def _write(src: _Source, indent: int, key: str, value: str, closed: bool, point: str) -> None:
    src.emit(indent, f"out.append(_new(_W, ({key}, _new(_A, ({point}, {value}, {closed}, src, eid, rec, by, "
                     "None)))))")


def _checked_entity(src: _Source, indent: int, expr: str, local: str) -> None:
    src.emit(indent, f"{local} = {expr}")
    src.emit(indent, f"if {local} not in known:")
    src.emit(indent + 1, f"checks.entity({local})")


def _upsert(src: _Source, a: dict[str, Value]) -> None:
    """upsert_entity's writes: labels by name after the ref, or an existence marker when there are none
    (store.base.checked_label_writes). With no optional value among them the order is fixed here, once."""
    indent = src.block(src.guard(a["id"]))
    default = a["type"] == src.subject_type and a["id"] == Ref("event.subject_id")
    entity = "event.subject" if default else src.expr(Template((a["type"] + ":", *_parts(a["id"]))))
    _checked_entity(src, indent, entity, "ent")
    labels, ref = a["labels"], a["ref"]
    if any(src.guard(v) for v in (ref, *labels.values())):
        src.emit(indent, "labels = {}")
        for name, value in labels.items():
            inner = src.block_at(indent, src.guard(value))
            src.emit(inner, f"labels[{src.const(name)}] = {src.expr(value)}")
        ref_expr = "None" if ref is None else src.expr(ref)
        guard = src.guard(ref)
        if guard is not None:
            ref_expr = f"({ref_expr} if {guard} else None)"
        src.emit(indent, f"out += _labels(ent, {ref_expr}, labels, occ, src, eid, rec, by)")
        return
    items = ([] if ref is None else [(REF_LABEL, ref)]) + sorted(labels.items())
    if not items:
        _write(src, indent, "('e', ent)", "True", False, "occ")
    for name, value in items:
        _write(src, indent, f"('l', ent, {src.const(name)})", src.expr(value), False, "occ")


def _facts(src: _Source, a: dict[str, Value], closed: bool) -> None:
    """open_fact / close_fact per predicate. The subject and the time are checked as those calls check them:
    only when a write is made, so a step whose every value is an absent optional field checks nothing."""
    indent = src.block(src.guard(a["subject"], a["at"]))
    values = {name: None if closed else value for name, value in a["set"].items()}
    lazy = any(src.guard(v) for v in values.values())
    if not lazy:
        _checked_entity(src, indent, src.expr(a["subject"]), "subj")
        src.emit(indent, f"pt = {src.point(a['at'])}")
    for name, value in values.items():
        inner = src.block_at(indent, src.guard(value))
        if lazy:
            _checked_entity(src, inner, src.expr(a["subject"]), "subj")
            src.emit(inner, f"pt = {src.point(a['at'])}")
        _write(src, inner, f"('f', subj, {src.const(name)}, '')", "None" if closed else src.expr(value), closed, "pt")


def compile_steps(event_type: str, event: EventSpec, steps: list[Step]) -> Handler:
    """One function `fn(event, store)` doing the steps' writes on the projector's EventStore."""
    src = _Source(event)
    for step in steps:
        a = step.args
        if step.kind == "upsert":
            _upsert(src, a)
        elif step.kind in ("facts", "close"):
            _facts(src, a, closed=step.kind == "close")
        else:
            indent = src.block(src.guard(a["from"], a["to"], a["at"]))
            rel = src.const(a["relation"])
            src.emit(indent, f"s, o = {src.expr(a['from'])}, {src.expr(a['to'])}")
            src.emit(indent, f"checks.relation(s, {rel}, o)")
            link = step.kind == "link"
            _write(src, indent, f"('r', s, {rel}, o)", "True" if link else "None", not link, src.point(a["at"]))
    head = [f"def project(event, store):  # {event_type}",
            "    p = event.payload",
            "    checks = store.checks",
            "    known = checks.known",
            "    out = store.writes",
            "    src, eid, by = event.source, event.id, event.by",
            "    occ, rec = int(event.occurred_at), int(event.recorded_at)"]
    text = "\n".join(head + src.reads + src.lines + ["    return None", ""])
    namespace = dict(src.namespace)
    exec(compile(text, f"<projection {event_type}>", "exec"), namespace)   # noqa: S102 - our own text, see _Source
    fn = namespace["project"]
    fn.source = text
    fn.declarative = True
    return fn


def _parts(value: Value) -> tuple[str | Ref, ...]:
    if isinstance(value, Template):
        return value.parts
    if isinstance(value, Ref):
        return (value,)
    return (str(value),)


def compile_projections(spec: CartridgeSpec) -> tuple[dict[str, Handler], list[str]]:
    """Every event type's `project:` compiled; ({event type: handler}, problems of all of them)."""
    handlers: dict[str, Handler] = {}
    problems: list[str] = []
    for event_type, event in spec.events.items():
        if event.project is None:
            continue
        if not event.project:
            problems.append(f"events.{event_type}.project: empty; give steps or remove it")
            continue
        steps, found = parse_steps(event_type, spec, event)
        problems += found
        if not found:
            handlers[event_type] = compile_steps(event_type, event, steps)
    return handlers, problems
