"""Bulk loads of a generation nobody reads yet (a replay's shadow).

The APPLY script costs Redis little per event (one APPEND per entity and step), so the loader sends the
steps through it, on a store pinned to the generation: the generation ends exactly as the same commits would
leave it. `flush` sends the queued steps in one round trip, from a thread of the loader when not waited for (Redis
runs them while the replay projects the next events); after a failure, the next flush sends them again and the
script skips the event ids already applied (offsets only move forward), so nothing is written twice.
"""
from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from typing import TYPE_CHECKING

from redis.exceptions import RedisError

from ...errors import UsageError
from ..base import BatchStep, EventWrites, Position
from .keys import gen_keys
from .loader import BulkLoader
from .transport import guard

if TYPE_CHECKING:
    from .store import RedisStore



class SegmentLoader(BulkLoader):
    """The BulkLoader (loader.py: add, flush, pending, abort, close) of the store's commits."""

    def __init__(self, store: RedisStore, tenant: str, gen: int) -> None:
        self.tenant = tenant
        self.gen = int(gen)
        if self.gen < 1:
            raise UsageError(f"bad generation {gen!r}: generations start at 1")
        if self.gen == store.current_generation(tenant):
            raise UsageError(f"generation {gen} is the current generation of tenant {tenant!r}: a bulk "
                             f"load writes only a generation nobody reads")
        d = store.data_prefix(tenant, self.gen)
        with guard(store.namespace, "load_generation", tenant):
            k = gen_keys(d)
            if int(store.client.exists(*k.fixed, k.id_bucket(0))):
                raise UsageError(f"generation {gen} of tenant {tenant!r} holds data: a bulk load starts from "
                                 f"an empty generation")
        store.register_tenant(tenant)
        self.view = store.for_generation(tenant, self.gen)
        self.d = d
        self.sv = 0                            # the generation's write counter once the flushed steps ran
        self.queue: list[BatchStep] = []
        self.ids: set[str] = set()             # event ids queued by this load
        self._sent: list[BatchStep] = []
        self._inflight: concurrent.futures.Future[None] | None = None
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="keel-segment-load")

    @property
    def pending(self) -> int:
        """Steps not known to be written yet (queued, or sent and not answered)."""
        return len(self.queue) + (len(self._sent) if self._inflight is not None else 0)

    def add(self, events: Sequence[EventWrites], position: Position | None) -> None:
        """Queue one step, as `commit_batch(tenant, events, position)` takes it: an event whose id an earlier
        step of this load carried is dropped here so that the script never refuses
        a step for it and the steps are applied in their order."""
        ids = self.ids
        kept = []
        for e in events:
            if e[1]:
                if e[1] in ids:
                    continue
                ids.add(e[1])
            kept.append(e)
        self.queue.append((self.tenant, kept, position))

    def flush(self, wait: bool = True) -> None:
        """Write the queued steps (each atomic, in order). `wait=False` returns once they are handed to the
        loader's thread, so Redis executes them while the caller projects the next ones; the next flush (or
        `wait=True`) first waits for them and raises their error, if any, with the steps not written queued
        again."""
        self._settle()
        if self.queue:
            self._sent, self.queue = self.queue, []
            self._inflight = self._thread.submit(self.view.commit_many, self._sent)
        if wait:
            self._settle()

    def _settle(self) -> None:
        inflight, self._inflight = self._inflight, None
        if inflight is None:
            return
        sent, self._sent = self._sent, []
        try:
            inflight.result()
        except BaseException:
            self.queue = self._unwritten(sent) + self.queue
            raise
        self.sv += sum(_moves_sv(step) for step in sent)

    def _unwritten(self, sent: list[BatchStep]) -> list[BatchStep]:
        """The steps of a failed flush that Redis did not execute: it executes them in order, each moving the
        write counter `sv` by one when it carries ids or writes, so the counter says how many ran (a step
        written twice would apply its id-less events twice). When the counter cannot be read, all of them."""
        try:
            ran = int(self.view.client.hget(gen_keys(self.d).meta, "sv") or 0) - self.sv
        except RedisError:
            return sent
        i = 0
        while i < len(sent) and ran > 0:
            ran -= _moves_sv(sent[i])
            i += 1
        self.sv += sum(_moves_sv(step) for step in sent[:i])
        return sent[i:]

    def abort(self) -> None:
        """Give up: once this returns, no step is in flight (the loader's thread finished its last call)."""
        if self._inflight is not None:
            concurrent.futures.wait([self._inflight])      # its error does not matter: the caller drops the shadow
        self._inflight, self._sent, self.queue = None, [], []

    def close(self) -> None:
        """Wait for the steps in flight (their error is the next flush's), then stop the loader's thread."""
        if self._inflight is not None:
            concurrent.futures.wait([self._inflight])
        self._thread.shutdown(wait=True)


def _moves_sv(step: BatchStep) -> int:
    """1 when the APPLY script moves the write counter for this step (it carries ids or writes), else 0."""
    return 1 if any(event_id or writes for writes, event_id in step[1]) else 0
