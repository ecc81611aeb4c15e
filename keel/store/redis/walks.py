"""Where whole-tenant walks start (a part of RedisBase): the tenants of a namespace, and the entities of the
generation current when a walk starts, which RedisStore's `dump` (the digest's input) and `entity_indexes`
(search, rules) then read in chunks of pipelined commands, not in one transaction: a walk may see writes applied
while it runs, never another generation.
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from .keys import IDS, TenantKeys, gen_keys, generation_of
from .transport import Client


class TenantWalks:
    """Whole-tenant reads of RedisStore (a mixin over its client, key names, pins and guard)."""

    _client: Client
    _gens: dict[str, int]
    _pins: dict[str, int]
    _registry: str
    _guard: Callable[..., AbstractContextManager[None]]
    _n: Callable[[str], TenantKeys]

    def tenants(self) -> list[str]:
        """Tenants of the namespace whose current generation holds data, sorted."""
        with self._guard("tenants"):
            members = sorted(self._client.smembers(self._registry))
            if not members:
                return []
            pipe = self._client.pipeline(transaction=False)
            for t in members:
                pipe.get(self._n(t).gen)
            gens = [self._pins.get(t) or generation_of(g) for t, g in zip(members, pipe.execute())]
            pipe = self._client.pipeline(transaction=False)
            for t, g in zip(members, gens):
                holds_data(pipe, self._n(t).data(g))
            found = pipe.execute()
            return [t for t, first, ids in zip(members, found[::2], found[1::2]) if first or ids]

    # ---- whole-tenant walks (of the generation current when they start) -----------------------

    def _snapshot_gen(self, tenant: str) -> int:
        pinned = self._pins.get(tenant)
        if pinned is not None:
            return pinned
        gen = generation_of(self._client.get(self._n(tenant).gen))
        self._gens[tenant] = gen
        return gen

    def _walk_entities(self, tenant: str, what: str, type: str | None = None) -> tuple[int, str, list[str]]:
        """(generation, its data prefix, its entities sorted, of `type` when given) for a walk starting now."""
        with self._guard(what, tenant):
            gen = self._snapshot_gen(tenant)
            d = self._n(tenant).data(gen)
            entities = sorted(self._client.hkeys(gen_keys(d).first))
        if type is not None:
            entities = [e for e in entities if e.startswith(type + ":")]
        return gen, d, entities


def holds_data(pipe: Any, d: str) -> None:
    """Queue what says whether generation `d` holds data: its entities (`fr`), its count of event ids (their
    buckets: event_ids.py). Two answers; either true means data."""
    pipe.exists(gen_keys(d).first)
    pipe.hexists(gen_keys(d).meta, IDS)
