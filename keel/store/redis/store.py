"""The base of the Redis store (RedisBase): the Store contract's parts that do not depend on where an entity's
data lives, on a single redis-server or on Redis Cluster (key names: keys.py). segment_store.RedisStore, its one
subclass, adds the entities' segments.

Reads go through the current generation: each script or MULTI block re-reads `gen` and the client retries
(retries.py) when a switch happened since it computed its key names. `for_generation` gives a view pinned to one
generation of one tenant (to rebuild it while the current one keeps serving).
"""
from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Self

from redis.exceptions import RedisError, ResponseError

from ...errors import StateBehind, StoreUnavailable, UsageError
from ...times import Micros
from ..base import (
    BatchStep,
    EventWrites,
    Freshness,
    PartitionOffsets,
    Position,
    Store,
    Write,
)
from . import lua
from .changelog import ChangeLogReads
from .codec import freshness_of
from .connection import connect, redacted
from .event_ids import EventIdReads
from .generations import GenerationAdmin
from .keys import (
    LATEST,
    TenantKeys,
    applied_key,
    check_name,
    gen_keys,
    generation_of,
    layout_key,
    offset_field,
    registry_key,
    watermarked_key,
)
from .layout import LAYOUT_VERSION, check_layout
from .retries import in_current, until_done
from .starts import TenantStarts
from .transport import Client, eval_many, guard, is_oom
from .walks import TenantWalks, holds_data

Build = Callable[[str], tuple[list[str], list[Any]]]   # data prefix -> (script keys after `gen`, args after the check)


def redis_condition(info: dict[str, Any]) -> str | None:
    """The rule of RedisStore.condition over `INFO memory` + `INFO replication` (one node; on Cluster the
    first answering node's view)."""
    if "used_memory" not in info and info:          # Cluster: {node: info}
        info = next(iter(info.values()))
    used, limit = int(info.get("used_memory", 0)), int(info.get("maxmemory", 0))
    if limit and used >= limit and info.get("maxmemory_policy") == "noeviction":
        return (f"Redis is out of memory ({used} of maxmemory {limit} bytes used, policy noeviction) and refuses "
                f"writes: raise maxmemory or free memory; workers resume by themselves")
    if info.get("role") in ("slave", "replica"):
        return (f"Redis is a read-only replica (of {info.get('master_host')}:{info.get('master_port')}): point "
                f"Keel at the primary, or use a redis+sentinel:// URL to follow failovers")
    return None


class GenerationChanged(StoreUnavailable):
    """A strict writer's batch met a new current generation (a replay cut over): drop what was computed
    from the old one and plan again from the new generation."""

    def __init__(self, tenant: str, old: int, new: int) -> None:
        super().__init__(f"tenant {tenant!r} moved from generation {old} to {new} (a replay cut over); "
                         f"the batch must be planned again", tenant=tenant)
        self.old = old
        self.new = new


class RedisBase(ChangeLogReads, GenerationAdmin, TenantWalks, TenantStarts, EventIdReads, Store):
    """What a Store over Redis (single node or Cluster) does whatever its entities' keys: the namespace's
    connection, tenants, generations, offsets and meta hash; one namespace (a cartridge) per instance. Its one
    subclass, segment_store.RedisStore, keeps the entities' data in segments."""

    def __init__(self, client: Client, *, namespace: str, pins: dict[str, int] | None = None,
                 owns_client: bool = True, strict_generations: bool = False) -> None:
        self._client = client
        self.strict_generations = strict_generations   # writers raise GenerationChanged instead of following
        self.namespace = check_name("namespace", namespace)
        self._registry = registry_key(namespace)
        self._applied = applied_key(namespace)
        self._pins: dict[str, int] = dict(pins or {})
        self._gens: dict[str, int] = {}
        self._names: dict[str, TenantKeys] = {}
        self._registered: set[str] = set()
        self._owns_client = owns_client
        self._switch_script = client.register_script(lua.SWITCH)
        self._new_gen_script = client.register_script(lua.NEW_GENERATION)
        self._switch_if_script = client.register_script(lua.SWITCH_IF_CAUGHT_UP)
        self._advance_script = client.register_script(lua.ADVANCE)
        self._id_lookup = client.register_script(lua.ID_LOOKUP)
        self._id_guesses: dict[str, int] = {}         # data prefix -> buckets of its event ids (event_ids.py)

    @classmethod
    def from_url(cls, url: str, *, namespace: str, cluster: bool | None = None,
                 strict_generations: bool = False, upgrading_layout: bool = False, **options: Any) -> Self:
        """Connect to `redis://…`; `cluster=None` asks the server (`INFO cluster`) whether it is a Cluster node.
        With `cluster=None` (what every process uses) it also checks the namespace's key layout (layout.py: a
        new namespace is stamped; one in layout 1 is refused unless `upgrading_layout`, the replay that
        rewrites it); with `cluster` given it connects lazily."""
        options.setdefault("socket_connect_timeout", 5)
        options.setdefault("socket_timeout", 30)
        probed = cluster is None
        try:
            client = connect(url, cluster=cluster, **options)
            if probed:                       # a process opening its store: connected now, check the layout
                check_layout(client, check_name("namespace", namespace), upgrading=upgrading_layout)
        except RedisError as e:
            raise StoreUnavailable(f"cannot connect to Redis at {redacted(url)}: {type(e).__name__}: {e}") from e
        return cls(client, namespace=namespace, strict_generations=strict_generations)

    @property
    def client(self) -> Client:
        return self._client

    def ping(self) -> None:
        """Raise StoreUnavailable unless the server answers (readiness probes)."""
        with self._guard("ping"):
            self._client.ping()

    def condition(self) -> str | None:
        """Why this Redis cannot take Keel's writes although it answers, or None: out of memory (used memory at
        maxmemory with the noeviction policy), or read-only (a replica). For `keel status` and readiness."""
        with self._guard("condition"):
            info = self._client.info("memory") | self._client.info("replication")
        return redis_condition(info)

    def forget_cached_state(self) -> None:
        """Drop what this store remembers of Redis's state (tenants registered, generation guesses, event-id bucket
        counts): after Redis lost acknowledged writes (a failover to a replica that lagged) they may name state the
        new primary never had. Each is read again from Redis when next needed."""
        self._gens.clear()
        self._registered.clear()
        self._id_guesses.clear()
        subjects = getattr(self, "_subjects", None)
        if isinstance(subjects, dict):
            subjects.clear()
            self._subjects_held = 0

    def close(self) -> None:
        if self._owns_client:
            self._client.close()
            if self.cold is not None:          # attached by its opener (keel.connect), closed with the store
                self.cold.close()

    # ---- the public interface of the key layout (the bulk loader uses it) ------------------------

    def tenant_keys(self, tenant: str) -> TenantKeys:
        """The key names of a tenant (its name checked)."""
        return self._n(tenant)

    def data_prefix(self, tenant: str, gen: int) -> str:
        """The prefix of every data key of one generation of a tenant."""
        return self._n(tenant).data(int(gen))

    def register_tenant(self, tenant: str) -> None:
        """Add the tenant to the namespace's registry (once per store)."""
        if tenant not in self._registered:
            with self._guard("register", tenant):
                self._registry_add([tenant])
            self._registered.add(tenant)

    def _register_all(self, tenants: Iterable[str]) -> None:
        """Add the tenants this store has not registered yet to the registry, in one round trip (names checked)."""
        unregistered = sorted(set(tenants) - self._registered)
        for tenant in unregistered:
            self._n(tenant)
        if unregistered:
            self._registry_add(unregistered)
            self._registered.update(unregistered)

    def _registry_add(self, tenants: list[str]) -> None:
        """SADD to the registry, after the layout stamp and the watermark mark (SET NX, the same hash slot, in
        that order): a namespace whose registry a writer fills always carries this layout's stamp. Redis that
        failed over to a replica holding none of the namespace would otherwise get a registry without a stamp
        from the running writers, and the next process to open it would take it for one written before stamps
        (layout 1) and refuse it (layout.py)."""
        pipe = self._client.pipeline(transaction=False)
        pipe.set(layout_key(self.namespace), LAYOUT_VERSION, nx=True)
        pipe.set(watermarked_key(self.namespace), 1, nx=True)
        pipe.sadd(self._registry, *tenants)
        pipe.execute()

    def invalidate(self, tenant: str, gen: int) -> None:
        """Forget what this store cached of a generation another writer (a bulk load) changed: nothing (the
        segment writer keeps no guess of a generation's contents)."""

    # ---- plumbing ------------------------------------------------------------------------------

    def _guard(self, what: str, tenant: str | None = None) -> AbstractContextManager[None]:
        return guard(self.namespace, what, tenant)

    def _n(self, tenant: str) -> TenantKeys:
        names = self._names.get(tenant)
        if names is None:
            names = self._names[tenant] = TenantKeys(self.namespace, check_name("tenant", tenant, allow_global=True))
        return names

    def _gen_guess(self, tenant: str) -> tuple[int, str]:
        """(generation to compute keys for, generation to check: "" when pinned)."""
        pinned = self._pins.get(tenant)
        if pinned is not None:
            return pinned, ""
        gen = self._gens.get(tenant, 1)
        return gen, str(gen)

    def _script_many(self, script: Any, calls: Sequence[tuple[str, Build]]) -> list[list[Any]]:
        """Generation-checked script calls, each `(tenant, build)` as in `_script`, in one round trip;
        the calls whose tenant switched generation meanwhile are built again and rerun."""
        out: list[list[Any]] = [[] for _ in calls]

        def attempt(todo: list[int]) -> list[int]:
            sent = []
            for i in todo:
                names = self._n(calls[i][0])
                gen, expected = self._gen_guess(calls[i][0])
                keys, args = calls[i][1](names.data(gen))
                sent.append(([names.gen, *keys], [expected, *args]))
            left = []
            for i, result in zip(todo, eval_many(self._client, script, sent)):
                if result[0] == 0:
                    self._gens[calls[i][0]] = int(result[1])
                    left.append(i)
                else:
                    out[i] = result
            return left
        until_done(list(range(len(calls))), attempt, lambda i: calls[i][0])
        return out


    def _reads(self, names: TenantKeys, gen: int, expected: str, fill: Callable[[Any, str], None], *,
               transaction: bool) -> list[Any]:
        pipe = self._client.pipeline(transaction=transaction)
        if expected:
            pipe.get(names.gen)
        fill(pipe, names.data(gen))
        return pipe.execute()

    def _tx(self, tenant: str, fill: Callable[[Any, str], None]) -> list[Any]:
        """Run reads in one MULTI/EXEC that also checks the generation; `fill(pipe, data prefix)`."""
        names = self._n(tenant)

        def attempt() -> list[Any] | None:
            gen, expected = self._gen_guess(tenant)
            try:
                result = self._reads(names, gen, expected, fill, transaction=True)
            except ResponseError as e:      # out of memory, Redis refuses to queue even reads in a MULTI: read
                if not is_oom(e):           # them in one round trip (the generation first, then its keys)
                    raise
                result = self._reads(names, gen, expected, fill, transaction=False)
            if not expected:
                return result
            current = generation_of(result[0])
            if str(current) == expected:
                return result[1:]
            self._gens[tenant] = current
            return None
        return in_current(tenant, attempt)

    # ---- writes --------------------------------------------------------------------------------

    def apply_writes(self, tenant: str, writes: list[Write], event_id: str | None = None) -> None:
        """Apply writes and mark event_id in one script. An event id already applied is skipped whole."""
        if not writes and event_id is None:
            return
        self._commit([(tenant, [(writes, event_id)], None)], "apply_writes")

    def commit_batch(self, tenant: str, events: Sequence[EventWrites],
                     position: Position | None) -> None:
        """Apply several events, mark their ids and store the applied offset, in one atomic step.

        `position` is (topic, partition, offset of the last record of the batch). Events whose id was
        already applied (before, or earlier in this batch) are skipped whole, so re-committing a batch
        changes nothing. The stored offset only moves forward.
        """
        self._commit([(tenant, events, position)], "commit_batch")

    def commit_many(self, steps: Sequence[BatchStep]) -> None:
        """Several `commit_batch` steps (e.g. the tenants of one poll) in one round trip.

        Each step is atomic and idempotent on its own; steps of different tenants are not atomic together.
        """
        self._commit(steps, "commit_many")

    @abstractmethod
    def _commit(self, steps: Sequence[BatchStep], what: str) -> None:
        """Apply the steps, each atomically (the subclass's APPLY script)."""

    # ---- primitive reads -----------------------------------------------------------------------

    # ---- the partitions' applied watermarks (namespace-wide: where a worker resumes) ---------------

    def advance_partitions(self, through: PartitionOffsets, held: dict[tuple[str, int], int | None]) -> None:
        if not through:
            return
        args: list[Any] = []
        for (topic, partition), offset in sorted(through.items()):
            h = held.get((topic, partition))
            args += (offset_field(topic, partition), int(offset), "" if h is None else int(h))
        with self._guard("advance_partitions"):
            result = self._advance_script(keys=[self._applied], args=args)
        if int(result[0]) == 4:
            topic, partition = json.loads(result[1][1:])
            stored = int(result[2]) if result[2] else None
            h = held[(topic, partition)]
            raise StateBehind(f"Redis holds {topic} partition {partition} applied up to {stored}, less than the "
                              f"{h} this worker saw: Redis lost acknowledged writes", topic=topic,
                              partition=int(partition), held=int(h or 0), stored=stored)

    def partitions_applied(self, topic: str, partitions: Iterable[int]) -> dict[int, int | None]:
        parts = [int(p) for p in partitions]
        if not parts:
            return {}
        with self._guard("partitions_applied"):
            values = self._client.hmget(self._applied, [offset_field(topic, p) for p in parts])
        return {p: None if v is None else int(v) for p, v in zip(parts, values)}

    def holds_data(self) -> bool:
        with self._guard("holds_data"):
            return bool(self._client.exists(self._applied) or self._client.scard(self._registry))

    def predates_watermarks(self) -> bool:
        with self._guard("predates_watermarks"):
            if self._client.exists(watermarked_key(self.namespace)):
                return False
            return bool(self._client.exists(self._applied) or self._client.scard(self._registry))

    def applied_offset(self, tenant: str, topic: str, partition: int) -> int | None:
        """The offset stored by the last commit_batch for (topic, partition) of the tenant, or None."""
        with self._guard("applied_offset", tenant):
            value = self._tx(tenant, lambda p, d: p.hget(gen_keys(d).meta, offset_field(topic, partition)))[0]
        return None if value is None else int(value)

    def freshness(self, tenant: str) -> Freshness:
        """known_through and lag from the meta hash (what the workers' last commits stored)."""
        with self._guard("freshness", tenant):
            return freshness_of(self._tx(tenant, lambda p, d: p.hmget(gen_keys(d).meta, "kt", "lag"))[0])

    def latest_recorded(self, tenant: str) -> Micros | None:
        with self._guard("latest_recorded", tenant):
            value = self._tx(tenant, lambda p, d: p.hget(gen_keys(d).meta, LATEST))[0]
        return None if value is None else int(value)

    def search_version(self, tenant: str) -> object:
        """(generation, write counter): changes with every applied write and every generation switch."""
        with self._guard("search_version", tenant):
            value = self._tx(tenant, lambda p, d: p.hget(gen_keys(d).meta, "sv"))[0]
        return (self._gen_guess(tenant)[0], int(value or 0))

    def has_tenant(self, tenant: str) -> bool:
        """Whether the tenant's current generation holds data (one transaction)."""
        with self._guard("has_tenant", tenant):
            return any(self._tx(tenant, holds_data))

    # ---- generations ---------------------------------------------------------------------------

    def current_generation(self, tenant: str) -> int:
        """The generation reads and writes of this tenant go to (1 until switched)."""
        with self._guard("current_generation", tenant):
            gen = int(self._client.get(self._n(tenant).gen) or 1)
        self._gens[tenant] = gen
        return gen

    def for_generation(self, tenant: str, gen: int) -> Self:
        """A view sharing this connection whose reads and writes of `tenant` go to generation `gen`."""
        self._n(tenant)
        if int(gen) < 1:
            raise UsageError(f"bad generation {gen!r}: generations start at 1")
        view = type(self)(self._client, namespace=self.namespace, pins={**self._pins, tenant: int(gen)},
                          owns_client=False)
        view._registered = self._registered
        view.cold = self.cold
        return view

