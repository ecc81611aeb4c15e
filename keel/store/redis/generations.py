"""Generations of a tenant's graph: hand one out, bulk load it, cut over to it, drop it.

A replay rebuilds a tenant in a new generation while the current one keeps serving, then switches readers and
writers over atomically (`switch_when_caught_up`). This is the part of RedisStore that manages generations
as a whole; reads and writes of the current generation are in store.py.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...errors import ColdTierNotConfigured, UsageError
from .cold import ColdTier, settings_key
from .keys import (
    BUCKETS,
    LAYOUT1_ENTITY_KEYS,
    LAYOUT1_KEYS,
    LAYOUT2_KEYS,
    OLD_ENTITY_SET,
    applied_key,
    escape,
    gen_keys,
    generation_of,
    layout_key,
    offset_field,
    watermarked_key,
)
from .transport import Client, chunks


class GenerationAdmin:
    """Generation management of RedisStore (a mixin over its key names, guard and caches)."""

    _client: Client
    _gens: dict[str, int]
    _registered: set[str]
    _registry: str
    _new_gen_script: Any
    _switch_script: Any
    _switch_if_script: Any
    namespace: str
    cold: ColdTier | None = None     # the cold tier of closed segments (cold.py), when configured

    def new_generation(self, tenant: str) -> int:
        """A generation number never handed out before for this tenant (empty, not current)."""
        n = self._n(tenant)
        with self._guard("new_generation", tenant):
            return int(self._new_gen_script(keys=[n.gen, n.gseq]))

    def switch_generation(self, tenant: str, gen: int) -> None:
        """Make `gen` the tenant's current generation, atomically for every reader and writer."""
        if int(gen) < 1:
            raise UsageError(f"bad generation {gen!r}: generations start at 1")
        n = self._n(tenant)
        with self._guard("switch_generation", tenant):
            self.register_tenant(tenant)
            self._switch_script(keys=[n.gen, n.gseq], args=[int(gen)])
        self._gens[tenant] = int(gen)

    def switch_when_caught_up(self, tenant: str, expected: int, gen: int,
                              positions: Sequence[tuple[str, int]]) -> bool | str:
        """Cut over to `gen` atomically if the current generation is still `expected` and `gen` has applied
        at least as far as the current one on every (topic, partition). True when switched; False when the
        current generation moved; else the lagging offset field (read further and try again)."""
        n = self._n(tenant)
        with self._guard("switch_when_caught_up", tenant):
            self.register_tenant(tenant)
            result = self._switch_if_script(keys=[n.gen, n.gseq, n.data(int(expected)) + "m", n.data(int(gen)) + "m"],
                                     args=[str(int(expected)), int(gen),
                                           *(offset_field(t, p) for t, p in positions)])
        if int(result[0]) == 1:
            self._gens[tenant] = int(gen)
            return True
        return False if int(result[0]) == 0 else str(result[1])

    def drop_generation(self, tenant: str, gen: int) -> int:
        """Delete a generation that is not current, through its entity index; returns keys deleted."""
        if int(gen) == self.current_generation(tenant):
            raise UsageError(f"generation {gen} is the current generation of tenant {tenant!r}; "
                             f"switch to another one before dropping it")
        return self._drop_data(tenant, int(gen))

    def _drop_data(self, tenant: str, gen: int) -> int:
        self._drop_cold(tenant, gen)
        names = self.droppable_keys(tenant, gen)
        with self._guard("drop_generation", tenant):
            pipe = self._client.pipeline(transaction=False)
            for chunk in reversed(list(chunks(names))):    # the index keys (first chunk) go last
                pipe.execute_command("UNLINK", *chunk)   # (a cluster pipeline's unlink() takes one key)
            return sum(int(n) for n in pipe.execute())

    def _drop_cold(self, tenant: str, gen: int) -> None:
        """A generation's rows in the cold tier go first (cold.py): if PostgreSQL fails, nothing of the generation
        is dropped yet and a rerun drops both. A process without the cold tier refuses to drop a generation
        that has cold segments (their rows would stay behind)."""
        if self.cold is not None:
            self.cold.drop_generation(self.namespace, tenant, gen)
            return
        with self._guard("drop_generation", tenant):
            held = int(self._client.exists(gen_keys(self._n(tenant).data(int(gen))).cold))
        if held:
            raise ColdTierNotConfigured(self.namespace, tenant)

    def droppable_keys(self, tenant: str, gen: int) -> list[str]:
        """The keys a drop of one generation unlinks: every name its data may have, layouts 1's and 2's too (a
        generation replaced while `keel replay --all` converts a namespace from a removed layout is in it),
        from its entities (the fields of `fr`, and layouts 1's and 2's entity set), closed-segment counts and event-id
        buckets, without asking which exist (UNLINK skips the others). The fixed keys come first: `fr` and the
        meta hash, which name the rest, go last."""
        d = self._n(tenant).data(int(gen))
        with self._guard("drop_generation", tenant):
            k = gen_keys(d)
            entities = sorted({*self._client.hkeys(k.first), *self._client.smembers(d + OLD_ENTITY_SET)})
            closed = self._client.hgetall(k.closed)
            buckets = int(self._client.hget(k.meta, BUCKETS) or 1)
        fixed = dict.fromkeys([*k.fixed, k.closed, k.cold, k.changes, *(d + x for x in (*LAYOUT1_KEYS, *LAYOUT2_KEYS))])
        names = list(fixed)
        names += (k.id_bucket(b) for b in range(buckets))
        for e in entities:
            x = escape(e)
            names += (k.open_segment(x), k.incoming(x), k.valid_index(x), k.known_index(x),
                      *(d + p + x for p in LAYOUT1_ENTITY_KEYS))
        names += (k.closed_segment(x, j) for x, n in closed.items() for j in range(int(n)))
        return names

    def drop_tenant(self, tenant: str) -> int:
        """Delete every generation of a tenant and forget it (the log rebuilds it); returns keys deleted."""
        n = self._n(tenant)
        with self._guard("drop_tenant", tenant):
            current, highest = self._client.mget(n.gen, n.gseq)
            top = max(generation_of(current), int(highest or 1))
        deleted = sum(self._drop_data(tenant, g) for g in range(1, top + 1))
        with self._guard("drop_tenant", tenant):
            deleted += int(self._client.unlink(n.gen, n.gseq))
            self._client.srem(self._registry, tenant)
        self._registered.discard(tenant)
        self._gens.pop(tenant, None)
        if self.cold is not None:                      # rows of generations a drop missed (an interrupted move)
            self.cold.drop_tenant(self.namespace, tenant)
        return deleted

    def drop_namespace(self) -> int:
        """Delete every tenant of the namespace (a cartridge's whole graph), its layout stamp, its partitions'
        applied watermarks and their mark; returns keys deleted."""
        with self._guard("drop_namespace"):
            tenants = sorted(self._client.smembers(self._registry))
        deleted = sum(self.drop_tenant(t) for t in tenants)
        with self._guard("drop_namespace"):             # and its layout stamp: a namespace made again is new
            deleted += int(self._client.unlink(self._registry, layout_key(self.namespace),
                                               applied_key(self.namespace), watermarked_key(self.namespace),
                                               settings_key(self.namespace)))
        if self.cold is not None:
            self.cold.drop_namespace(self.namespace)
        return deleted
