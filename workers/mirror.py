"""The worker's in-process mirror of the tenants it serves, and the store handlers see while a batch is planned.

Handlers read the graph (`relations`, `facts`) while they write. Reading Redis for every event would cost
a round trip each, so a worker keeps a MemoryStore copy of every tenant it touched, loaded from Redis on
first touch (the new tenants of a batch in a few round trips: `Store.tenant_starts`). It is exact as long
as this worker is the only writer of the tenant, which the consumer group guarantees (key = tenant, one owner per partition).
A tenant's mirror is dropped when its partition is revoked, when a write of a batch that changed it fails
(Redis may or may not hold that batch), and, least recently used first, beyond the size limit, but never
while it holds writes that are not in Redis yet (pinned).

The graph of a mirror is materialized only once a handler reads it. Until then a tenant's mirror holds its
applied event ids (what the duplicate check needs) and the writes of batches not written yet; once Redis
holds a batch its writes are released. Most handlers only write (cartridge guidance: prefer unconditional
writes), so applying every write to in-memory timelines that nobody reads was a third of the planning
time. The first read of such a tenant loads its graph from Redis, when no batch is being written (the
write lock), then applies the writes Redis does not hold yet; from then on its mirror is kept up to date
as each write is planned.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from keel.store.base import GLOBAL_TENANT, Key, Position, Store, TenantStart, Write
from keel.store.memory import MemoryStore
from keel.timeline import Assertion

TopicPartition = tuple[str, int]


class _Tenant:
    __slots__ = ("offsets",)

    def __init__(self) -> None:
        self.offsets: dict[TopicPartition, int | None] = {}


class Mirrors:
    """Per-tenant MemoryStore copies of the durable store, with each tenant's applied offsets."""

    def __init__(self, durable: Store, *, max_tenants: int = 100_000, loads: int = 1024) -> None:
        self.durable = durable
        self.write_lock = threading.Lock()     # held while a batch is written (BatchApplier.write)
        self.memory = RecordingStore(reload=self._reload)
        self.max_tenants = max_tenants
        self.loads = loads                     # tenants per tenant_starts call
        self._tenants: OrderedDict[str, _Tenant] = OrderedDict()
        self._pins: dict[str, int] = {}        # tenants changed by plans not written yet: never evicted

    def __contains__(self, tenant: str) -> bool:
        return tenant in self._tenants

    def __len__(self) -> int:
        return len(self._tenants)

    def touch(self, tenant: str) -> None:
        """Make sure the tenant is mirrored (loading it from the durable store on first touch)."""
        if tenant in self._tenants:
            self._tenants.move_to_end(tenant)
            return
        self._install(tenant, self.durable.tenant_starts([(tenant, ())])[0])

    def prefetch(self, wanted: dict[str, set[TopicPartition]]) -> None:
        """Load the tenants not mirrored yet (and their applied offsets on these partitions), `loads` per
        call of the durable store: a batch of a busy topic brings hundreds of new tenants, and the store
        reads many in one round trip (`Store.tenant_starts`)."""
        missing = [(t, tps) for t, tps in wanted.items() if t not in self._tenants]
        for i in range(0, len(missing), self.loads):
            chunk = missing[i:i + self.loads]
            for (tenant, _), loaded in zip(chunk, self.durable.tenant_starts(chunk)):
                self._install(tenant, loaded)

    def _reload(self, tenant: str) -> tuple[list[tuple[Key, list[Assertion]]], list[str]]:
        """A tenant's graph and event ids as the durable store holds them, read while no batch is written."""
        with self.write_lock:
            return list(self.durable.dump(tenant)), self.durable.event_ids(tenant)

    def _install(self, tenant: str, loaded: TenantStart) -> None:
        event_ids, offsets, marks, latest = loaded
        self.memory.load(tenant, iter(()), event_ids, stale=True, marks=marks, latest=latest)
        state = self._tenants[tenant] = _Tenant()
        state.offsets.update(offsets)

    def pin(self, tenants: set[str]) -> None:
        """These tenants hold writes not in the durable store yet: keep them until unpinned."""
        for t in tenants:
            self._pins[t] = self._pins.get(t, 0) + 1

    def unpin(self, tenants: set[str]) -> None:
        for t in tenants:
            n = self._pins.get(t, 0) - 1
            if n > 0:
                self._pins[t] = n
            else:
                self._pins.pop(t, None)

    def trim(self) -> None:
        """Drop least recently used tenants beyond `max_tenants` (never a pinned one)."""
        excess = len(self._tenants) - self.max_tenants
        if excess <= 0:
            return
        victims = [t for t in self._tenants if t not in self._pins][:excess]
        self.drop(victims)

    def applied_offset(self, tenant: str, topic: str, partition: int) -> int | None:
        """The last offset of (topic, partition) applied to the tenant (read once, then kept up to date)."""
        self.touch(tenant)
        offsets = self._tenants[tenant].offsets
        tp = (topic, partition)
        if tp not in offsets:
            offsets[tp] = self.durable.applied_offset(tenant, topic, partition)
        return offsets[tp]

    def committed(self, tenant: str, position: Position) -> None:
        """Record that the durable store now holds the tenant up to `position`."""
        state = self._tenants.get(tenant)
        if state is not None:
            state.offsets[(position[0], position[1])] = position[2]

    def drop(self, tenants: set[str] | list[str]) -> None:
        for tenant in tenants:
            if self._tenants.pop(tenant, None) is not None:
                self.memory.drop(tenant)

    def drop_partitions(self, partitions: set[TopicPartition]) -> int:
        """Forget every tenant that received records from these partitions; returns how many."""
        gone = [t for t, state in self._tenants.items() if partitions & state.offsets.keys()]
        self.drop(gone)
        return len(gone)

    def clear(self) -> None:
        self.drop(list(self._tenants))


class RecordingStore(MemoryStore):
    """The mirror itself, as the Projector's store while a batch is planned: reads are MemoryStore reads;
    while `recording`, every `apply_writes` is recorded, to be committed to the durable store in one step
    per tenant. Global notes are only recorded (they live in the durable store's global tenant, never in a
    mirror).

    Recorded writes of a tenant are applied to its graph only when something reads the tenant (every read
    method materializes it first): until then they wait in order, tagged with the batch (`begin`) that made
    them. `release(tenants, tag)` forgets the waiting writes of batches up to `tag` (the durable store
    holds them) and marks those graphs stale: their next read replaces them with `reload(tenant)` (graph and
    event ids of the durable store) and applies the writes still waiting, skipping events it already holds.
    Without `reload` nothing is released: waiting writes are applied on the first read. It keeps no change
    log (Store.changes): the durable store answers those."""
    keeps_changes = False

    def __init__(self, reload: Callable[[str], tuple[list[tuple[Key, list[Assertion]]], list[str]]] | None = None
                 ) -> None:
        super().__init__()
        self.recording = False
        self.applied: list[tuple[str, list[Write], str | None]] = []
        self.reload = reload
        self.tag = 0                                        # batch tag of the writes recorded now
        self._waiting: dict[str, list[tuple[int, list[Write], str | None]]] = {}
        self._waiting_ids: dict[str, set[str]] = {}
        self._stale: set[str] = set()          # graph lacks released writes: reload before reading
        self._live: set[str] = set()           # read at least once: writes are applied as recorded

    def take(self) -> list[tuple[str, list[Write], str | None]]:
        out, self.applied = self.applied, []
        return out

    def begin(self) -> int:
        """A new batch: the tag of the writes recorded from now on."""
        self.tag += 1
        return self.tag

    def apply_writes(self, tenant: str, writes: list[Write], event_id: str | None = None) -> None:
        if self.recording:
            self.applied.append((tenant, writes, event_id))
            if tenant == GLOBAL_TENANT:
                return
            if tenant not in self._live:
                self._waiting.setdefault(tenant, []).append((self.tag, writes, event_id))
                if event_id is not None:
                    self._waiting_ids.setdefault(tenant, set()).add(event_id)
                    self._graph(tenant).keep_mark(event_id)     # its mark and recorded_at, without the graph
                return
        elif tenant in self._waiting or tenant in self._stale:
            self.materialize(tenant)
        super().apply_writes(tenant, writes, event_id)

    def has_event(self, tenant: str, event_id: str) -> bool:
        ids = self._waiting_ids.get(tenant)
        return (ids is not None and event_id in ids) or super().has_event(tenant, event_id)

    def release(self, tenants: set[str] | list[str], tag: int) -> None:
        """The durable store holds every write of batches up to `tag` of these tenants: forget them."""
        if self.reload is None:
            return
        for tenant in tenants:
            waiting = self._waiting.get(tenant)
            if not waiting or waiting[0][0] > tag:
                continue
            keep = [w for w in waiting if w[0] > tag]
            ids = self._waiting_ids.get(tenant, set())
            done = {event_id for b, _, event_id in waiting if b <= tag and event_id is not None}
            self._graph(tenant).events.update(done)        # the duplicate check keeps working
            ids -= done
            if keep:
                self._waiting[tenant] = keep
            else:
                self._waiting.pop(tenant, None)
                self._waiting_ids.pop(tenant, None)
            self._stale.add(tenant)

    def materialize(self, tenant: str) -> None:
        """Bring the tenant's graph up to date (reload if stale, then the waiting writes); it stays live."""
        waiting = self._waiting.pop(tenant, ())
        self._waiting_ids.pop(tenant, None)
        if tenant in self._stale:
            assert self.reload is not None
            timelines, event_ids = self.reload(tenant)
            self._stale.discard(tenant)
            before = self._tenants.get(tenant)      # its marks and latest recorded_at: kept since loading
            recording, self.recording = self.recording, False      # a handler's read: load without recording
            try:
                super().load(tenant, iter(timelines), event_ids, marks=None if before is None else before.marks,
                             latest=None if before is None else before.latest)
            finally:
                self.recording = recording
        for _, writes, event_id in waiting:
            super().apply_writes(tenant, writes, event_id)     # skips events the reload brought
        self._live.add(tenant)

    def load(self, tenant: str, timelines: Iterator[tuple[Key, list[Assertion]]], event_ids: list[str], *,
             stale: bool = False, marks: dict[str, str] | None = None, latest: int | None = None) -> None:
        """Fill a tenant from the durable store; `stale`: only its event ids are given, read the graph later."""
        self._forget(tenant)
        recording, self.recording = self.recording, False
        try:
            super().load(tenant, timelines, event_ids, marks=marks, latest=latest)
        finally:
            self.recording = recording
        if stale and self.reload is not None:
            self._stale.add(tenant)

    def _read(self, tenant: str) -> Any:
        """Every read of the store sees the tenant materialized."""
        if tenant in self._waiting or tenant in self._stale:
            self.materialize(tenant)
        return super()._read(tenant)

    def tenants(self) -> list[str]:
        for tenant in list(self._waiting.keys() | self._stale):
            self.materialize(tenant)
        return super().tenants()

    def drop(self, tenant: str) -> None:
        self._forget(tenant)
        super().drop(tenant)

    def _forget(self, tenant: str) -> None:
        self._waiting.pop(tenant, None)
        self._waiting_ids.pop(tenant, None)
        self._stale.discard(tenant)
        self._live.discard(tenant)
