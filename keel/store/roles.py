"""The store contract's three roles, each small, each what one kind of caller needs of a store:

    StoreReads     the primitive reads of a tenant's graph (timelines, indexes, the change log, freshness):
                   what tools, notes, search and the change feed read (keel/reading.py shapes them)
    BatchWrites    writes and their positions: apply_writes, commit_batch / commit_many with offsets, the
                   partitions' applied watermarks and what a worker reads of its own progress (applied ids,
                   offsets, marks): what the stream workers need
    StoreAdmin     the namespace as a whole: its tenants, whether it holds anything, whether it predates
                   watermarks, closing it

`keel.store.base.Store` is their composition, which every backend (MemoryStore, RedisStore)
implements. A backend implements the abstract primitives; the defaults here build the rest on them, so every
backend behaves the same; one contract suite per role (tests/support/reads_contract.py, batch_contract.py,
admin_contract.py) checks each role over every backend.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple

from ..timeline import Assertion, Version, coalesce, covering
from ..times import Micros
from .shapes import EntityView, Freshness, ViewRequest, entities_of, entity_view, select_keys
from .writes import Key, Write

# ---- the batch contract's shapes (see BatchWrites.commit_batch) ------------------------------------------

EventWrites = tuple[list[Write], str | None]   # one event's writes and its id (None: not idempotent)
# (topic, partition, offset of the last record applied[, the partition's log end when known: the lag
#  [, held: the tenant's applied offset on that partition as the writer last saw it stored, or None]])
# A step whose `held` is greater than what the store holds (absent counts as less) is refused whole with
# keel.errors.StateBehind: the store lost writes the writer saw land (see BatchWrites.commit_batch).
Position = (tuple[str, int, int] | tuple[str, int, int, int | None]
            | tuple[str, int, int, int | None, int | None])
PartitionOffsets = dict[tuple[str, int], int]    # (topic, partition) -> offset of the last record applied
BatchStep = tuple[str, Sequence[EventWrites], Position | None]   # (tenant, events, position)
# What a worker's mirror reads of a tenant first: applied event ids (sorted), applied offsets of the asked
# (topic, partition)s, event marks, latest recorded_at (see BatchWrites.tenant_starts).
TenantStart = tuple[list[str], dict[tuple[str, int], "int | None"], dict[str, str], "Micros | None"]


def went_back(stored: int | None, held: int | None) -> bool:
    """Whether a store holding `stored` lost what a writer saw it hold (`held`; None: the writer saw nothing).
    The rule of StateBehind in Python (the Lua one: keel/store/redis/lua.py, STEP_HELD and ADVANCE)."""
    return held is not None and (stored is None or stored < held)


# ---- the change log's shapes (see StoreReads.changes) ----------------------------------------------------

class ChangeEntry(NamedTuple):
    """One write of a tenant's change log (StoreReads.changes): its position in apply order, key and assertion."""
    position: int
    key: Key
    assertion: Assertion


class Window(NamedTuple):
    """A timeline around a point (StoreReads.windows_many, StoreReads.change_page). `whole`: `assertions` is the
    whole timeline. Else they are the assertions at the point (every one, or, around a change, those listed up
    to it from the last one before it: that one decides what held there before) and the last ones (in log
    order) of some points before it, by point then log order; `low` is the lowest of those points when anything
    at or below it that could decide a row was left out (None: nothing), and `next_point` the first point after
    the point whose winner now is no void (None: none)."""
    assertions: list[Assertion]
    low: Micros | None
    next_point: Micros | None
    whole: bool


class ChangePage(NamedTuple):
    """A run of a tenant's change log read in one atomic step: the generation read, the position of its first
    entry, the entries, the log's length then, and the tenant's known_through then."""
    generation: int
    start: int
    entries: list[ChangeEntry]
    length: int
    known_through: Micros | None
    windows: dict[int, Window] | None = None    # by position: the windows change_page read with the entries


class StoreReads(ABC):
    """The primitive reads of a per-tenant bitemporal graph. Subclasses implement the abstract ones."""

    @abstractmethod
    def has_event(self, tenant: str, event_id: str) -> bool:
        """Whether an event id was applied for this tenant (the idempotency and evidence check)."""

    @abstractmethod
    def has_tenant(self, tenant: str) -> bool:
        """Whether the tenant has any write or applied event (is in StoreAdmin.tenants)."""

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
    def dump(self, tenant: str) -> Iterator[tuple[Key, list[Assertion]]]:
        """Every timeline of a tenant with all its assertions (by point, then log order), keys sorted: the
        whole-tenant walk the defaults below fall back to (digests and rule checks read it too)."""

    @abstractmethod
    def freshness(self, tenant: str) -> Freshness:
        """The tenant's Freshness (known_through, lag) as the last applied write left it."""

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

    def read_views(self, requests: list[ViewRequest], at: Micros, known_at: Micros | None) -> list[EntityView | None]:
        """The views of checked requests at parsed times (keel.reading.views checks and parses them): one key
        listing and one batched read per kind and request. None for an entity unknown at `known_at`. Backends
        with a network round trip may answer them all in one request."""
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


class BatchWrites(ABC):
    """Writes and where they stand: what a stream worker (workers/applier.py, mirror.py) needs of a store."""

    @abstractmethod
    def apply_writes(self, tenant: str, writes: list[Write], event_id: str | None = None) -> None:
        """Apply writes in order, atomically, and (when given) mark event_id applied in the same step.
        When event_id was applied before, nothing is written (idempotent on the event id)."""

    @abstractmethod
    def commit_batch(self, tenant: str, events: Sequence[EventWrites], position: Position | None) -> None:
        """Apply several events, mark their ids and store the applied offset, in one atomic step.

        `position` is (topic, partition, offset of the last record of the batch[, log end[, held]]). Events
        whose id was already applied (before, or earlier in this batch) are skipped whole, so committing a
        batch again changes nothing. The stored offset only moves forward. When `held` is given and the
        stored offset is absent or below it, nothing is written and StateBehind is raised."""

    def commit_many(self, steps: Sequence[BatchStep]) -> None:
        """Several `commit_batch` steps (e.g. the tenants of one poll); each is atomic on its own, steps of
        different tenants are not atomic together. Backends with a round trip send them together."""
        for tenant, events, position in steps:
            self.commit_batch(tenant, events, position)

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
    def applied_offset(self, tenant: str, topic: str, partition: int) -> int | None:
        """The offset stored by the last commit_batch for (topic, partition) of the tenant, or None."""

    @abstractmethod
    def event_ids(self, tenant: str) -> list[str]:
        """Applied event ids of a tenant, sorted."""

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

    def tenant_starts(self, wanted: Sequence[tuple[str, Iterable[tuple[str, int]]]]) -> list[TenantStart]:
        """For each (tenant, its (topic, partition)s): event_ids, the applied offsets, event_marks and
        latest_recorded, as one TenantStart. A worker loads hundreds of tenants at its start and after a
        rebalance; backends with a round trip read many tenants in one (RedisStore)."""
        return [(self.event_ids(t), {tp: self.applied_offset(t, *tp) for tp in tps}, self.event_marks(t),
                 self.latest_recorded(t)) for t, tps in wanted]


class StoreAdmin(ABC):
    """The namespace as a whole: what status, replay, offboarding and rule checks ask of a store. (Generations,
    which only the Redis stores have, are keel/store/redis/generations.py's.)"""

    @abstractmethod
    def tenants(self) -> list[str]:
        """Tenants with at least one write or applied event, sorted (includes the global-notes graph)."""

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

    def close(self) -> None:
        """Release connections."""
