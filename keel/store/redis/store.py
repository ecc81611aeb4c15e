"""The Redis store: the Store contract on a single redis-server or on Redis Cluster (layout: keys.py).

Reads go through the current generation: each script or MULTI block re-reads `gen` and the client
retries (retries.py) when a switch happened since it computed its key names. `view` (what `context` reads)
is one VIEW script per entity, and `views` sends several in one pipeline. VIEW is the one script that reads keys
it was not given: the sorted sets of the subjects of relations naming the entity as object, named from its index
list; they carry the tenant's hash tag, so they are in the script's hash slot. `for_generation` gives a view pinned
to one generation of one tenant (to rebuild it while the current one keeps serving).
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

from redis.exceptions import RedisError, ResponseError

from ...errors import StateBehind, StoreUnavailable, UsageError
from ...timeline import Assertion, Timeline, Version
from ...times import Micros
from ..base import (
    BatchStep,
    EntityView,
    EventWrites,
    Freshness,
    Key,
    PartitionOffsets,
    Position,
    Store,
    ViewRequest,
    Write,
)
from . import lua, scripts
from .batch import ApplyBatch, PendingStep, state_behind
from .changelog import ChangeLogReads
from .codec import ProvenanceCache, clamped_point, decode_view, freshness_of, timeline_of
from .connection import connect, redacted
from .generations import GenerationAdmin
from .keys import (
    LATEST,
    MARKS,
    RELATION_ENDS,
    TenantKeys,
    applied_key,
    check_name,
    escape,
    index_key,
    offset_field,
    prefix_of,
    registry_key,
    watermarked_key,
)
from .layout import LAYOUT_VERSION, LAYOUTS, check_layout
from .retries import KEPT_CONFLICTING, in_current, until_done
from .starts import TenantStarts
from .transport import Client, chunks, eval_many, guard, is_oom
from .walks import TenantWalks

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


_LAYOUT_CLASSES: dict[int, type[RedisStore]] = {}


def store_of_layout(store_class: type[RedisStore]) -> type[RedisStore]:
    """Class decorator: `store_class` reads and writes the key layout it names (`layout`); `from_url` opens it
    for a namespace in that layout. RedisStore is layout 1's; a layout built on it registers from its own
    module (segment_store.SegmentStore, layout 2, which the package imports), so this one never names it."""
    _LAYOUT_CLASSES[store_class.layout] = store_class
    return store_class


def layout_class(layout: int) -> type[RedisStore]:
    """The store class reading and writing a key layout (1: this module's, 2: segment_store.SegmentStore)."""
    found = _LAYOUT_CLASSES.get(layout)
    if found is None:
        raise UsageError(f"bad Redis key layout {layout!r}: this Keel writes layouts {', '.join(map(str, LAYOUTS))}")
    return found


class GenerationChanged(StoreUnavailable):
    """A strict writer's batch met a new current generation (a replay cut over): drop what was computed
    from the old one and plan again from the new generation."""

    def __init__(self, tenant: str, old: int, new: int) -> None:
        super().__init__(f"tenant {tenant!r} moved from generation {old} to {new} (a replay cut over); "
                         f"the batch must be planned again", tenant=tenant)
        self.old = old
        self.new = new


@store_of_layout
class RedisStore(ChangeLogReads, GenerationAdmin, TenantWalks, TenantStarts, Store):
    """A Store over Redis (single node or Cluster) in key layout 1; one namespace (a cartridge) per instance.
    `from_url` opens the class of the namespace's layout (layout 2: segment_store.SegmentStore)."""
    layout = 1

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
        self._pv_len: dict[str, int] = {}     # data prefix -> provenance list length after our last write
        self._owns_client = owns_client
        self._apply_script = client.register_script(scripts.APPLY)
        self._read_script = client.register_script(scripts.READ)
        self._view_script = client.register_script(scripts.VIEW)
        self._switch_script = client.register_script(lua.SWITCH)
        self._new_gen_script = client.register_script(lua.NEW_GENERATION)
        self._switch_if_script = client.register_script(lua.SWITCH_IF_CAUGHT_UP)
        self._advance_script = client.register_script(lua.ADVANCE)

    @classmethod
    def from_url(cls, url: str, *, namespace: str, cluster: bool | None = None,
                 strict_generations: bool = False, upgrading_layout: bool = False, layout: int | None = None,
                 convert_to: int | None = None, **options: Any) -> RedisStore:
        """Connect to `redis://…`; `cluster=None` asks the server (`INFO cluster`) whether it is a Cluster node.
        With `cluster=None` (what every process uses) it also reads the namespace's key layout (layout.py: a new
        namespace is stamped with `layout`, default 1; a replay is `upgrading_layout`) and opens the store class
        of that layout, or of `convert_to` (`keel replay --all --layout N` rewriting every tenant in layout N);
        with `cluster` given it connects lazily, in this class's layout."""
        options.setdefault("socket_connect_timeout", 5)
        options.setdefault("socket_timeout", 30)
        probed = cluster is None
        try:
            client = connect(url, cluster=cluster, **options)
            store_class: type[RedisStore] = cls
            if probed:                       # a process opening its store: connected now, check the layout
                found = check_layout(client, check_name("namespace", namespace), upgrading=upgrading_layout,
                                     default=layout or cls.layout)
                store_class = layout_class(convert_to or (found if found in LAYOUTS else LAYOUT_VERSION))
        except RedisError as e:
            raise StoreUnavailable(f"cannot connect to Redis at {redacted(url)}: {type(e).__name__}: {e}") from e
        return store_class(client, namespace=namespace, strict_generations=strict_generations)

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
                self._client.sadd(self._registry, tenant)
            self._registered.add(tenant)

    def _register_all(self, tenants: Iterable[str]) -> None:
        """Add the tenants this store has not registered yet to the registry, in one command (names checked)."""
        unregistered = sorted(set(tenants) - self._registered)
        for tenant in unregistered:
            self._n(tenant)
        if unregistered:
            self._client.sadd(self._registry, *unregistered)
            self._registered.update(unregistered)

    def invalidate(self, tenant: str, gen: int) -> None:
        """Forget what this store cached of a generation another writer (a bulk load) changed."""
        self._pv_len.pop(self.data_prefix(tenant, gen), None)

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
            current = result[0] or "1"
            if current == expected:
                return result[1:]
            self._gens[tenant] = int(current)
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

    def _commit(self, steps: Sequence[BatchStep], what: str) -> None:
        pending = [PendingStep(tenant, events, position) for tenant, events, position in steps
                   if events or position is not None]
        if not pending:
            return
        with self._guard(what, pending[0].tenant if len(pending) == 1 else None):
            self._register_all(p.tenant for p in pending)
            self._load_pv_lengths(pending)
            until_done(pending, self._apply_once, lambda p: p.tenant, failure=KEPT_CONFLICTING)

    def _apply_once(self, pending: list[PendingStep]) -> list[PendingStep]:
        """Send each step's APPLY once, with the current guesses; the steps to send again."""
        tries: list[str] = []
        calls = self._attempts(pending, tries)
        results = eval_many(self._client, self._apply_script, list(calls) if len(pending) == 1 else calls)
        return [p for p, d, result in zip(pending, tries, results) if not self._settle(p, d, result)]

    def _attempts(self, pending: list[PendingStep], tries: list[str]) -> Iterator[tuple[list[str], list[Any]]]:
        """The APPLY (keys, args) of each step, encoded as they are sent (the server runs the steps sent
        before meanwhile); the data prefix each was planned on goes to `tries`."""
        for p in pending:
            keys, args, d = self._attempt(p)
            tries.append(d)
            yield keys, args

    def _load_pv_lengths(self, pending: list[PendingStep]) -> None:
        """The provenance list lengths this client does not know yet, in one round trip (the APPLY
        script checks them anyway: a wrong one costs a retry of that step)."""
        missing = []
        for p in pending:
            d = self._n(p.tenant).data(self._gen_guess(p.tenant)[0])
            if d not in self._pv_len:
                missing.append(d)
        if len(missing) < 2:
            return          # _attempt reads a single one
        pipe = self._client.pipeline(transaction=False)
        for d in missing:
            pipe.llen(d + "pv")
        for d, n in zip(missing, pipe.execute()):
            self._pv_len[d] = int(n)


    def _attempt(self, p: PendingStep) -> tuple[list[str], list[Any], str]:
        """Keys and arguments of the APPLY script for a step, with the current guesses; and the data prefix."""
        names = self._n(p.tenant)
        gen, expected = self._gen_guess(p.tenant)
        d = names.data(gen)
        base = self._pv_len.get(d)
        if base is None:
            base = self._pv_len[d] = int(self._client.llen(d + "pv"))
        if p.batch is None or p.batch.args[0] != str(base):
            p.batch = ApplyBatch(p.events, base, p.field, p.offset_arg, p.latest, p.lag)
        return [names.gen, *p.batch.keys(d)], [expected, *p.batch.args], d

    def _settle(self, p: PendingStep, d: str, result: list[Any]) -> bool:
        """Take the APPLY script's answer; True when the step is done, else the guesses are corrected."""
        code = int(result[0])
        if code == 1:
            self._pv_len[d] = int(result[1])
            return True
        if code == 0:
            old = self._gens.get(p.tenant, 1)
            self._gens[p.tenant] = int(result[1])
            if self.strict_generations and p.tenant not in self._pins:
                raise GenerationChanged(p.tenant, old, int(result[1]))
        elif code == 2:
            self._pv_len[d] = int(result[1])
        elif code == 4:
            raise state_behind(p, result[1])
        else:
            applied = set(result[1:])
            p.events = [e for e in p.events if e[1] not in applied]
            p.batch = None
        return False

    # ---- primitive reads -----------------------------------------------------------------------

    def has_event(self, tenant: str, event_id: str) -> bool:
        with self._guard("has_event", tenant):
            return bool(self._tx(tenant, lambda p, d: p.sismember(d + "ev", event_id))[0])

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
            value = self._tx(tenant, lambda p, d: p.hget(d + "m", offset_field(topic, partition)))[0]
        return None if value is None else int(value)

    def entity_recorded_at(self, tenant: str, entity: str) -> Micros | None:
        with self._guard("entity_recorded_at", tenant):
            value = self._tx(tenant, lambda p, d: p.lindex(d + "x:" + escape(entity), 0))[0]
        return None if value is None else int(value)

    def recorded_many(self, tenant: str, entities: list[str]) -> list[Micros | None]:
        """First recorded_at of several entities in one transaction."""
        if not entities:
            return []

        def fill(p: Any, d: str) -> None:
            for e in entities:
                p.lindex(d + "x:" + escape(e), 0)
        with self._guard("recorded_many", tenant):
            values = self._tx(tenant, fill)
        return [None if v is None else int(v) for v in values]

    def keys(self, tenant: str, entity: str) -> list[Key]:
        with self._guard("keys", tenant):
            raw = self._tx(tenant, lambda p, d: p.lrange(d + "x:" + escape(entity), 1, -1))[0]
        return [index_key(entity, element) for element in raw]

    def versions_many(self, tenant: str, keys: list[Key], known_at: Micros | None) -> list[list[Version]]:
        if not keys:
            return []
        return [tl.versions(known_at) for tl in self._timelines(tenant, keys)]

    def recorded_versions_many(self, tenant: str, keys: list[Key], known_at: Micros | None
                               ) -> list[list[tuple[Version, Assertion | None]]]:
        if not keys:
            return []
        return [tl.recorded_versions(known_at) for tl in self._timelines(tenant, keys)]

    def read_views(self, requests: list[ViewRequest], at: Micros, known_at: Micros | None) -> list[EntityView | None]:
        """Each view by one VIEW script call (index, as-of winners, relation timelines, provenance), all
        requests in one round trip; with `known_at`, whole timelines folded here."""
        if not requests:
            return []
        common = ["1" if known_at is not None else "", clamped_point(at)]

        def build(r: ViewRequest) -> Build:
            e = escape(r.entity)
            scopes = ["0"] if r.scopes is None else ["1", *(escape(s) for s in r.scopes)]
            return lambda d: ([d + "pv", d + "x:" + e, d + "z:" + e, d + "m", d + RELATION_ENDS],
                              [*common, r.parts, d + "z:", *scopes])
        with self._guard("view", requests[0].tenant if len(requests) == 1 else None):
            results = self._script_many(self._view_script, [(r.tenant, build(r)) for r in requests])
        return [decode_view(r.entity, result, at, known_at) for r, result in zip(requests, results)]

    def _timelines(self, tenant: str, keys: list[Key], gen: int | None = None,
                   provenance: ProvenanceCache | None = None) -> list[Timeline]:
        """Whole timelines with provenance, by the READ script in chunks: all of the current generation
        (restarting when it switches between chunks), or all of `gen` when given."""
        names = self._n(tenant)
        resolve = "0" if provenance is not None else "1"

        def attempt() -> list[Timeline] | None:
            g, expected = (gen, "") if gen is not None else self._gen_guess(tenant)
            d = names.data(g)
            out: list[Timeline] = []
            for chunk in chunks(keys):
                zsets = [d + "z:" + escape(k[1]) for k in chunk]
                with self._guard("versions", tenant):
                    result = self._read_script(keys=[names.gen, d + "pv", *zsets],
                                        args=[expected, resolve, *(prefix_of(k) for k in chunk)])
                if result[0] == 0:
                    self._gens[tenant] = int(result[1])
                    return None
                prov = provenance or ProvenanceCache()
                pairs = result[2]
                for i in range(0, len(pairs), 2):
                    prov.add(pairs[i], pairs[i + 1])
                out += (timeline_of(members, prov) for members in result[1])
            return out
        return in_current(tenant, attempt)

    def event_ids(self, tenant: str) -> list[str]:
        with self._guard("event_ids", tenant):
            return sorted(self._tx(tenant, lambda p, d: p.smembers(d + "ev"))[0])

    def freshness(self, tenant: str) -> Freshness:
        """known_through and lag from the meta hash (what the workers' last commits stored)."""
        with self._guard("freshness", tenant):
            return freshness_of(self._tx(tenant, lambda p, d: p.hmget(d + "m", "kt", "lag"))[0])

    def event_mark(self, tenant: str, event_id: str) -> str | None:
        with self._guard("event_mark", tenant):
            return self._tx(tenant, lambda p, d: p.hget(d + MARKS, event_id))[0]

    def event_marks(self, tenant: str) -> dict[str, str]:
        with self._guard("event_marks", tenant):
            return dict(self._tx(tenant, lambda p, d: p.hgetall(d + MARKS))[0])

    def latest_recorded(self, tenant: str) -> Micros | None:
        with self._guard("latest_recorded", tenant):
            value = self._tx(tenant, lambda p, d: p.hget(d + "m", LATEST))[0]
        return None if value is None else int(value)

    def search_version(self, tenant: str) -> object:
        """(generation, write counter): changes with every applied write and every generation switch."""
        with self._guard("search_version", tenant):
            value = self._tx(tenant, lambda p, d: p.hget(d + "m", "sv"))[0]
        return (self._gen_guess(tenant)[0], int(value or 0))

    def has_tenant(self, tenant: str) -> bool:
        """Whether the tenant's current generation holds data (one transaction)."""
        with self._guard("has_tenant", tenant):
            return bool(self._tx(tenant, lambda p, d: p.exists(d + "ev", d + "ents"))[0])

    def assertions_many(self, tenant: str, keys: list[Key]) -> list[list[Assertion]]:
        return [list(tl.assertions()) for tl in self._timelines(tenant, keys)] if keys else []


    # ---- generations ---------------------------------------------------------------------------

    def current_generation(self, tenant: str) -> int:
        """The generation reads and writes of this tenant go to (1 until switched)."""
        with self._guard("current_generation", tenant):
            gen = int(self._client.get(self._n(tenant).gen) or 1)
        self._gens[tenant] = gen
        return gen

    def for_generation(self, tenant: str, gen: int) -> RedisStore:
        """A view sharing this connection whose reads and writes of `tenant` go to generation `gen`."""
        self._n(tenant)
        if int(gen) < 1:
            raise UsageError(f"bad generation {gen!r}: generations start at 1")
        view = type(self)(self._client, namespace=self.namespace, pins={**self._pins, tenant: int(gen)},
                          owns_client=False)
        view._registered = self._registered
        view.cold = self.cold
        return view
