"""Values kept by the text of the segment they were derived from, within a budget of text: a hit is exactly what
deriving it again gives, and nothing goes stale (a changed segment is another text). The present views' folds
(`FoldCache`) and the past reads' decoded closed segments (`CLOSED`) are kept this way; the present views
themselves too (segment_views.PresentViews)."""
from __future__ import annotations

import threading
from typing import Any, Generic, TypeVar

from .segments import Fold, add_rows, decode, wanted_rows

K = TypeVar("K")
V = TypeVar("V")


class TextBudget(Generic[K, V]):
    """Values kept by keys that name a segment's text, at most `budget` characters of those texts in all, the
    oldest going first; a text over a sixteenth of the budget is never kept (it would push out many others). An
    empty text is kept (it costs nothing): a subject with no open segment then folds to the same Fold each time.
    Thread-safe: a hit takes no lock, a miss's insert and evictions do (a race may compute a value twice)."""

    BUDGET = 1 << 20            # characters of text, unless given

    def __init__(self, budget: int | None = None) -> None:
        self._entries: dict[K, tuple[V, int]] = {}      # key -> (value, characters of its text)
        self._held = 0
        self._lock = threading.Lock()
        self.budget = self.BUDGET if budget is None else budget

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

    BUDGET = 2 << 20

    def get(self, text: str) -> list[list[Any]]:
        got = self._kept(text)
        if got is None:
            got = decode(text)
            self._keep(text, len(text), got)
        return got


class FoldCache(TextBudget[tuple[str, Any], Fold]):
    """Open segments folded for present views, by the segment's text and the relations wanted of it.

    A view of an entity reads its open segment and that of every subject of a relation naming it (a debt: its
    25 dues), and folding them was most of its time, though a segment changes far less often than it is read.
    The text itself is the key, so a hit is exactly what folding it again gives (a changed segment is another
    key: nothing goes stale). Of a subject only the relations naming the viewed entity are folded (its other
    timelines are left empty); `Fold.serves` still says whether the segment serves a read. The entries hold at
    most `budget` characters of text, the oldest going first; folded, they take a few times that in Python
    objects. Thread-safe (a race may fold a segment twice); its folds are read, never changed, by the views."""

    BUDGET = 4 << 20

    def get(self, text: str, relations: list[str] | None = None) -> Fold:
        """The fold of a segment: of every timeline (`relations` None: the viewed entity's own), or of the
        relations P named (a subject's)."""
        key = (text, None if relations is None else relations[0] if len(relations) == 1
               else tuple(sorted(set(relations))))
        got = self._kept(key)
        if got is not None:
            return got
        blocks = decode(text)
        got = Fold(blocks, whole=False, deltas=False)
        if relations is None:
            got.fill(blocks)
        else:
            for provs, p, rows in wanted_rows(blocks, set(relations)):
                add_rows(got.timelines, p, provs, rows)
        self._keep(key, len(text), got)
        return got


CLOSED = ClosedBlocks()     # one per process: keyed by text, it serves every store
