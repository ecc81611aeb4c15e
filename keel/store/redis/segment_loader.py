"""Bulk loads of a layout-2 generation nobody reads yet (a replay's shadow).

Layout 2's APPLY script costs Redis little per event (one APPEND per entity and step), so the loader sends the
steps through it, on a store pinned to the generation: the generation ends exactly as the same commits would
leave it. `flush` sends the queued steps in one round trip; after a failure, the next flush sends them again
and the script skips the event ids already applied (offsets only move forward), so nothing is written twice.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...errors import UsageError
from ..base import BatchStep, EventWrites, Position
from .keys import MARKS
from .transport import guard

if TYPE_CHECKING:
    from .segment_store import SegmentStore

DATA_KEYS = ("ev", "m", "ents", "fr")


class SegmentLoader:
    """The GenerationLoader interface (add, flush, pending, abort, close) over layout 2's commits."""

    def __init__(self, store: SegmentStore, tenant: str, gen: int) -> None:
        self.tenant = tenant
        self.gen = int(gen)
        if self.gen < 1:
            raise UsageError(f"bad generation {gen!r}: generations start at 1")
        if self.gen == store.current_generation(tenant):
            raise UsageError(f"generation {gen} is the current generation of tenant {tenant!r}: a bulk "
                             f"load writes only a generation nobody reads")
        d = store.data_prefix(tenant, self.gen)
        with guard(store.namespace, "load_generation", tenant):
            if int(store.client.exists(*(d + k for k in (*DATA_KEYS, MARKS)))):
                raise UsageError(f"generation {gen} of tenant {tenant!r} holds data: a bulk load starts from "
                                 f"an empty generation")
        store.register_tenant(tenant)
        self.view = store.for_generation(tenant, self.gen)
        self.queue: list[BatchStep] = []

    @property
    def pending(self) -> int:
        """Steps not known to be written yet."""
        return len(self.queue)

    def add(self, events: Sequence[EventWrites], position: Position | None) -> None:
        """Queue one step, as `commit_batch(tenant, events, position)` takes it."""
        self.queue.append((self.tenant, list(events), position))

    def flush(self, wait: bool = True) -> None:
        """Write the queued steps (each atomic, in order); `wait` is accepted for GenerationLoader's interface:
        the steps are always answered before this returns."""
        if self.queue:
            self.view.commit_many(self.queue)
            self.queue = []

    def abort(self) -> None:
        """Give up: nothing is in flight once a flush returned or raised."""
        self.queue = []

    def close(self) -> None:
        """Nothing to release: the loader shares the store's connections."""
