"""The write vocabulary every store shares: timeline keys, writes, event ids, and the builders of the writes
the handler API makes (`upsert_entity`, `link`, `unlink`, `open_fact`, `close_fact`); the projector and the
compiled projections call the builders directly on their hot path. The store contract (base.py) applies them.
"""
from __future__ import annotations

from typing import Any, NamedTuple

from ..errors import UsageError
from ..identifiers import ENTITY
from ..timeline import Assertion, new_assertion
from ..times import Micros, parse_time

_tuple_new = tuple.__new__
REF_LABEL = "ref"           # the entity's pointer is kept as a label timeline under this name

# Timeline keys (tuples of strings):
#   ("e", entity)                        existence marker of an upsert without labels
#   ("l", entity, label)                 entity label (and REF_LABEL)
#   ("f", entity, predicate, scope_key)  fact; scope_key "" for domain facts, else tenant | task:<id> | agent:<id> | global
#   ("r", subject, relation, object)     relation triple
Key = tuple[str, ...]


class Write(NamedTuple):
    key: Key
    assertion: Assertion


class EventId(str):
    """An event id with what a store keeps next to it: `mark` (`<content hash> <where first seen>`, the
    idempotency check) and `recorded_at` (the tenant's latest recorded_at follows it). It is a str, so it
    travels wherever an event id goes (mirrors, batches, replay steps) and each store keeps the mark in the
    same atomic step as the id; a plain str id carries neither."""
    mark: str | None = None
    recorded_at: Micros | None = None


def event_key(event_id: str, mark: str | None, recorded_at: Micros | None) -> EventId:
    key = EventId(event_id)
    key.mark, key.recorded_at = mark, recorded_at
    return key


def new_write(key: Key, assertion: Assertion) -> Write:
    """`Write(key, assertion)` without the NamedTuple's Python-level __new__ (hot path: a write per call)."""
    return _tuple_new(Write, (key, assertion))


def scope_key(scope: str | None, owner: str | None = None) -> str:
    """Timeline scope key of a fact: "" for domain facts, `task:<id>` / `agent:<id>` for private notes."""
    if scope is None:
        return ""
    if scope in ("task", "agent"):
        if not owner:
            raise UsageError(f"a {scope}-scope fact needs its {scope} id")
        return f"{scope}:{owner}"
    return scope


def check_entity(entity: str) -> str:
    if not isinstance(entity, str) or not ENTITY.fullmatch(entity):
        raise UsageError(f"bad entity {entity!r}: use '<entity type>:<id>' with id matching "
                         f"[A-Za-z0-9][A-Za-z0-9._@-]{{0,127}}")
    return entity


def _recorded(recorded_at: object | None, point: Micros) -> Micros:
    return point if recorded_at is None else parse_time(recorded_at)


def label_writes(entity: str, ref: str | None, labels: dict[str, Any], *, valid_from: object,
                 source: str | None, evidence: str | None, recorded_at: object | None,
                 by: str | None) -> list[Write]:
    """Writes of upsert_entity: one label timeline per label (and the ref)."""
    check_entity(entity)
    point = parse_time(valid_from)
    return checked_label_writes(entity, ref, labels, point, source, evidence, _recorded(recorded_at, point), by)


def checked_label_writes(entity: str, ref: str | None, labels: dict[str, Any], point: Micros,
                         source: str | None, evidence: str | None, recorded_at: Micros,
                         by: str | None) -> list[Write]:
    """`label_writes` for an entity already checked and times already parsed (the projector's hot path)."""
    items = sorted(labels.items()) if len(labels) > 1 else list(labels.items())
    if ref is not None:
        items.insert(0, (REF_LABEL, ref))
    if not items:   # an upsert without labels still makes the entity exist
        return [new_write(("e", entity), new_assertion(point, True, False, source, evidence, recorded_at, by))]
    return [_tuple_new(Write, (("l", entity, name), _tuple_new(Assertion, (
                point, value, False, source, evidence, recorded_at, by, None))))
            for name, value in items]


def relation_write(subject: str, relation: str, object: str, when: object, closed: bool, *,
                   source: str | None, evidence: str | None, recorded_at: object | None,
                   by: str | None) -> Write:
    check_entity(subject)
    check_entity(object)
    point = parse_time(when)
    return new_write(("r", subject, relation, object),
                     new_assertion(point, None if closed else True, closed, source, evidence,
                                   _recorded(recorded_at, point), by))


def fact_write(subject: str, predicate: str, value: Any, when: object, closed: bool, *,
               source: str | None, evidence: str | None, recorded_at: object | None, by: str | None,
               scope: str | None = None, owner: str | None = None, expires_at: object | None = None) -> Write:
    check_entity(subject)
    point = parse_time(when)
    return new_write(("f", subject, predicate, scope_key(scope, owner)),
                     new_assertion(point, None if closed else value, closed, source, evidence,
                                   _recorded(recorded_at, point), by,
                                   None if expires_at is None else parse_time(expires_at)))

