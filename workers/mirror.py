"""The worker's in-process mirror of the tenants it serves, and the store handlers see while a batch is planned.

Handlers read the graph (`relations`, `facts`) while they write. Reading Redis for every event would cost
a round trip each, so a worker keeps a MemoryStore copy of every tenant it touched, loaded from Redis on
first touch (new tenants of a batch are loaded concurrently). It is exact as long as this worker is the
only writer of the tenant, which the consumer group guarantees (key = tenant, one owner per partition).
A tenant's mirror is dropped when its partition is revoked, when a write of a batch that changed it fails
(Redis may or may not hold that batch), and, least recently used first, beyond the size limit, but never
while it holds writes that are not in Redis yet (pinned).
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from keel.store.base import GLOBAL_TENANT, Key, Write
from keel.store.memory import MemoryStore
from keel.timeline import Assertion

Position = tuple[str, int, int]            # (topic, partition, offset of the last record applied)
TopicPartition = tuple[str, int]
_Loaded = tuple[list[tuple[Key, list[Assertion]]], list[str], dict[TopicPartition, "int | None"]]


class BatchStore(Protocol):
    """What the worker needs of the durable store (keel.store.redis.RedisStore)."""

    def dump(self, tenant: str) -> Iterator[tuple[Key, list[Assertion]]]: ...
    def event_ids(self, tenant: str) -> list[str]: ...
    def has_event(self, tenant: str, event_id: str) -> bool: ...
    def applied_offset(self, tenant: str, topic: str, partition: int) -> int | None: ...
    def commit_batch(self, tenant: str, events: list[tuple[list[Write], str]],
                     position: Position | None) -> None: ...
    # optional: commit_many(steps) — several commit_batch steps in one round trip (RedisStore has it)


class _Tenant:
    __slots__ = ("offsets",)

    def __init__(self) -> None:
        self.offsets: dict[TopicPartition, int | None] = {}


class Mirrors:
    """Per-tenant MemoryStore copies of the durable store, with each tenant's applied offsets."""

    def __init__(self, durable: BatchStore, *, max_tenants: int = 100_000, loaders: int = 8) -> None:
        self.durable = durable
        self.memory = RecordingStore()
        self.max_tenants = max_tenants
        self.loaders = loaders
        self._tenants: OrderedDict[str, _Tenant] = OrderedDict()
        self._pins: dict[str, int] = {}        # tenants changed by plans not written yet: never evicted
        self._pool: ThreadPoolExecutor | None = None

    def __contains__(self, tenant: str) -> bool:
        return tenant in self._tenants

    def __len__(self) -> int:
        return len(self._tenants)

    def touch(self, tenant: str) -> None:
        """Make sure the tenant is mirrored (loading it from the durable store on first touch)."""
        if tenant in self._tenants:
            self._tenants.move_to_end(tenant)
            return
        self._install(tenant, self._read(tenant, ()))

    def prefetch(self, wanted: dict[str, set[TopicPartition]]) -> None:
        """Load the tenants not mirrored yet (and their applied offsets on these partitions) concurrently:
        a tenant costs a few round trips, and a batch of a busy topic brings hundreds of new ones."""
        missing = [(t, tps) for t, tps in wanted.items() if t not in self._tenants]
        if len(missing) < 2 or self.loaders < 2:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.loaders, thread_name_prefix="keel-mirror-load")
        for tenant, loaded in zip([t for t, _ in missing],
                                  self._pool.map(lambda item: self._read(*item), missing)):
            if tenant not in self._tenants:
                self._install(tenant, loaded)

    def _read(self, tenant: str, tps: set[TopicPartition] | tuple[()]) -> _Loaded:
        """Everything the mirror needs of a tenant, read from the durable store (any thread)."""
        return (list(self.durable.dump(tenant)), self.durable.event_ids(tenant),
                {tp: self.durable.applied_offset(tenant, *tp) for tp in tps})

    def _install(self, tenant: str, loaded: _Loaded) -> None:
        timelines, event_ids, offsets = loaded
        self.memory.load(tenant, iter(timelines), event_ids)
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

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class RecordingStore(MemoryStore):
    """The mirror itself, as the Projector's store while a batch is planned: reads are plain MemoryStore
    reads; while `recording`, every `apply_writes` is applied (so later events of the batch see it) and
    recorded, to be committed to the durable store in one step per tenant. Global notes are only recorded
    (they live in the durable store's global tenant, never in a mirror)."""

    def __init__(self) -> None:
        super().__init__()
        self.recording = False
        self.applied: list[tuple[str, list[Write], str | None]] = []

    def take(self) -> list[tuple[str, list[Write], str | None]]:
        out, self.applied = self.applied, []
        return out

    def apply_writes(self, tenant: str, writes: list[Write], event_id: str | None = None) -> None:
        if self.recording:
            self.applied.append((tenant, writes, event_id))
            if tenant == GLOBAL_TENANT:
                return
        super().apply_writes(tenant, writes, event_id)
