"""What a replay uses of a bulk loader of a generation nobody reads yet (its shadow): `BulkLoader`, the interface
`RedisStore.load_generation` gives (segment_loader.SegmentLoader), and `LoadTarget`, what a loader needs of its
store."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import hiredis

from ..base import EventWrites, Position
from .transport import Client

_MULTI, _EXEC = hiredis.pack_command(("MULTI",)), hiredis.pack_command(("EXEC",))


class LoadTarget(Protocol):
    """What a loader needs of its store (RedisStore has it): the namespace, the client, a generation's key
    prefix, the current generation, the tenant registry and the store's cache of a generation."""
    namespace: str

    @property
    def client(self) -> Client: ...

    def data_prefix(self, tenant: str, gen: int) -> str: ...

    def current_generation(self, tenant: str) -> int: ...

    def register_tenant(self, tenant: str) -> None: ...

    def invalidate(self, tenant: str, gen: int) -> None: ...


class BulkLoader(Protocol):
    """A bulk loader of one empty generation of one tenant (`RedisStore.load_generation`): it takes the steps
    `commit_batch` would, writes them in order, each atomic, and never writes one twice."""

    @property
    def pending(self) -> int:
        """Steps not known to be written yet."""
        ...

    def add(self, events: Sequence[EventWrites], position: Position | None) -> None:
        """Queue one step, as `commit_batch(tenant, events, position)` takes it."""
        ...

    def flush(self, wait: bool = True) -> None:
        """Write the queued steps; `wait=False` may return before Redis answered (the next flush raises
        their error, with the steps not written queued again)."""
        ...

    def abort(self) -> None:
        """Give up: once this returns, no step is in flight."""
        ...

    def close(self) -> None:
        """Wait for the steps in flight (their error is the next flush's) and free what the loader holds."""
        ...
