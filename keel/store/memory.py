"""The embedded store: the whole graph in process memory (demo, CLI, cartridge development, tests)."""
from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence

from ..errors import StateBehind
from ..timeline import Assertion, Timeline, Version, insert
from ..times import Micros
from .base import (
    ChangeEntry,
    ChangePage,
    EventWrites,
    Freshness,
    Key,
    PartitionOffsets,
    Position,
    Store,
    Write,
    went_back,
)

_NONE = -(1 << 62)      # below every time: known_through before any write


def _recorded(write: Write) -> Micros:
    return write[1].recorded_at


class _TenantGraph:
    """A tenant's timelines as plain lists of assertions (appending is the write path's whole job), and the
    Timeline objects reads fold them with, made at a key's first read and sharing its list."""
    __slots__ = ("by_entity", "changes", "events", "first_recorded", "generation", "known_through", "latest",
                 "marks", "offsets", "timelines", "views")

    def __init__(self) -> None:
        self.timelines: dict[Key, list[Assertion]] = {}
        self.views: dict[Key, Timeline] = {}
        self.by_entity: dict[str, dict[Key, None]] = {}     # entity -> its keys, insertion ordered
        self.first_recorded: dict[str, Micros] = {}
        self.events: set[str] = set()
        self.marks: dict[str, str] = {}         # event id -> its mark (EventId.mark)
        self.latest: Micros | None = None       # the latest recorded_at of an applied event
        self.offsets: dict[tuple[str, int], int] = {}       # (topic, partition) -> applied offset
        self.generation = 0
        self.known_through: Micros | None = None        # latest recorded_at among the writes applied
        self.changes: list[Write] = []          # every write applied, in apply order (Store.changes)

    def note(self, event_id: str) -> None:
        """Mark an event applied, keeping its mark and moving `latest`."""
        self.events.add(str(event_id))
        self.keep_mark(event_id)

    def keep_mark(self, event_id: str) -> None:
        """Keep an event's mark and move `latest` (EventId); the id itself is marked applied by `note`."""
        mark = getattr(event_id, "mark", None)
        if mark is not None:
            self.marks[str(event_id)] = mark
        rec = getattr(event_id, "recorded_at", None)
        if rec is not None and (self.latest is None or rec > self.latest):
            self.latest = rec


class MemoryStore(Store):
    """All tenants in dicts; as-of lookups bisect a timeline's sorted points."""
    keeps_changes = True        # keep the change log (Store.changes); a worker's mirror does not need it

    def __init__(self) -> None:
        self._tenants: dict[str, _TenantGraph] = {}
        self._watermarks: PartitionOffsets = {}     # (topic, partition) -> applied through (advance_partitions)

    def _graph(self, tenant: str) -> _TenantGraph:
        g = self._tenants.get(tenant)
        if g is None:
            g = self._tenants[tenant] = _TenantGraph()
        return g

    def _read(self, tenant: str) -> _TenantGraph | None:
        """The graph every read method sees (subclasses may bring it up to date first); None if unknown."""
        return self._tenants.get(tenant)

    def _lookup(self, tenant: str) -> Callable[[Key], Timeline | None]:
        """key -> the Timeline reads fold (None when the key has no assertion), for one read of the tenant."""
        g = self._read(tenant)
        if g is None:
            return lambda key: None
        views, timelines = g.views, g.timelines

        def timeline(key: Key) -> Timeline | None:
            tl = views.get(key)
            if tl is None:
                entries = timelines.get(key)
                if entries is None:
                    return None
                tl = views[key] = Timeline.over(entries)
            return tl
        return timeline

    def apply_writes(self, tenant: str, writes: list[Write], event_id: str | None = None) -> None:
        g = self._tenants.get(tenant) or self._graph(tenant)
        if event_id is not None and event_id in g.events:
            return                                   # applied before: idempotent on the event id
        timelines, by_entity, first = g.timelines, g.by_entity, g.first_recorded
        get = timelines.get
        latest = _NONE if g.known_through is None else g.known_through
        for key, a in writes:
            entries = get(key)
            rec = a.recorded_at
            if rec > latest:  # noqa: PLR1730 - a compare, not a call (hot path)
                latest = rec
            if entries is None:
                timelines[key] = [a]
                self._index(by_entity, first, key[1], key, rec)
                if key[0] == "r":
                    self._index(by_entity, first, key[3], key, rec)
                continue
            if entries[-1].point <= a.point:
                entries.append(a)                    # timeline.insert's common case, without the call
            else:
                insert(entries, a)
            if first[key[1]] > rec:  # noqa: PLR1730 - a compare, not a call (hot path); indexed at the first write
                first[key[1]] = rec
            if key[0] == "r" and first[key[3]] > rec:
                first[key[3]] = rec
        if self.keeps_changes:
            g.changes.extend(writes)
        if event_id is not None:
            g.note(event_id)
        if latest != _NONE:
            g.known_through = latest
        g.generation += 1

    @staticmethod
    def _index(by_entity: dict[str, dict[Key, None]], first: dict[str, Micros], entity: str, key: Key,
               recorded_at: Micros) -> None:
        """A new key of `entity`: listed under it, and the entity's first recorded time kept."""
        keys = by_entity.get(entity)
        if keys is None:
            by_entity[entity] = {key: None}
            first[entity] = recorded_at
        else:
            keys[key] = None
            if first[entity] > recorded_at:  # noqa: PLR1730 - a compare, not a call (hot path)
                first[entity] = recorded_at

    def commit_batch(self, tenant: str, events: Sequence[EventWrites], position: Position | None) -> None:
        """The batch contract in process: each event as `apply_writes` (skipped when its id was applied), then
        the offset, which only moves forward. Atomic as far as one thread sees."""
        if position is not None and len(position) > 4:
            stored = self.applied_offset(tenant, position[0], position[1])
            if went_back(stored, position[4]):
                raise StateBehind(f"tenant {tenant!r} holds {position[0]} partition {position[1]} up to {stored}, "
                                  f"less than the {position[4]} the writer saw", topic=position[0],
                                  partition=int(position[1]), held=int(position[4] or 0), stored=stored, tenant=tenant)
        for writes, event_id in events:
            self.apply_writes(tenant, writes, event_id)
        if position is not None:
            offsets = self._graph(tenant).offsets
            where = (position[0], int(position[1]))
            offsets[where] = max(offsets.get(where, -1), int(position[2]))

    def advance_partitions(self, through: PartitionOffsets, held: dict[tuple[str, int], int | None]) -> None:
        for tp in through:
            stored = self._watermarks.get(tp)
            if went_back(stored, held.get(tp)):
                raise StateBehind(f"{tp[0]} partition {tp[1]} is applied up to {stored}, less than the "
                                  f"{held.get(tp)} the writer saw", topic=tp[0], partition=tp[1],
                                  held=int(held.get(tp) or 0), stored=stored)
        for tp, offset in through.items():
            self._watermarks[tp] = max(self._watermarks.get(tp, -1), int(offset))

    def partitions_applied(self, topic: str, partitions: Iterable[int]) -> dict[int, int | None]:
        return {int(p): self._watermarks.get((topic, int(p))) for p in partitions}

    def holds_data(self) -> bool:
        return bool(self._tenants or self._watermarks)

    def predates_watermarks(self) -> bool:
        return False              # it has kept watermarks since it began

    def applied_offset(self, tenant: str, topic: str, partition: int) -> int | None:
        g = self._tenants.get(tenant)           # like has_event: never needs the timelines up to date
        return None if g is None else g.offsets.get((topic, int(partition)))

    def has_event(self, tenant: str, event_id: str) -> bool:
        g = self._tenants.get(tenant)           # event ids only: never needs the timelines up to date
        return g is not None and event_id in g.events

    def freshness(self, tenant: str) -> Freshness:
        g = self._read(tenant)
        return Freshness(None if g is None else g.known_through)

    def event_mark(self, tenant: str, event_id: str) -> str | None:
        g = self._tenants.get(tenant)           # like has_event: never needs the timelines
        return None if g is None else g.marks.get(event_id)

    def event_marks(self, tenant: str) -> dict[str, str]:
        g = self._tenants.get(tenant)
        return {} if g is None else dict(g.marks)

    def latest_recorded(self, tenant: str) -> Micros | None:
        g = self._tenants.get(tenant)
        return None if g is None else g.latest

    def entity_recorded_at(self, tenant: str, entity: str) -> Micros | None:
        g = self._read(tenant)
        return None if g is None else g.first_recorded.get(entity)

    def keys(self, tenant: str, entity: str) -> list[Key]:
        g = self._read(tenant)
        if g is None:
            return []
        return list(g.by_entity.get(entity, ()))

    def as_of_many(self, tenant: str, keys: list[Key], at: Micros,
                   known_at: Micros | None) -> list[Version | None]:
        return [None if tl is None else tl.as_of(at, known_at) for tl in map(self._lookup(tenant), keys)]

    def versions_many(self, tenant: str, keys: list[Key], known_at: Micros | None) -> list[list[Version]]:
        return [[] if tl is None else tl.versions(known_at) for tl in map(self._lookup(tenant), keys)]

    def recorded_versions_many(self, tenant: str, keys: list[Key], known_at: Micros | None
                               ) -> list[list[tuple[Version, Assertion | None]]]:
        return [[] if tl is None else tl.recorded_versions(known_at) for tl in map(self._lookup(tenant), keys)]

    def runs_many(self, tenant: str, keys: list[Key], known_at: Micros | None) -> list[list[Version]]:
        return [[] if tl is None else tl.runs(known_at) for tl in map(self._lookup(tenant), keys)]

    def has_tenant(self, tenant: str) -> bool:
        g = self._tenants.get(tenant)
        return g is not None and bool(g.events or g.timelines)

    def tenants(self) -> list[str]:
        return sorted(t for t, g in self._tenants.items() if g.events or g.timelines)

    def dump(self, tenant: str) -> Iterator[tuple[Key, list[Assertion]]]:
        g = self._read(tenant)
        if g is None:
            return
        for key in sorted(g.timelines):
            yield key, list(g.timelines[key])

    def event_ids(self, tenant: str) -> list[str]:
        g = self._read(tenant)
        return sorted(g.events) if g else []

    def entity_indexes(self, tenant: str, type: str | None = None) -> Iterator[tuple[str, Micros, list[Key]]]:
        g = self._read(tenant)
        if g is None:
            return
        prefix = None if type is None else type + ":"
        for entity in sorted(g.by_entity):
            if prefix is None or entity.startswith(prefix):
                yield entity, g.first_recorded[entity], list(g.by_entity[entity])

    def assertions_many(self, tenant: str, keys: list[Key]) -> list[list[Assertion]]:
        g = self._read(tenant)
        timelines = {} if g is None else g.timelines
        return [list(timelines.get(k, ())) for k in keys]

    def changes(self, tenant: str, *, start: int | None = None, since: Micros | None = None,
                generation: int | None = None, count: int) -> ChangePage:
        g = self._read(tenant)
        log = [] if g is None else g.changes
        if start is None or generation != 1:        # one generation in process
            start = 0 if since is None else bisect_right(log, since, key=_recorded)
        entries = [ChangeEntry(start + i, key, a) for i, (key, a) in enumerate(log[start:start + count])]
        return ChangePage(1, start, entries, len(log), None if g is None else g.known_through)

    def search_version(self, tenant: str) -> object:
        g = self._read(tenant)
        return None if g is None else g.generation

    def load(self, tenant: str, timelines: Iterator[tuple[Key, list[Assertion]]], event_ids: list[str], *,
             marks: dict[str, str] | None = None, latest: Micros | None = None) -> None:
        """Fill a tenant from a dump of another store (a worker's in-process mirror of Redis)."""
        self._tenants.pop(tenant, None)
        for key, assertions in timelines:
            self.apply_writes(tenant, [Write(key, a) for a in assertions])
        g = self._graph(tenant)
        g.changes.sort(key=_recorded)       # a dump is by key: recorded order is the best a load can rebuild
        g.events.update(event_ids)
        g.marks.update(marks or {})
        g.latest = latest

    def drop(self, tenant: str) -> None:
        self._tenants.pop(tenant, None)
