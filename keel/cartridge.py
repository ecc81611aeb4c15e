"""Cartridges: a domain's catalog (cartridge.yaml) plus its handlers (handlers.py), loaded and checked."""
from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from .cartridge_spec import (
    CartridgeSpec,
    EntitySpec,
    EventSpec,
    FieldSpec,  # noqa: F401 - keel.cartridge names the schema it loads (tests import it from here)
    HistorySpec,
    MemorySpec,
    PersonalSpec,
    RelationSpec,
    RuleSpec,
    SearchSpec,
)
from .cartridge_yaml import CartridgeLoader, line_of, yaml_problem
from .errors import BadTime, CartridgeInvalid
from .limits import Limits
from .projection import compile_projections
from .registry import Registry
from .rules import RESERVED, Rule, check_names, compile_rule
from .sources import compile_sources
from .times import parse_duration, parse_time
from .upcast import Upcasts, compile_upcasts
from .wire import dlq_topic, events_topic

PAYLOAD_TYPES = ("string", "number", "integer", "boolean", "date", "datetime", "object", "array")
SCOPES = ("global", "tenant", "task", "agent")
NAME = re.compile(r"^[a-z][a-z0-9_]*$")
EVENT_NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")


class Cartridge:
    """A loaded, validated cartridge: its spec, its handler registry, its folder, and how older versions of its
    event types are upcast (keel/upcast.py)."""

    def __init__(self, spec: CartridgeSpec, registry: Registry, path: Path, upcasts: Upcasts | None = None) -> None:
        self.spec = spec
        self.registry = registry
        self.path = path
        self.upcasts = upcasts if upcasts is not None else compile_upcasts(spec, registry)[0]
        self.name = spec.name
        self.topic = events_topic(spec.name)
        self.dlq_topic = dlq_topic(spec.name)
        self.rules = compile_rules(spec)[0]

    def rules_of(self, entity_type: str) -> list[Rule]:
        """The rules that apply to an entity type, by name."""
        return [r for _, r in sorted(self.rules.items()) if r.applies_to == entity_type]

    def rules_for(self, entity_type: str) -> dict[str, dict[str, Any]]:
        """`{rule: {definition, params…, when}}` for the rules that apply to an entity type, by name."""
        return {r.name: r.describe() for r in self.rules_of(entity_type)}

    def relations_of(self, entity_type: str) -> list[str]:
        """Relation names with the entity type at either end."""
        return sorted(n for n, r in self.spec.relations.items() if entity_type in (r.from_, r.to))

    def foreign_types(self) -> dict[str, str]:
        """`{type: "<cartridge>.<type>"}` of the other cartridges' types its relations end at."""
        return {end.rpartition(".")[2]: end for r in self.spec.relations.values() for end in (r.from_, r.to)
                if "." in end}


def compile_rules(spec: CartridgeSpec) -> tuple[dict[str, Rule], list[str]]:
    """Every rule compiled (its `when:` by CEL), and the problems found, each naming its rule."""
    rules, problems = {}, []
    for name, r in sorted(spec.rules.items()):
        for p in sorted(set(r.params()) & set(RESERVED)):
            problems.append(f"rules.{name}.{p}: a reserved key, not a parameter name")
        rules[name], found = compile_rule(name, r.applies_to, r.definition, r.params(), r.when)
        problems += found
    return rules, problems


def load_cartridge(path: str | Path) -> Cartridge:
    """Load and validate `<path>/cartridge.yaml` and `<path>/handlers.py` (optional when every event type has
    `project:` steps), compiling the declarative projections once. Raises CartridgeInvalid with every problem."""
    folder = Path(path)
    spec, problems, dropped = _load_spec(folder)
    registry = None
    upcasts = None
    if spec is not None:
        registry, handler_problems = _load_handlers(folder, spec.name)
        problems += handler_problems
        projections, projection_problems = compile_projections(spec)
        problems += projection_problems
        if registry is not None:
            problems += register_projections(registry, projections, spec)
            upcasts, upcast_problems = compile_upcasts(spec, registry)
            problems += check_spec(spec, registry) + upcast_problems
        problems = [p for p in problems if not _follows_from(p, dropped)]
    if problems:
        raise CartridgeInvalid(str(folder), problems)
    assert spec is not None and registry is not None
    return Cartridge(spec, registry, folder, upcasts)


def _follows_from(problem: str, dropped: dict[str, set[str]]) -> bool:
    """Whether a problem only follows from an entry left out for its own problems (already reported, the cause):
    a handler, upcaster or `personal:` entry of a left-out event type, a step or rule naming a left-out relation."""
    for ev in dropped.get("events", ()):
        if f"for {ev!r}," in problem or f"for {ev!r} from" in problem or \
                problem.startswith(f"personal.{ev}: not an event type"):
            return True
    return any(f"{rel!r} is not a relation of the cartridge" in problem or f"relations.{rel} is not a relation"
               in problem for rel in dropped.get("relations", ()))


_SECTIONS: dict[str, type[BaseModel]] = {"entities": EntitySpec, "relations": RelationSpec, "events": EventSpec,
                                         "rules": RuleSpec, "personal": PersonalSpec}


def _load_spec(folder: Path) -> tuple[CartridgeSpec | None, list[str], dict[str, set[str]]]:
    """(spec, problems, {section: names of entries left out}). With problems, the spec holds the entries that are
    valid on their own (an entry broken in a key nothing else needs, without that key), so that `validate`
    reports every problem in one pass: the cross-checks run on the rest, and what only follows from an entry left
    out is not reported again (`_follows_from`)."""
    if not folder.is_dir():
        return None, [f"{folder}: not a folder (a cartridge is a folder with cartridge.yaml and handlers.py)"], {}
    file = folder / "cartridge.yaml"
    if not file.is_file():
        return None, [f"{file}: missing (a cartridge folder needs cartridge.yaml; handlers.py holds Python handlers)"], {}
    try:
        text = file.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        return None, [f"{file}: cannot be read: {e}"], {}
    loader = CartridgeLoader(text)         # a SafeLoader
    try:
        root = loader.get_single_node()
        doc = None if root is None else loader.construct_document(root)
    except yaml.YAMLError as e:
        return None, [yaml_problem(file, e)], {}
    finally:
        loader.dispose()
    problems = [f"{file}:{slip}" for slip in loader.slips]
    if not isinstance(doc, dict):
        return None, [f"{file}: must be a mapping with name, entities, relations, events, rules, memory"], {}
    try:
        return CartridgeSpec.model_validate(doc), problems, {}      # problems: the slips (left out of doc)
    except ValidationError as e:
        problems += [_schema_problem(file, root, err) for err in e.errors()]
    partial, dropped = _valid_parts(doc)
    return partial, problems, dropped


# the keys of each part of cartridge.yaml, for "unknown key" problems: (the part's path length, section) -> model
_MODELS: dict[tuple[int, str | None], type[BaseModel]] = {
    (1, None): CartridgeSpec, (3, "entities"): EntitySpec, (3, "relations"): RelationSpec, (3, "events"): EventSpec,
    (3, "personal"): PersonalSpec, (2, "memory"): MemorySpec, (2, "limits"): Limits, (2, "history"): HistorySpec,
    (2, "search"): SearchSpec}


def _schema_problem(file: Path, root: yaml.Node, err: Any) -> str:
    """One schema problem: the file and the line of the key it is about, its path, and what is wrong (an unknown
    key with the keys that part takes)."""
    loc = tuple(err["loc"])
    line = line_of(root, loc)
    where = f"{file}:line {line}" if line is not None else str(file)
    path = ".".join(str(p) for p in loc)
    message = err["msg"]
    if err["type"] == "extra_forbidden":
        model = _MODELS.get((len(loc), loc[0] if len(loc) > 1 else None))
        if model is not None:
            keys = sorted(f.alias or name for name, f in model.model_fields.items() if name != "personal_accept_clear")
            message = f"unknown key; this part takes {', '.join(keys)}"
    return f"{where}: {path}: {message}"


# keys other entries depend on: an entry broken in one of them is left out; one broken elsewhere is kept
# without the broken keys (their problem is reported), so that nothing naming it fails as well
_NEEDED = {"entities": frozenset(), "relations": frozenset({"from", "to"}),
           "events": frozenset({"subject", "owner", "payload", "project", "version", "upcast"})}


def _entry(section: str, model: type[BaseModel], entry: Any) -> BaseModel | None:
    """An entry as valid on its own: as written, or without its broken keys (see _NEEDED); None: left out. An
    entity type is always kept (it has no key anything else needs)."""
    try:
        return model.model_validate(entry)
    except ValidationError as e:
        errors = e.errors()
    fallback = EntitySpec() if section == "entities" else None
    needed = _NEEDED.get(section)
    if needed is None or not isinstance(entry, dict):
        return fallback
    broken = {err["loc"][0] for err in errors if err["loc"]}
    if broken & needed or not broken <= set(entry):
        return fallback
    try:
        return model.model_validate({k: v for k, v in entry.items() if k not in broken})
    except ValidationError:
        return fallback


def _valid_parts(doc: dict[str, Any]) -> tuple[CartridgeSpec | None, dict[str, set[str]]]:
    """A spec of the entries of `doc` that are valid on their own (None without a usable name), and the names of
    each section's entries left out."""
    parts: dict[str, Any] = {"name": doc.get("name")}
    dropped: dict[str, set[str]] = {}
    for section, model in _SECTIONS.items():
        entries = doc.get(section)
        if not isinstance(entries, dict):
            continue
        kept = {}
        for name, entry in entries.items():
            if section == "personal" and name == "accept_clear":
                continue
            valid = _entry(section, model, entry)
            if valid is None:
                dropped.setdefault(section, set()).add(name)
            else:
                kept[name] = valid
        parts[section] = kept
    if isinstance(doc.get("sources"), dict):
        parts["sources"] = doc["sources"]          # checked entry by entry by keel.sources
    for section in ("memory", "limits"):
        try:
            CartridgeSpec.model_validate({"name": "x", section: doc.get(section)})
            if section in doc:
                parts[section] = doc[section]
        except ValidationError:
            continue
    try:
        return CartridgeSpec.model_validate(parts), dropped
    except ValidationError:
        return None, dropped


def _load_handlers(folder: Path, name: str) -> tuple[Registry | None, list[str]]:
    file = folder / "handlers.py"
    if not file.is_file():
        return Registry(), []       # every handler is declarative (a missing one is reported by check_spec)
    module_name = f"keel_cartridge_{re.sub(r'[^A-Za-z0-9_]', '_', name)}_{abs(hash(str(file.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - any import failure is a validation problem to report
        sys.modules.pop(module_name, None)
        return None, [f"{file}: cannot import: {type(e).__name__}: {e}"]
    registry = getattr(module, "registry", None)
    if not isinstance(registry, Registry):
        return None, [f"{file}: must define `registry = Registry()` (from keel import Registry)"]
    return registry, []


def register_projections(registry: Registry, projections: dict[str, Any], spec: CartridgeSpec) -> list[str]:
    """Compiled projections join the Python handlers; an event type may have one or the other, not both."""
    problems = []
    handled = set(registry.event_types())
    for event_type in sorted(spec.events):
        if spec.events[event_type].project is not None and event_type in handled:
            problems.append(f"events.{event_type}: has `project:` steps and a Python handler in handlers.py; "
                            "keep one")
    for event_type, handler in projections.items():
        if event_type not in handled:
            registry.on(event_type)(handler)
    return problems


def check_spec(spec: CartridgeSpec, registry: Registry) -> list[str]:
    """The checks of a catalog beyond its schema: names, declared entity types at every end, payload types,
    rules, memory scopes and durations, exactly one handler (or `project:` steps) per event type; one line per
    problem."""
    problems: list[str] = []
    if not NAME.match(spec.name):
        problems.append(f"name {spec.name!r}: use lowercase letters, digits and _")
    entity_types = set(spec.entities)
    for ent in entity_types:
        if not NAME.match(ent):
            problems.append(f"entities.{ent}: use lowercase letters, digits and _")
    for rel, r in spec.relations.items():
        if not NAME.match(rel):
            problems.append(f"relations.{rel}: use lowercase letters, digits and _")
        for end, t in (("from", r.from_), ("to", r.to)):
            problems += [f"relations.{rel}.{end}: {p}" for p in _end_problems(t, spec)]
        if "." in r.from_ and "." in r.to:
            problems.append(f"relations.{rel}: at least one end is an entity type of this cartridge")
    for ev, e in spec.events.items():
        if ev == "keel.annotated" or ev.startswith("keel."):
            problems.append(f"events.{ev}: the keel. prefix is reserved")
        elif not EVENT_NAME.match(ev):
            problems.append(f"events.{ev}: event types look like noun.verb (lowercase, dotted)")
        if e.subject not in entity_types:
            problems.append(f"events.{ev}.subject: {e.subject!r} is not a declared entity type")
        for field, text in e.payload.items():
            words = str(text).split()
            ok = (len(words) == 1 and words[0] in PAYLOAD_TYPES) or (
                len(words) == 2 and words[0] == "optional" and words[1] in PAYLOAD_TYPES)
            if not ok:
                problems.append(f"events.{ev}.payload.{field}: bad type {text!r}; use one of "
                                f"{' '.join(PAYLOAD_TYPES)}, or 'optional <type>'")
    for rule, r in spec.rules.items():
        if r.applies_to not in entity_types:
            problems.append(f"rules.{rule}.applies_to: {r.applies_to!r} is not a declared entity type")
    rules, rule_problems = compile_rules(spec)
    problems += rule_problems
    for rule in rules.values():
        relations = sorted(n for n, r in spec.relations.items() if rule.applies_to in (r.from_, r.to))
        problems += check_names(rule, {"relations": relations})
    for scope, ttl in spec.memory.ttl.items():
        if scope not in SCOPES:
            problems.append(f"memory.ttl.{scope}: unknown scope; scopes are {', '.join(SCOPES)}")
        try:
            parse_duration(ttl)
        except ValueError as e:
            problems.append(f"memory.ttl.{scope}: {e}")
    for scope in spec.memory.requires_evidence:
        if scope not in SCOPES:
            problems.append(f"memory.requires_evidence: unknown scope {scope!r}")
    problems += check_personal(spec)
    problems += compile_sources(spec)[1]          # `sources:` (change data capture) against the catalog
    handled = set(registry.event_types())
    for ev in sorted(set(spec.events) - handled):
        if spec.events[ev].project is None:
            problems.append(f"events.{ev}: no handler (add `project:` steps, or @registry.on({ev!r}) in "
                            "handlers.py)")
    for ev in sorted(handled - set(spec.events)):
        problems.append(f"handlers.py: handler for {ev!r}, which is not an event type of the catalog")
    for ev, count in registry.duplicates().items():
        problems.append(f"handlers.py: {count} handlers for {ev!r}; exactly one is allowed")
    return problems


def _end_problems(end: str, spec: CartridgeSpec) -> list[str]:
    """What is wrong with a relation end: a declared entity type, or another cartridge's as `<cartridge>.<type>`
    (whose plain name the cartridge must not declare itself: its store keeps the other cartridge's ids)."""
    if "." not in end:
        return [] if end in spec.entities else [f"{end!r} is not a declared entity type (or <cartridge>.<type>)"]
    cartridge, _, kind = end.partition(".")
    if not (NAME.match(cartridge) and NAME.match(kind)):
        return [f"{end!r}: another cartridge's type is <cartridge>.<type>, lowercase letters, digits and _"]
    if cartridge == spec.name:
        return [f"{end!r}: name this cartridge's own type without its name ({kind!r})"]
    if kind in spec.entities:
        return [f"{end!r}: this cartridge declares {kind!r} too, so ids of the two could not be told apart"]
    return []


def check_personal(spec: CartridgeSpec) -> list[str]:
    """`personal:` names declared event types and payload fields; `of` is `subject` or a declared payload field
    that is not itself personal (it names whose key encrypts the others); the mask fits each field's type."""
    problems = []
    for ev, p in sorted(spec.personal.items()):
        event = spec.events.get(ev)
        if event is None:
            problems.append(f"personal.{ev}: not an event type of the catalog")
            continue
        fields = event.fields()
        for name in p.fields:
            if name not in fields:
                problems.append(f"personal.{ev}.fields: {name!r} is not a payload field of {ev}")
            elif not _mask_fits(fields[name].type, p.mask):
                problems.append(f"personal.{ev}.mask: {p.mask!r} does not fit the type of "
                                f"payload.{name} ({fields[name].type}); give a mask of that type")
        if len(set(p.fields)) != len(p.fields):
            problems.append(f"personal.{ev}.fields: a field is named twice")
        if p.of != "subject":
            owner = p.subject_field()
            if owner is None or not owner:
                problems.append(f"personal.{ev}.of: {p.of!r}; use subject or payload.<field>")
            elif owner not in fields:
                problems.append(f"personal.{ev}.of: {owner!r} is not a payload field of {ev}")
            elif fields[owner].type != "string" or fields[owner].optional:
                problems.append(f"personal.{ev}.of: payload.{owner} must be a required string (it names the data "
                                f"subject)")
            elif owner in p.fields:
                problems.append(f"personal.{ev}.of: payload.{owner} is personal itself; the field naming the data "
                                f"subject stays in clear (use an id, not personal data)")
    return problems


def _mask_fits(kind: str, value: Any) -> bool:
    """Whether a mask is a value of a payload type (what keel.envelope's payload check would accept)."""
    if kind in ("date", "datetime"):
        if not isinstance(value, str) or (kind == "date" and len(value) != 10):
            return False
        try:
            parse_time(value)
        except BadTime:
            return False
        return True
    plain = {"string": (str,), "number": (int, float), "integer": (int,), "boolean": (bool,), "object": (dict,),
             "array": (list,)}.get(kind, ())
    return isinstance(value, plain) and (kind == "boolean" or not isinstance(value, bool))
