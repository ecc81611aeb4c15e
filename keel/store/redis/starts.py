"""What a worker's mirror reads of a tenant first (Store.tenant_starts), many tenants per transaction.

A worker loads hundreds of tenants at its start and after each rebalance; reading each one's event ids, marks,
latest recorded_at and applied offsets as separate generation-checked transactions cost ~13x the CPU.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import redis

from ..base import TenantStart
from .event_ids import unpack_mark
from .keys import BUCKETS, LATEST, TenantKeys, gen_keys, generation_of, offset_field
from .retries import until_done
from .transport import Client, chunks

STARTS_CHUNK = 64           # tenants per transaction


class TenantStarts:
    """Store.tenant_starts of RedisStore (a mixin over its client, key names, generation guesses and guard)."""

    _client: Client
    _gens: dict[str, int]
    _guard: Callable[..., AbstractContextManager[None]]
    _n: Callable[[str], TenantKeys]
    _gen_guess: Callable[[str], tuple[int, str]]
    queue_buckets: Callable[[Any, str], int]
    take_buckets: Callable[[str, int, Any, list[dict[str, str]]], dict[str, str] | None]

    def tenant_starts(self, wanted: Sequence[tuple[str, Iterable[tuple[str, int]]]]) -> list[TenantStart]:
        """Store.tenant_starts in one MULTI/EXEC per `STARTS_CHUNK` tenants on a single node (each tenant's
        generation checked in it; one that switched is read again), one per tenant on a Cluster (a tenant's
        keys share a hash slot, different tenants' do not)."""
        asked = [(tenant, list(tps)) for tenant, tps in wanted]
        if not asked:
            return []
        out: list[TenantStart | None] = [None] * len(asked)
        size = STARTS_CHUNK if isinstance(self._client, redis.Redis) else 1

        def attempt(todo: list[int]) -> list[int]:
            return [i for chunk in chunks(todo, size) for i in self._starts(asked, chunk, out)]
        with self._guard("tenant_starts", asked[0][0] if len(asked) == 1 else None):
            until_done(list(range(len(asked))), attempt, lambda i: asked[i][0])
        return out        # type: ignore[return-value]

    def _starts(self, asked: list[tuple[str, list[tuple[str, int]]]], chunk: list[int],
                out: list[TenantStart | None]) -> list[int]:
        """Read the TenantStarts of `chunk` (indexes into `asked`) in one transaction; returns the indexes
        whose generation switched or whose event ids had more buckets than guessed (guesses corrected, to be
        read again: event_ids.py)."""
        pipe = self._client.pipeline(transaction=True)
        checked = []
        for i in chunk:
            tenant, tps = asked[i]
            names = self._n(tenant)
            gen, expected = self._gen_guess(tenant)
            d = names.data(gen)
            if expected:
                pipe.get(names.gen)
            pipe.hmget(gen_keys(d).meta, LATEST, BUCKETS, *[offset_field(*tp) for tp in tps])
            checked.append((expected, d, self.queue_buckets(pipe, d)))
        results = iter(pipe.execute())
        left = []
        for i, (expected, d, guess) in zip(chunk, checked):
            current = str(generation_of(next(results))) if expected else expected
            meta = next(results)
            ids = self.take_buckets(d, guess, meta[1], [next(results) for _ in range(guess)])
            if current != expected:
                self._gens[asked[i][0]] = int(current)
                left.append(i)
                continue
            if ids is None:
                left.append(i)
                continue
            offsets = {tp: None if v is None else int(v) for tp, v in zip(asked[i][1], meta[2:])}
            marks = {event_id: mark for event_id, value in ids.items() if (mark := unpack_mark(value)) is not None}
            out[i] = (sorted(ids), offsets, marks, None if meta[0] is None else int(meta[0]))
        return left
