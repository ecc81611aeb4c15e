"""What a store's view reads are shaped into: an entity view (identity, labels, facts, relations) and the result
objects of a fact or relation version, built from versions a backend read.

These are the shapes `StoreReads.read_views` answers with (every backend builds them the same way, here), and
that keel/reading.py (the tool-result reads: view, facts, relations, history) hands to keel/tools.py.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from ..timeline import Version
from ..times import Micros, format_time
from .writes import REF_LABEL, Key


class EntityInfo(NamedTuple):
    entity: str
    type: str
    ref: str | None
    labels: dict[str, Any]


class Freshness(NamedTuple):
    """How current a tenant's graph is: the latest recorded_at among the writes applied (None before any),
    and, where workers apply a log, how many records of the tenant's partition were not applied yet when
    they last committed (None where unknown or not applicable)."""
    known_through: Micros | None = None
    lag: int | None = None


class EntityView(NamedTuple):
    """What `context` shows of an entity: identity and labels, facts, relations (result objects), and
    the tenant's freshness (read in the same request where the backend has a round trip)."""
    info: EntityInfo
    facts: list[dict[str, Any]]
    relations: list[dict[str, Any]]
    freshness: Freshness | None = None


class ViewRequest(NamedTuple):
    """One entity view of `StoreReads.read_views` (keel.reading.views): what a view takes besides the times."""
    tenant: str
    entity: str
    scopes: Iterable[str] | None = None
    parts: str = "lfr"


def entities_of(key: Key) -> tuple[str, ...]:
    """The entities a timeline key involves (both ends for a relation)."""
    return (key[1], key[3]) if key[0] == "r" else (key[1],)


def scope_of(key_scope: str) -> str | None:
    return key_scope.partition(":")[0] or None


def fact_result(key: Key, v: Version) -> dict[str, Any]:
    """One fact version as the tools show it: predicate, value, valid_from/valid_to, recorded_at, source,
    evidence, scope and by."""
    a = v.assertion
    return {"predicate": key[2], "value": a.value, "valid_from": format_time(a.point),
            "valid_to": format_time(v.valid_to), "recorded_at": format_time(a.recorded_at),
            "source": a.source, "evidence": a.evidence, "scope": scope_of(key[3]), "by": a.by,
            "expires_at": format_time(a.expires_at), "corrected_by": v.corrected_by}


def relation_result(key: Key, v: Version) -> dict[str, Any]:
    return {"subject": key[1], "relation": key[2], "object": key[3],
            "valid_from": format_time(v.assertion.point), "valid_to": format_time(v.valid_to)}


_SCOPE_RANK = {None: 0, "global": 1, "tenant": 2, "task": 3, "agent": 4}


def fact_order(key: Key) -> tuple[str, int, str]:
    """How facts are listed: by predicate, then scope (domain facts first), then scope key."""
    return (key[2], _SCOPE_RANK.get(scope_of(key[3]), 9), key[3])


def select_keys(keys: Iterable[Key], scopes: Iterable[str] | None, parts: str) -> tuple[list[Key], list[Key]]:
    """(label and fact keys, relation keys) of an entity's keys that a view of `parts` and `scopes` reads."""
    allowed = None if scopes is None else set(scopes)
    point_keys, rel_keys = [], []
    for key in keys:
        kind = key[0]
        if (kind == "l" and "l" in parts) or (kind == "f" and "f" in parts and (allowed is None or key[3] in allowed)):
            point_keys.append(key)
        elif kind == "r" and "r" in parts:
            rel_keys.append(key)
    return point_keys, rel_keys


def entity_view(entity: str, points: Iterable[tuple[Key, Version | None]],
                relations: Iterable[tuple[Key, Version | None]]) -> EntityView:
    """An EntityView from the versions at `at` of label and fact keys and the covering (coalesced)
    versions of relation keys, given in any order; None versions are left out."""
    labels: dict[str, Any] = {}
    ref = None
    facts: list[tuple[Key, Version]] = []
    for key, v in points:
        if v is None:
            continue
        if key[0] == "f":
            facts.append((key, v))
        elif key[2] == REF_LABEL:
            ref = v.assertion.value
        else:
            labels[key[2]] = v.assertion.value
    facts.sort(key=lambda kv: fact_order(kv[0]))
    rels = sorted(((key, v) for key, v in relations if v is not None), key=lambda kv: (kv[0][2], kv[0][1], kv[0][3]))
    info = EntityInfo(entity, entity.partition(":")[0], ref, dict(sorted(labels.items())))
    return EntityView(info, [fact_result(key, v) for key, v in facts], [relation_result(key, v) for key, v in rels])


def of_relation(relations: list[dict[str, Any]], rel: str | None) -> list[dict[str, Any]]:
    """The relation results named `rel` (all of them when None)."""
    return relations if rel is None else [r for r in relations if r["relation"] == rel]
