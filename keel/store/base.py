"""The store contract: the write primitives handlers call and the reads tools make, once for all backends.

A backend implements a handful of primitives over *timelines* (see keel.timeline): apply a list of
writes atomically, list an entity's timeline keys, and answer as-of / all-versions questions for keys.
Everything the graph promises (provenance, corrections, both time axes, result shapes: docs/semantics.md) is
built here on top of those primitives, so every backend behaves the same and one contract suite
(tests/support/store_contract.py) checks them all.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from ..timeline import (
    Assertion,
    Version,
    coalesce,
    covering,
)
from ..times import Micros, format_time, now_micros, parse_time
from .writes import (  # noqa: F401 - the write vocabulary, re-exported with the contract that applies it
    REF_LABEL,
    EventId,
    Key,
    Write,
    check_entity,
    checked_label_writes,
    event_key,
    fact_write,
    label_writes,
    new_write,
    relation_write,
    scope_key,
)

GLOBAL_TENANT = "_global"   # where cross-tenant (global) notes live; not a valid tenant name

# The batch contract's shapes (see Store.commit_batch):
EventWrites = tuple[list[Write], str | None]   # one event's writes and its id (None: not idempotent)
# (topic, partition, offset of the last record applied[, the partition's log end when known: the lag
#  [, held: the tenant's applied offset on that partition as the writer last saw it stored, or None]])
# A step whose `held` is greater than what the store holds (absent counts as less) is refused whole with
# keel.errors.StateBehind: the store lost writes the writer saw land (see Store.commit_batch).
Position = (tuple[str, int, int] | tuple[str, int, int, int | None]
            | tuple[str, int, int, int | None, int | None])
PartitionOffsets = dict[tuple[str, int], int]    # (topic, partition) -> offset of the last record applied


def went_back(stored: int | None, held: int | None) -> bool:
    """Whether a store holding `stored` lost what a writer saw it hold (`held`; None: the writer saw nothing).
    The rule of StateBehind in Python (the Lua one: keel/store/redis/scripts.py, _STEP_HELD and ADVANCE)."""
    return held is not None and (stored is None or stored < held)
BatchStep = tuple[str, Sequence[EventWrites], Position | None]   # (tenant, events, position)
# What a worker's mirror reads of a tenant first: applied event ids (sorted), applied offsets of the asked
# (topic, partition)s, event marks, latest recorded_at (see Store.tenant_starts).
TenantStart = tuple[list[str], dict[tuple[str, int], "int | None"], dict[str, str], "Micros | None"]


class ChangeEntry(NamedTuple):
    """One write of a tenant's change log (Store.changes): its position in apply order, key and assertion."""
    position: int
    key: Key
    assertion: Assertion


class ChangePage(NamedTuple):
    """A run of a tenant's change log read in one atomic step: the generation read, the position of its first
    entry, the entries, the log's length then, and the tenant's known_through then."""
    generation: int
    start: int
    entries: list[ChangeEntry]
    length: int
    known_through: Micros | None
    windows: dict[int, Window] | None = None    # by position: the windows Store.change_page read with the entries


class Window(NamedTuple):
    """A timeline around a point (Store.windows_many, Store.change_page). `whole`: `assertions` is the whole
    timeline. Else they are the assertions at the point (every one, or, around a change, those listed up to it
    from the last one before it: that one decides what held there before) and the last ones (in log order) of
    some points before it, by point then log order; `low` is the lowest of those points when anything at or
    below it that could decide a row was left out (None: nothing), and `next_point` the first point after the
    point whose winner now is no void (None: none)."""
    assertions: list[Assertion]
    low: Micros | None
    next_point: Micros | None
    whole: bool


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
    """One entity view of `Store.views`: what `view` takes besides the times."""
    tenant: str
    entity: str
    scopes: Iterable[str] | None = None
    parts: str = "lfr"


def entities_of(key: Key) -> tuple[str, ...]:
    """The entities a timeline key involves (both ends for a relation)."""
    return (key[1], key[3]) if key[0] == "r" else (key[1],)


def scope_of(key_scope: str) -> str | None:
    return key_scope.partition(":")[0] or None


def _when(t: object | None, default: Micros | None) -> Micros | None:
    return default if t is None else parse_time(t)


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


def _fact_order(key: Key) -> tuple[str, int, str]:
    return (key[2], _SCOPE_RANK.get(scope_of(key[3]), 9), key[3])


_SCOPE_RANK = {None: 0, "global": 1, "tenant": 2, "task": 3, "agent": 4}


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
    facts.sort(key=lambda kv: _fact_order(kv[0]))
    rels = sorted(((key, v) for key, v in relations if v is not None), key=lambda kv: (kv[0][2], kv[0][1], kv[0][3]))
    info = EntityInfo(entity, entity.partition(":")[0], ref, dict(sorted(labels.items())))
    return EntityView(info, [fact_result(key, v) for key, v in facts], [relation_result(key, v) for key, v in rels])


def of_relation(relations: list[dict[str, Any]], rel: str | None) -> list[dict[str, Any]]:
    """The relation results named `rel` (all of them when None)."""
    return relations if rel is None else [r for r in relations if r["relation"] == rel]


class Store(ABC):
    """A per-tenant bitemporal graph. Subclasses implement the primitives marked abstract."""

    # ---- primitives ------------------------------------------------------------------------

    @abstractmethod
    def apply_writes(self, tenant: str, writes: list[Write], event_id: str | None = None) -> None:
        """Apply writes in order, atomically, and (when given) mark event_id applied in the same step.
        When event_id was applied before, nothing is written (idempotent on the event id)."""

    @abstractmethod
    def has_event(self, tenant: str, event_id: str) -> bool:
        """Whether an event id was applied for this tenant (the idempotency and evidence check)."""

    @abstractmethod
    def entity_recorded_at(self, tenant: str, entity: str) -> Micros | None:
        """When the entity was first written (min recorded_at of its writes), None if unknown."""

    @abstractmethod
    def keys(self, tenant: str, entity: str) -> list[Key]:
        """Every timeline key involving the entity, in a stable order (the order is the backend's: callers that
        show or compare keys sort them)."""


    @abstractmethod
    def versions_many(self, tenant: str, keys: list[Key], known_at: Micros | None) -> list[list[Version]]:
        """Every version of each key believed at `known_at`, by valid_from."""

    @abstractmethod
    def recorded_versions_many(self, tenant: str, keys: list[Key], known_at: Micros | None
                               ) -> list[list[tuple[Version, Assertion | None]]]:
        """Every version of each key recorded by `known_at`, with what superseded it (Timeline.recorded_versions)."""

    @abstractmethod
    def tenants(self) -> list[str]:
        """Tenants with at least one write or applied event, sorted (includes the global-notes graph)."""

    @abstractmethod
    def dump(self, tenant: str) -> Iterator[tuple[Key, list[Assertion]]]:
        """Every timeline of a tenant with all its assertions (by point, then log order), keys sorted."""

    @abstractmethod
    def event_ids(self, tenant: str) -> list[str]:
        """Applied event ids of a tenant, sorted."""

    def has_tenant(self, tenant: str) -> bool:
        """Whether the tenant has any write or applied event (is in `tenants`)."""
        return tenant in self.tenants()

    @abstractmethod
    def freshness(self, tenant: str) -> Freshness:
        """The tenant's Freshness (known_through, lag) as the last applied write left it."""

    def event_mark(self, tenant: str, event_id: str) -> str | None:
        """The mark kept with an applied event id (`<content hash> <where first seen>`), None if none."""
        return None

    def event_marks(self, tenant: str) -> dict[str, str]:
        """Every applied event id's mark (what a worker's mirror loads instead of the graph)."""
        return {}

    def latest_recorded(self, tenant: str) -> Micros | None:
        """The latest recorded_at of the tenant's applied events (None before the first): recorded_at
        never goes backwards within a tenant's log."""
        return None

    def as_of_many(self, tenant: str, keys: list[Key], at: Micros,
                   known_at: Micros | None) -> list[Version | None]:
        """The version of each key valid at `at`, believed at `known_at`: the one covering `at` among all its
        versions (a backend may bisect its timelines instead)."""
        return [covering(versions, at) for versions in self.versions_many(tenant, keys, known_at)]

    def recorded_many(self, tenant: str, entities: list[str]) -> list[Micros | None]:
        """`entity_recorded_at` of several entities; one request where possible."""
        return [self.entity_recorded_at(tenant, e) for e in entities]

    def index(self, tenant: str, entity: str) -> tuple[Micros, list[Key]] | None:
        """(first recorded_at, timeline keys) of an entity, or None when unknown; one request where possible."""
        first = self.entity_recorded_at(tenant, entity)
        return None if first is None else (first, self.keys(tenant, entity))

    def runs_many(self, tenant: str, keys: list[Key], known_at: Micros | None) -> list[list[Version]]:
        """Coalesced versions of each key (relations); backends may cache them."""
        return [coalesce(v) for v in self.versions_many(tenant, keys, known_at)]

    def entity_indexes(self, tenant: str, type: str | None = None) -> Iterator[tuple[str, Micros, list[Key]]]:
        """(entity, first recorded_at, timeline keys) of every entity of a tenant (of one type when given),
        by entity; a whole-tenant walk that backends may answer from their own index."""
        keys: dict[str, list[Key]] = {}
        first: dict[str, Micros] = {}
        for key, assertions in self.dump(tenant):
            recorded = min(a.recorded_at for a in assertions)
            for e in entities_of(key):
                if type is None or e.partition(":")[0] == type:
                    keys.setdefault(e, []).append(key)
                    first[e] = min(first.get(e, recorded), recorded)
        for entity in sorted(keys):
            yield entity, first[entity], keys[entity]

    def assertions_many(self, tenant: str, keys: list[Key]) -> list[list[Assertion]]:
        """Every assertion of each key (by point, then log order), corrected ones included."""
        wanted = set(keys)
        found = {key: assertions for key, assertions in self.dump(tenant) if key in wanted}
        return [found.get(key, []) for key in keys]

    def search_entities(self, tenant: str) -> Iterator[tuple[str, Micros, list[tuple[Key, list[Assertion]]]]]:
        """What the search index is built from: each entity, its first recorded_at, and the whole timelines of
        its labels and notes (keys of scope other than domain facts)."""
        batch: list[tuple[str, Micros, list[Key]]] = []

        def flush() -> Iterator[tuple[str, Micros, list[tuple[Key, list[Assertion]]]]]:
            wanted = [k for _, _, keys in batch for k in keys]
            found = dict(zip(wanted, self.assertions_many(tenant, wanted))) if wanted else {}
            for entity, first, keys in batch:
                yield entity, first, [(k, found[k]) for k in keys]
            batch.clear()

        for entity, first, keys in self.entity_indexes(tenant):
            batch.append((entity, first, [k for k in keys if k[1] == entity and (
                k[0] in "le" or (k[0] == "f" and k[3]))]))
            if len(batch) >= 500:
                yield from flush()
        yield from flush()

    def search_version(self, tenant: str) -> object:
        """A token that changes whenever the tenant's searchable content may have changed."""
        return None

    def changes(self, tenant: str, *, start: int | None = None, since: Micros | None = None,
                generation: int | None = None, count: int) -> ChangePage:
        """Up to `count` entries of the tenant's change log (every write applied, in apply order: recorded order),
        from position `start` of `generation`, or, when `start` is None or `generation` is not the current one,
        from the first entry recorded after `since` (None: the first), with the log's length and the tenant's
        known_through read in the same atomic step (keel/changes.py)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no change log")

    def change_page(self, tenant: str, *, start: int | None = None, since: Micros | None = None,
                    generation: int | None = None, count: int, window: int = 0,
                    keep: Callable[[Key], bool] | None = None) -> ChangePage:
        """`changes`, and, from backends that read them together (`windows` of the page, by position), the window
        (`windows_many`'s, of size `window`) of each entry whose key `keep` accepts (asked once per entry, in log
        order). This default reads no window: keel/changes.py then asks `windows_many`."""
        return self.changes(tenant, start=start, since=since, generation=generation, count=count)

    def windows_many(self, tenant: str, items: list[tuple[Key, Micros]], size: int) -> list[Window]:
        """For each (key, point): the timeline around the point (keel/changes.py reads a change's neighbourhood,
        not its whole timeline; `size` bounds what a backend reads before the point). This default reads whole
        timelines; backends may cut the read."""
        keys = sorted({key for key, _ in items})
        found = dict(zip(keys, self.assertions_many(tenant, keys))) if keys else {}
        return [Window(found[key], None, None, True) for key, _ in items]

    def resting_on(self, tenant: str, event_id: str) -> list[tuple[Key, list[Assertion]]]:
        """The domain timelines (labels, facts without scope, relations) holding an assertion whose evidence
        is `event_id`, with all their assertions: what a correction or retraction of that event supersedes.
        A walk over the tenant (corrections are rare); backends may index it."""
        return [(key, assertions) for key, assertions in self.dump(tenant)
                if (key[0] != "f" or key[3] == "") and any(a.evidence == event_id for a in assertions)]

    def close(self) -> None:
        """Release connections."""

    # ---- the batch contract: what a stream worker needs of a store ------------------------------

    @abstractmethod
    def commit_batch(self, tenant: str, events: Sequence[EventWrites], position: Position | None) -> None:
        """Apply several events, mark their ids and store the applied offset, in one atomic step.

        `position` is (topic, partition, offset of the last record of the batch[, log end[, held]]). Events
        whose id was already applied (before, or earlier in this batch) are skipped whole, so committing a
        batch again changes nothing. The stored offset only moves forward. When `held` is given and the
        stored offset is absent or below it, nothing is written and StateBehind is raised."""

    @abstractmethod
    def advance_partitions(self, through: PartitionOffsets, held: dict[tuple[str, int], int | None]) -> None:
        """Record that every record of each (topic, partition) up to `through[tp]` is applied (the partition's
        applied watermark: where a worker resumes). Only moves forward. Called after a batch's tenant steps
        are all written. When `held[tp]` (the watermark this writer last saw stored) is above what the store
        holds (absent counts as below), nothing is written and StateBehind is raised for that partition."""

    @abstractmethod
    def partitions_applied(self, topic: str, partitions: Iterable[int]) -> dict[int, int | None]:
        """The applied watermark of each partition of `topic` (None: none stored)."""

    @abstractmethod
    def holds_data(self) -> bool:
        """Whether the namespace holds anything at all (a tenant, a watermark): a worker that finds committed
        Kafka offsets but a store holding nothing knows the store lost everything, and re-applies the log."""

    @abstractmethod
    def predates_watermarks(self) -> bool:
        """Whether the namespace holds data written before this store kept applied watermarks: only then may a
        partition without a watermark have records applied, and a worker resumes it from the Kafka commit. In
        any other namespace a partition without a watermark holds nothing (a lagging replica may even hold
        some of a batch's steps but not its watermark: re-applying them is harmless, skipping them is not)."""

    @abstractmethod
    def applied_offset(self, tenant: str, topic: str, partition: int) -> int | None:
        """The offset stored by the last commit_batch for (topic, partition) of the tenant, or None."""

    def tenant_starts(self, wanted: Sequence[tuple[str, Iterable[tuple[str, int]]]]) -> list[TenantStart]:
        """For each (tenant, its (topic, partition)s): event_ids, the applied offsets, event_marks and
        latest_recorded, as one TenantStart. A worker loads hundreds of tenants at its start and after a
        rebalance; backends with a round trip read many tenants in one (RedisStore)."""
        return [(self.event_ids(t), {tp: self.applied_offset(t, *tp) for tp in tps}, self.event_marks(t),
                 self.latest_recorded(t)) for t, tps in wanted]

    def commit_many(self, steps: Sequence[BatchStep]) -> None:
        """Several `commit_batch` steps (e.g. the tenants of one poll); each is atomic on its own, steps of
        different tenants are not atomic together. Backends with a round trip send them together."""
        for tenant, events, position in steps:
            self.commit_batch(tenant, events, position)

    # ---- the write primitives handlers call (docs/cartridges.md) --------------------------------

    def upsert_entity(self, tenant: str, type: str, id: str, *, ref: str | None = None,
                      valid_from: object, source: str | None = None, evidence: str | None = None,
                      recorded_at: object | None = None, by: str | None = None, **labels: Any) -> None:
        self.apply_writes(tenant, label_writes(f"{type}:{id}", ref, labels, valid_from=valid_from,
                                               source=source, evidence=evidence, recorded_at=recorded_at, by=by))

    def link(self, tenant: str, subject: str, relation: str, object: str, valid_from: object, *,
             source: str | None = None, evidence: str | None = None, recorded_at: object | None = None,
             by: str | None = None) -> None:
        self.apply_writes(tenant, [relation_write(subject, relation, object, valid_from, False, source=source,
                                                  evidence=evidence, recorded_at=recorded_at, by=by)])

    def unlink(self, tenant: str, subject: str, relation: str, object: str, valid_to: object, *,
               source: str | None = None, evidence: str | None = None, recorded_at: object | None = None,
               by: str | None = None) -> None:
        self.apply_writes(tenant, [relation_write(subject, relation, object, valid_to, True, source=source,
                                                  evidence=evidence, recorded_at=recorded_at, by=by)])

    def open_fact(self, tenant: str, subject: str, predicate: str, value: Any, *, valid_from: object,
                  source: str | None = None, evidence: str | None = None, recorded_at: object | None = None,
                  by: str | None = None, scope: str | None = None, owner: str | None = None,
                  expires_at: object | None = None) -> None:
        self.apply_writes(tenant, [fact_write(subject, predicate, value, valid_from, False, source=source,
                                              evidence=evidence, recorded_at=recorded_at, by=by, scope=scope,
                                              owner=owner, expires_at=expires_at)])

    def close_fact(self, tenant: str, subject: str, predicate: str, *, valid_to: object,
                   source: str | None = None, evidence: str | None = None, recorded_at: object | None = None,
                   by: str | None = None, scope: str | None = None, owner: str | None = None) -> None:
        self.apply_writes(tenant, [fact_write(subject, predicate, None, valid_to, True, source=source,
                                              evidence=evidence, recorded_at=recorded_at, by=by, scope=scope,
                                              owner=owner)])

    # ---- reads ------------------------------------------------------------------------------

    def exists(self, tenant: str, entity: str, *, known_at: object | None = None) -> bool:
        first = self.entity_recorded_at(tenant, entity)
        if first is None:
            return False
        k = _when(known_at, None)
        return k is None or first <= k

    def view(self, tenant: str, entity: str, *, at: object | None = None, known_at: object | None = None,
             scopes: Iterable[str] | None = None, parts: str = "lfr") -> EntityView | None:
        """Labels (l), facts (f) and relations (r) of an entity valid at `at` (default: now) as believed at
        `known_at`; `scopes` limits facts to those scope keys. None if the entity is unknown at `known_at`."""
        return self.views([ViewRequest(tenant, entity, scopes, parts)], at=at, known_at=known_at)[0]

    def views(self, requests: Iterable[ViewRequest], *, at: object | None = None,
              known_at: object | None = None) -> list[EntityView | None]:
        """`view` of several entities, of one tenant or several, at one `at` and `known_at`."""
        requests = list(requests)
        for r in requests:
            check_entity(r.entity)
        return self.read_views(requests, _when(at, now_micros()), _when(known_at, None))

    def read_views(self, requests: list[ViewRequest], at: Micros, known_at: Micros | None) -> list[EntityView | None]:
        """The views of checked requests at parsed times: one key listing and one batched read per kind
        and request. Backends with a network round trip may answer them all in one request."""
        return [self._read_view(r, at, known_at) for r in requests]

    def _read_view(self, r: ViewRequest, t: Micros, k: Micros | None) -> EntityView | None:
        index = self.index(r.tenant, r.entity)
        if index is None or (k is not None and index[0] > k):
            return None
        point_keys, rel_keys = select_keys(index[1], r.scopes, r.parts)
        points = zip(point_keys, self.as_of_many(r.tenant, point_keys, t, k) if point_keys else [])
        runs = self.runs_many(r.tenant, rel_keys, k) if rel_keys else []
        view = entity_view(r.entity, points, ((key, covering(v, t)) for key, v in zip(rel_keys, runs)))
        return view._replace(freshness=self.freshness(r.tenant))

    def entity(self, tenant: str, entity: str, *, at: object | None = None,
               known_at: object | None = None) -> EntityInfo | None:
        """Type, ref and labels valid at `at` (None if the entity is unknown at `known_at`)."""
        v = self.view(tenant, entity, at=at, known_at=known_at, parts="l")
        return None if v is None else v.info

    def facts(self, tenant: str, entity: str, *, at: object | None = None, known_at: object | None = None,
              scopes: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Fact versions valid at `at`; `scopes` limits notes to those scope keys ("" = domain facts)."""
        v = self.view(tenant, entity, at=at, known_at=known_at, scopes=scopes, parts="f")
        return [] if v is None else v.facts

    def relations(self, tenant: str, entity: str, *, rel: str | None = None, at: object | None = None,
                  known_at: object | None = None) -> list[dict[str, Any]]:
        """Relation versions valid at `at` with the entity at either end, by (relation, subject, object).
        Adjacent versions of one triple are coalesced: linking again while linked changes nothing visible."""
        v = self.view(tenant, entity, at=at, known_at=known_at, parts="r")
        return [] if v is None else of_relation(v.relations, rel)

    def history(self, tenant: str, entity: str, *, predicate: str | None = None,
                known_at: object | None = None, scopes: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Every fact version recorded by `known_at` (closed and superseded ones included) by predicate, then
        valid_from, each with `superseded_at` / `superseded_by` (when and by which event another version
        replaced it at its valid_from; null while it is believed)."""
        check_entity(entity)
        allowed = None if scopes is None else set(scopes)
        keys = sorted((key for key in self.keys(tenant, entity)
                       if key[0] == "f" and (predicate is None or key[2] == predicate)
                       and (allowed is None or key[3] in allowed)), key=_fact_order)
        out = []
        for key, versions in zip(keys, self.recorded_versions_many(tenant, keys, _when(known_at, None))):
            out.extend({**fact_result(key, v), "superseded_at": format_time(None if by is None else by.recorded_at),
                        "superseded_by": None if by is None else by.evidence} for v, by in versions)
        return out
