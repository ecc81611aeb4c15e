"""Whole-tenant walks of RedisStore: the tenants of a namespace, every key of a tenant (`dump`, the digest's
input) and every entity's index (search, rules), all read from the generation current when the walk starts.

Walks read the generation's entity set and index lists in chunks of pipelined commands, not in one
transaction: a walk may see writes applied while it runs, never another generation.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

from ...timeline import Assertion, Timeline
from ...times import Micros
from ..base import Key
from .codec import ProvenanceCache
from .keys import TenantKeys, escape, index_key
from .transport import CHUNK, Client, chunks


class TenantWalks:
    """Whole-tenant reads of RedisStore (a mixin over its client, key names, pins and guard)."""

    _client: Client
    _gens: dict[str, int]
    _pins: dict[str, int]
    _registry: str
    _guard: Callable[..., AbstractContextManager[None]]
    _n: Callable[[str], TenantKeys]
    _timelines: Callable[..., list[Timeline]]

    def tenants(self) -> list[str]:
        """Tenants of the namespace whose current generation holds data, sorted."""
        with self._guard("tenants"):
            members = sorted(self._client.smembers(self._registry))
            if not members:
                return []
            pipe = self._client.pipeline(transaction=False)
            for t in members:
                pipe.get(self._n(t).gen)
            gens = [self._pins.get(t) or int(g or 1) for t, g in zip(members, pipe.execute())]
            pipe = self._client.pipeline(transaction=False)
            for t, g in zip(members, gens):
                d = self._n(t).data(g)
                pipe.exists(d + "ev", d + "ents")
            return [t for t, n in zip(members, pipe.execute()) if n]

    # ---- whole-tenant walks (of the generation current when they start) -----------------------

    def _snapshot_gen(self, tenant: str) -> int:
        pinned = self._pins.get(tenant)
        if pinned is not None:
            return pinned
        gen = int(self._client.get(self._n(tenant).gen) or 1)
        self._gens[tenant] = gen
        return gen

    def _walk_entities(self, tenant: str, what: str, type: str | None = None) -> tuple[int, str, list[str]]:
        """(generation, its data prefix, its entities sorted, of `type` when given) for a walk starting now."""
        with self._guard(what, tenant):
            gen = self._snapshot_gen(tenant)
            d = self._n(tenant).data(gen)
            entities = sorted(self._client.smembers(d + "ents"))
        if type is not None:
            entities = [e for e in entities if e.startswith(type + ":")]
        return gen, d, entities

    def _entity_index(self, d: str) -> dict[str, list[str]]:
        """Every entity of a generation with its index list elements (first recorded_at dropped)."""
        entities = sorted(self._client.smembers(d + "ents"))
        out: dict[str, list[str]] = {}
        for chunk in chunks(entities):
            pipe = self._client.pipeline(transaction=False)
            for e in chunk:
                pipe.lrange(d + "x:" + escape(e), 1, -1)
            for e, elements in zip(chunk, pipe.execute()):
                out[e] = elements
        return out

    def _all_provenance(self, d: str) -> ProvenanceCache:
        prov = ProvenanceCache(fetch=lambda n: self._client.lindex(d + "pv", n))
        size = int(self._client.llen(d + "pv"))
        for start in range(0, size, 10 * CHUNK):
            entries = self._client.lrange(d + "pv", start, start + 10 * CHUNK - 1)
            for i, text in enumerate(entries):
                prov.add(start + i, text)
        return prov

    def dump(self, tenant: str) -> Iterator[tuple[Key, list[Assertion]]]:
        with self._guard("dump", tenant):
            gen = self._snapshot_gen(tenant)
            d = self._n(tenant).data(gen)
            keys = sorted({index_key(e, el) for e, elements in self._entity_index(d).items() for el in elements})
            prov = self._all_provenance(d)
        for chunk in chunks(keys):
            for key, tl in zip(chunk, self._timelines(tenant, chunk, gen=gen, provenance=prov)):
                yield key, list(tl.assertions())

    def entity_indexes(self, tenant: str, type: str | None = None) -> Iterator[tuple[str, Micros, list[Key]]]:
        """Every entity (of `type`) of the generation current when the walk starts, from its index list."""
        _, d, entities = self._walk_entities(tenant, "entity_indexes", type)
        for chunk in chunks(entities):
            with self._guard("entity_indexes", tenant):
                pipe = self._client.pipeline(transaction=False)
                for e in chunk:
                    pipe.lrange(d + "x:" + escape(e), 0, -1)
                rows = pipe.execute()
            for e, row in zip(chunk, rows):
                if row:
                    yield e, int(row[0]), [index_key(e, element) for element in row[1:]]
