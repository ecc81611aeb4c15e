"""Versioned event types: how an envelope of an older version of its event type is read as the version the
cartridge declares, before it is checked and projected. The log is never rewritten; the upcast payload is
what handlers see, the envelope as recorded keeps its identity (content hash, `keel publish`, evidence ids).

An event type declares `version: N` (default 1) and the payload of version N. Each older version k < N has
exactly one way to become version k + 1: `upcast: {k: [steps]}` in cartridge.yaml, or a Python function in
handlers.py registered with `@registry.upcast(event_type, k)` that takes the version-k payload (a copy) and
returns the version-(k + 1) payload. An envelope without `version` is version 1. Steps, applied in order
(each a mapping with one key):

    add:    {field: value, …}    the field must be absent; value: a JSON constant, or text with `{field}`
                                 placeholders of the payload at that step (exactly one placeholder copies the
                                 field's value with its JSON type); a placeholder naming an absent field (or
                                 null) leaves the added field out
    rename: {old: new, …}        `new` must be absent; an absent `old` renames nothing
    drop:   [field, …]           absent fields are no problem

The steps are checked when the cartridge loads, backwards from the declared payload: every field a step adds or
renames to must exist in the next version, a dropped one must not, a copied field's type must fit. The same
walk gives each older version's payload shape (`shapes`), which keel/schema.py prints as JSON Schema; a Python
upcaster's input is unknown to it (any object).
"""
from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from string import Formatter
from typing import Any

from .cartridge_spec import CartridgeSpec, EventSpec
from .errors import BadTime
from .registry import Registry, Upcaster
from .times import parse_time

STEP_KINDS = ("add", "rename", "drop")
_FIELD = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class UpcastFailed(Exception):
    """An envelope's payload could not be upcast; the message is the reason (the catalog refuses the event)."""


@dataclass(frozen=True)
class Copy:
    """A value that is exactly one placeholder: the named field's value, its JSON type kept."""
    field: str


@dataclass(frozen=True)
class Text:
    """Text with placeholders (each field's value as text, as a projection's template makes it)."""
    parts: tuple[str | Copy, ...]


@dataclass(frozen=True)
class Step:
    kind: str                                  # add | rename | drop
    items: tuple[tuple[str, Any], ...]         # add: (field, value); rename: (old, new); drop: (field, None)


@dataclass(frozen=True)
class FieldShape:
    """A payload field as a version has it: its type (None: any JSON value) and whether it may be absent."""
    type: str | None
    optional: bool


Shape = dict[str, FieldShape]


class Hop:
    """The way from one version of an event type to the next: YAML steps or a Python upcaster."""
    __slots__ = ("event_type", "fn", "steps", "version")

    def __init__(self, event_type: str, version: int, *, steps: tuple[Step, ...] | None = None,
                 fn: Upcaster | None = None) -> None:
        self.event_type = event_type
        self.version = version
        self.steps = steps
        self.fn = fn

    @property
    def what(self) -> str:
        if self.fn is not None:
            return f"upcaster {getattr(self.fn, '__name__', '?')} of handlers.py"
        return f"events.{self.event_type}.upcast.{self.version}"

    def __call__(self, payload: dict[str, Any], *, twice: bool = False) -> dict[str, Any]:
        """The next version's payload (a new dict; `payload` is left as it was). `twice`: a Python upcaster is
        called twice on equal copies and must give equal payloads (the determinism check of `keel validate`).
        Raises UpcastFailed."""
        if self.steps is not None:
            return _run_steps(self.steps, payload, self.version)
        assert self.fn is not None
        out = self._call(payload)
        if twice and self._call(payload) != out:
            raise UpcastFailed(f"{self.what} is not deterministic: two calls on the same version-{self.version} "
                               f"payload returned different payloads (use only the payload)")
        return out

    def _call(self, payload: dict[str, Any]) -> dict[str, Any]:
        assert self.fn is not None
        try:
            out = self.fn(copy.deepcopy(payload))
        except Exception as e:  # noqa: BLE001 - any failure of cartridge code refuses the event, with why
            raise UpcastFailed(f"{self.what} failed: {type(e).__name__}: {e}") from None
        if not isinstance(out, dict) or not all(isinstance(k, str) for k in out):
            raise UpcastFailed(f"{self.what} returned a {type(out).__name__}, not a payload (a dict with "
                               f"string keys)")
        return out


def _run_steps(steps: tuple[Step, ...], payload: dict[str, Any], version: int) -> dict[str, Any]:
    p = dict(payload)
    for step in steps:
        if step.kind == "add":
            for name, value in step.items:
                if name in p:
                    raise UpcastFailed(f"payload.{name}: version {version} has no field {name} (its upcast to "
                                       f"version {version + 1} adds it)")
                made = _value(value, p)
                if made is not _ABSENT:
                    p[name] = made
        elif step.kind == "rename":
            for old, new in step.items:
                if new in p:
                    raise UpcastFailed(f"payload.{new}: version {version} has no field {new} (its upcast to "
                                       f"version {version + 1} renames {old} to it)")
                if old in p:
                    p[new] = p.pop(old)
        else:
            for name, _ in step.items:
                p.pop(name, None)
    return p


_ABSENT = object()


def _value(value: Any, payload: dict[str, Any]) -> Any:
    if isinstance(value, Copy):
        found = payload.get(value.field)
        return _ABSENT if found is None else found
    if isinstance(value, Text):
        out = []
        for part in value.parts:
            if isinstance(part, Copy):
                found = payload.get(part.field)
                if found is None:
                    return _ABSENT
                out.append(f"{found}")
            else:
                out.append(part)
        return "".join(out)
    return copy.deepcopy(value) if isinstance(value, dict | list) else value


class Upcasts:
    """Every event type's declared version and its hops from older versions (keel.envelope's Catalog asks)."""

    def __init__(self, versions: dict[str, int], hops: dict[str, list[Hop]]) -> None:
        self.versions = versions
        self.hops = hops            # event type -> hops from version 1, 2, … (index = version - 1)

    def version(self, event_type: str) -> int:
        return self.versions.get(event_type, 1)

    def upcast(self, event_type: str, version: int, payload: dict[str, Any], *, twice: bool = False
               ) -> dict[str, Any]:
        """A version-`version` payload read as the declared version; raises UpcastFailed."""
        for hop in self.hops[event_type][version - 1:]:
            try:
                payload = hop(payload, twice=twice)
            except UpcastFailed as e:
                raise UpcastFailed(f"upcast from version {version} (to {hop.version + 1}, {hop.what}): {e}") from None
        return payload


def compile_upcasts(spec: CartridgeSpec, registry: Registry) -> tuple[Upcasts, list[str]]:
    """Every event type's hops, checked; (upcasts, problems, one line each)."""
    problems: list[str] = []
    python = registry.upcasters()
    for event_type, version in python:
        event = spec.events.get(event_type)
        if event is None:
            problems.append(f"handlers.py: upcaster for {event_type!r}, which is not an event type of the catalog")
        elif type(version) is not int or not 1 <= version < event.version:
            problems.append(f"handlers.py: upcaster for {event_type!r} from version {version!r}: {event_type} is at "
                            f"version {event.version}, so upcasters go from versions 1 to {event.version - 1}"
                            if event.version > 1 else
                            f"handlers.py: upcaster for {event_type!r} from version {version!r}: {event_type} "
                            f"has only version 1 (declare `version:` in cartridge.yaml)")
    for (event_type, version), n in sorted(registry.upcast_duplicates().items(), key=str):
        problems.append(f"handlers.py: {n} upcasters for {event_type!r} from version {version!r}; exactly one is "
                        f"allowed")
    hops: dict[str, list[Hop]] = {}
    complete = []           # event types whose every hop is given once and parsed: their shapes are checked
    for event_type, event in spec.events.items():
        where = f"events.{event_type}"
        before = len(problems)
        for version in sorted(event.upcast):
            if not 1 <= version < event.version:
                problems.append(f"{where}.upcast.{version}: not a version below {event_type}'s version "
                                f"{event.version} (`upcast: {{k: steps}}` turns version k into k + 1)")
        chain = []
        for version in range(1, event.version):
            steps, fn = event.upcast.get(version), python.get((event_type, version))
            if steps is not None and fn is not None:
                problems.append(f"{where}.upcast.{version}: has steps and a Python upcaster in handlers.py; keep one")
            elif steps is None and fn is None:
                problems.append(f"{where}: no upcast from version {version} to {version + 1} (add `upcast: "
                                f"{{{version}: [steps]}}`, or @registry.upcast({event_type!r}, {version}) in "
                                f"handlers.py)")
            elif steps is not None:
                parsed, found = parse_steps(f"{where}.upcast.{version}", steps)
                problems += found
                chain.append(Hop(event_type, version, steps=tuple(parsed)))
            else:
                chain.append(Hop(event_type, version, fn=fn))
        hops[event_type] = chain
        if len(problems) == before:
            complete.append(event_type)
    for event_type in complete:
        problems += shapes(event_type, spec.events[event_type], hops[event_type])[1]
    return Upcasts({ev: e.version for ev, e in spec.events.items()}, hops), problems


def parse_steps(where: str, raw_steps: list[Any]) -> tuple[list[Step], list[str]]:
    """One hop's steps as written in cartridge.yaml; (steps, problems)."""
    steps: list[Step] = []
    problems: list[str] = []
    for i, raw in enumerate(raw_steps):
        at = f"{where}[{i}]"
        if not isinstance(raw, dict) or len(raw) != 1 or next(iter(raw)) not in STEP_KINDS:
            problems.append(f"{at}: a step is a mapping with one key, one of {', '.join(STEP_KINDS)}")
            continue
        kind, body = next(iter(raw.items()))
        at = f"{at}.{kind}"
        items: list[tuple[str, Any]] = []
        if kind == "drop":
            names = [body] if isinstance(body, str) else body
            if not isinstance(names, list) or not names:
                problems.append(f"{at}: a field name or a list of field names")
                continue
            items = [(n, None) for n in names]
        elif not isinstance(body, dict) or not body:
            problems.append(f"{at}: a mapping of " + ("field: value" if kind == "add" else "old name: new name"))
            continue
        elif kind == "add":
            for name, value in body.items():
                items.append((name, _parse_value(value, f"{at}.{name}", problems)))
        else:
            items = list(body.items())
            for old, new in items:
                if not isinstance(new, str) or not _FIELD.match(new):
                    problems.append(f"{at}.{old}: the new name {new!r} is not a field name (letters, digits, _)")
        for name, _ in items:
            if not isinstance(name, str) or not _FIELD.match(name):
                problems.append(f"{at}: {name!r} is not a field name (letters, digits, _)")
        steps.append(Step(kind, tuple(items)))
    return steps, problems


def _parse_value(raw: Any, at: str, problems: list[str]) -> Any:
    if not isinstance(raw, str):
        if not _is_json(raw):
            problems.append(f"{at}: {raw!r} is not a JSON value (quote a date to keep it as text)")
        return raw
    try:
        pieces = list(Formatter().parse(raw))
    except ValueError as e:
        problems.append(f"{at}: bad template {raw!r}: {e}")
        return raw
    parts: list[str | Copy] = []
    for literal, field, spec, conversion in pieces:
        if literal:
            parts.append(literal)
        if field is None:
            continue
        if spec or conversion or not _FIELD.match(field):
            problems.append(f"{at}: {{{field}}}: a placeholder names a payload field, without format or "
                            f"conversion")
        parts.append(Copy(field))
    if not any(isinstance(p, Copy) for p in parts):
        return "".join(p for p in parts if isinstance(p, str))
    if len(parts) == 1:
        return parts[0]
    return Text(tuple(parts))


def _is_json(value: Any) -> bool:
    if value is None or isinstance(value, bool | int | str):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(map(_is_json, value))
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v) for k, v in value.items())
    return False


def declared_shape(event: EventSpec) -> Shape:
    return {name: FieldShape(f.type, f.optional) for name, f in event.fields().items()}


def shapes(event_type: str, event: EventSpec, hops: list[Hop]) -> tuple[dict[int, Shape | None], list[str]]:
    """Each version's payload shape, walking the hops backwards from the declared payload ({version: shape,
    None before a Python upcaster: unknown}), and the problems met (a step that cannot fit the next version)."""
    out: dict[int, Shape | None] = {event.version: declared_shape(event)}
    problems: list[str] = []
    after: Shape | None = out[event.version]
    for hop in reversed(hops):
        if after is None or hop.steps is None:
            after = None
        else:
            after = _before(hop, dict(after), problems)
        out[hop.version] = after
    return out, problems


def _before(hop: Hop, after: Shape, problems: list[str]) -> Shape:
    """The shape of version `hop.version` given the shape of the next one (steps undone in reverse)."""
    nxt = hop.version + 1
    for i in reversed(range(len(hop.steps or ()))):
        step = (hop.steps or ())[i]
        at = f"events.{hop.event_type}.upcast.{hop.version}[{i}].{step.kind}"
        for name, value in reversed(step.items):
            if step.kind == "drop":
                if name in after:
                    problems.append(f"{at}: drops {name}, which version {nxt} has after this step")
                else:
                    after[name] = FieldShape(None, True)
            elif step.kind == "rename":
                if value not in after:
                    problems.append(f"{at}.{name}: renames to {value}, which is not a field of version {nxt} after "
                                    f"this step")
                elif name in after:
                    problems.append(f"{at}.{name}: {name} is still a field of version {nxt} after it is renamed")
                else:
                    after[name] = after.pop(value)
            elif name not in after:
                problems.append(f"{at}.{name}: adds {name}, which is not a field of version {nxt} after this step")
            else:
                target = after.pop(name)
                _check_added(f"{at}.{name}", name, value, target, after, problems)
    return after


def _check_added(at: str, name: str, value: Any, target: FieldShape, before: Shape, problems: list[str]) -> None:
    """An added field's value must fit the field it makes; a copied field must exist before the step (and is
    required there when the made field is)."""
    copies = [value] if isinstance(value, Copy) else [p for p in value.parts if isinstance(p, Copy)] \
        if isinstance(value, Text) else []
    for ref in copies:
        found = before.get(ref.field)
        if found is None:
            problems.append(f"{at}: {{{ref.field}}}: no such field at this step (fields: "
                            f"{', '.join(sorted(before)) or 'none'})")
            continue
        if not target.optional and found.optional:
            before[ref.field] = FieldShape(found.type, False)     # absent, it would leave a required field out
    if target.type is None:
        return
    if isinstance(value, Copy):
        found = before.get(value.field)
        if found is not None and found.type is not None and not _fits_type(found.type, target.type):
            problems.append(f"{at}: copies {value.field} (a {found.type}) into {name}, a {target.type}")
    elif isinstance(value, Text):
        if target.type != "string":
            problems.append(f"{at}: text made from a template is a string; {name} is a {target.type}")
    elif value is None:
        if not target.optional:
            problems.append(f"{at}: null for {name}, a required {target.type}")
    elif target.type in _CONSTANT_FITS and not _CONSTANT_FITS[target.type](value):
        problems.append(f"{at}: {value!r} is not a {target.type}, the type of {name}")


def _fits_type(given: str, wanted: str) -> bool:
    return given == wanted or (given, wanted) in {("integer", "number"), ("date", "datetime")}


def _is_time(value: Any, date_only: bool) -> bool:
    if not isinstance(value, str) or (date_only and len(value) != 10):
        return False
    try:
        parse_time(value)
    except BadTime:
        return False
    return True


_CONSTANT_FITS: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "date": lambda v: _is_time(v, True),
    "datetime": lambda v: _is_time(v, False),
}
