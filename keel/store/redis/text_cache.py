"""Values kept by the text of the segment they were derived from, within a budget of text: a hit is exactly what
deriving it again gives, and nothing goes stale (a changed segment is another text). The present views' folds
(segment_views.FoldCache) and the past reads' decoded closed segments (`CLOSED`) are kept this way."""
from __future__ import annotations

import threading
from typing import Any, Generic, TypeVar

from .segments import decode

K = TypeVar("K")
V = TypeVar("V")


class TextBudget(Generic[K, V]):
    """Values kept by keys that name a segment's text, at most `budget` characters of those texts in all, the
    oldest going first; a text over a sixteenth of the budget is never kept (it would push out many others). An
    empty text is kept (it costs nothing): a subject with no open segment then folds to the same Fold each time.
    Thread-safe: a hit takes no lock, a miss's insert and evictions do (a race may compute a value twice)."""

    def __init__(self, budget: int) -> None:
        self._entries: dict[K, tuple[V, int]] = {}      # key -> (value, characters of its text)
        self._held = 0
        self._lock = threading.Lock()
        self.budget = budget

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._held = 0

    def _kept(self, key: K) -> V | None:
        got = self._entries.get(key)
        return None if got is None else got[0]

    def _keep(self, key: K, size: int, value: V) -> None:
        """Keep `value` under `key`, counted as `size` characters of text (those of the texts the key names)."""
        if size > self.budget // 16:
            return
        with self._lock:
            if key in self._entries:
                return
            while self._held + size > self.budget:
                oldest = next(iter(self._entries))
                self._held -= self._entries.pop(oldest)[1]
            self._entries[key] = (value, size)
            self._held += size


class ClosedBlocks(TextBudget[str, list[list[Any]]]):
    """Closed segments decoded for past reads, by their text (so a hit is exactly what decoding it gives, and a
    text never goes stale). A closed segment never changes, and past reads near one time decode the same ones
    again: decoding them was about a quarter of such a read's Python time. Their blocks take a few times the
    text's size; read, never changed, by the readers."""

    def __init__(self, budget: int = 2 << 20) -> None:
        super().__init__(budget)

    def get(self, text: str) -> list[list[Any]]:
        got = self._kept(text)
        if got is None:
            got = decode(text)
            self._keep(text, len(text), got)
        return got


CLOSED = ClosedBlocks()     # one per process: keyed by text, it serves every store
