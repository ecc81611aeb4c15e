"""The handler registry a cartridge's handlers.py fills with `@registry.on(event_type)`."""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

Handler = Callable[[Any, Any], None]


class Registry:
    """Maps event types to handler functions `handler(event, store)`."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self._counts: Counter[str] = Counter()

    def on(self, event_type: str) -> Callable[[Handler], Handler]:
        """Decorator: register the handler of one event type."""
        def register(fn: Handler) -> Handler:
            self._counts[event_type] += 1
            self._handlers.setdefault(event_type, fn)
            return fn
        return register

    def handler(self, event_type: str) -> Handler | None:
        return self._handlers.get(event_type)

    def event_types(self) -> list[str]:
        return sorted(self._handlers)

    def duplicates(self) -> dict[str, int]:
        return {ev: n for ev, n in sorted(self._counts.items()) if n > 1}
