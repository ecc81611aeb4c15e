"""The handler registry a cartridge's handlers.py fills with `@registry.on(event_type)`, and its upcasters with
`@registry.upcast(event_type, version)` (keel/upcast.py)."""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

Handler = Callable[[Any, Any], None]
Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


class Registry:
    """Maps event types to handler functions `handler(event, store)`, and (event type, version) to upcasters
    `upcaster(payload) -> payload of the next version`."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self._counts: Counter[str] = Counter()
        self._upcasters: dict[tuple[str, int], Upcaster] = {}
        self._upcast_counts: Counter[tuple[str, int]] = Counter()

    def on(self, event_type: str) -> Callable[[Handler], Handler]:
        """Decorator: register the handler of one event type."""
        def register(fn: Handler) -> Handler:
            self._counts[event_type] += 1
            self._handlers.setdefault(event_type, fn)
            return fn
        return register

    def upcast(self, event_type: str, version: int) -> Callable[[Upcaster], Upcaster]:
        """Decorator: register the function that turns a `version` payload (a dict, a copy the function may
        change) of `event_type` into the payload of version `version + 1`. It must be deterministic: the
        payload is all it may use."""
        def register(fn: Upcaster) -> Upcaster:
            self._upcast_counts[(event_type, version)] += 1
            self._upcasters.setdefault((event_type, version), fn)
            return fn
        return register

    def handler(self, event_type: str) -> Handler | None:
        return self._handlers.get(event_type)

    def event_types(self) -> list[str]:
        return sorted(self._handlers)

    def duplicates(self) -> dict[str, int]:
        return {ev: n for ev, n in sorted(self._counts.items()) if n > 1}

    def upcasters(self) -> dict[tuple[str, int], Upcaster]:
        """{(event type, version): the upcaster from that version to the next}."""
        return dict(self._upcasters)

    def upcast_duplicates(self) -> dict[tuple[str, int], int]:
        return {k: n for k, n in self._upcast_counts.items() if n > 1}
