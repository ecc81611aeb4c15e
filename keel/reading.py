"""The graph as the tools read it: entity views, facts, relations and fact history, shaped from a store's
primitive reads (keel.store.roles.StoreReads), the same way over every backend.

Times are given as the tools take them (RFC 3339 text, dates, micros); `at` defaults to now, `known_at` to
"everything recorded". keel/tools.py builds its results on these; docs/semantics.md says what they mean.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .store.roles import StoreReads
from .store.shapes import EntityInfo, EntityView, ViewRequest, fact_order, fact_result, of_relation
from .store.writes import check_entity
from .times import Micros, format_time, now_micros, parse_time


def _when(t: object | None, default: Micros | None) -> Micros | None:
    return default if t is None else parse_time(t)


def exists(reads: StoreReads, tenant: str, entity: str, *, known_at: object | None = None) -> bool:
    """Whether the entity was recorded (by `known_at`, when given)."""
    first = reads.entity_recorded_at(tenant, entity)
    if first is None:
        return False
    k = _when(known_at, None)
    return k is None or first <= k


def views(reads: StoreReads, requests: Iterable[ViewRequest], *, at: object | None = None,
          known_at: object | None = None) -> list[EntityView | None]:
    """`view` of several entities, of one tenant or several, at one `at` and `known_at` (one request where the
    backend has a round trip)."""
    requests = list(requests)
    for r in requests:
        check_entity(r.entity)
    return reads.read_views(requests, now_micros() if at is None else parse_time(at), _when(known_at, None))


def view(reads: StoreReads, tenant: str, entity: str, *, at: object | None = None, known_at: object | None = None,
         scopes: Iterable[str] | None = None, parts: str = "lfr") -> EntityView | None:
    """Labels (l), facts (f) and relations (r) of an entity valid at `at` (default: now) as believed at
    `known_at`; `scopes` limits facts to those scope keys. None if the entity is unknown at `known_at`."""
    return views(reads, [ViewRequest(tenant, entity, scopes, parts)], at=at, known_at=known_at)[0]


def entity_info(reads: StoreReads, tenant: str, entity: str, *, at: object | None = None,
                known_at: object | None = None) -> EntityInfo | None:
    """Type, ref and labels valid at `at` (None if the entity is unknown at `known_at`)."""
    v = view(reads, tenant, entity, at=at, known_at=known_at, parts="l")
    return None if v is None else v.info


def facts(reads: StoreReads, tenant: str, entity: str, *, at: object | None = None, known_at: object | None = None,
          scopes: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Fact versions valid at `at`; `scopes` limits notes to those scope keys ("" = domain facts)."""
    v = view(reads, tenant, entity, at=at, known_at=known_at, scopes=scopes, parts="f")
    return [] if v is None else v.facts


def relations(reads: StoreReads, tenant: str, entity: str, *, rel: str | None = None, at: object | None = None,
              known_at: object | None = None) -> list[dict[str, Any]]:
    """Relation versions valid at `at` with the entity at either end, by (relation, subject, object).
    Adjacent versions of one triple are coalesced: linking again while linked changes nothing visible."""
    v = view(reads, tenant, entity, at=at, known_at=known_at, parts="r")
    return [] if v is None else of_relation(v.relations, rel)


def history(reads: StoreReads, tenant: str, entity: str, *, predicate: str | None = None,
            known_at: object | None = None, scopes: Iterable[str] | None = None) -> list[dict[str, Any]]:
    """Every fact version recorded by `known_at` (closed and superseded ones included) by predicate, then
    valid_from, each with `superseded_at` / `superseded_by` (when and by which event another version
    replaced it at its valid_from; null while it is believed)."""
    check_entity(entity)
    allowed = None if scopes is None else set(scopes)
    keys = sorted((key for key in reads.keys(tenant, entity)
                   if key[0] == "f" and (predicate is None or key[2] == predicate)
                   and (allowed is None or key[3] in allowed)), key=fact_order)
    out: list[dict[str, Any]] = []
    for key, versions in zip(keys, reads.recorded_versions_many(tenant, keys, _when(known_at, None))):
        out.extend({**fact_result(key, v), "superseded_at": format_time(None if by is None else by.recorded_at),
                    "superseded_by": None if by is None else by.evidence} for v, by in versions)
    return out
