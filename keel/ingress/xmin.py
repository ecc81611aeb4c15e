"""Noticing, and saying, when one old transaction holds the relay back.

Committed rows past the cursor whose transaction id is not below the snapshot xmin wait for the oldest
running transaction (of any database of the cluster) to end. When the xmin stays the same for `warn_s`
seconds while such rows wait, the relay logs which transaction it is (pid, database, user, age).
"""
from __future__ import annotations

import time
from collections.abc import Callable

from .source import Cursor, HeldBack, OutboxSource

Log = Callable[[str], None]


class XminWatch:
    """Notices committed rows held back by one old transaction and says so, at most once per period."""

    def __init__(self, source: OutboxSource, warn_s: float, log: Log) -> None:
        self.source = source
        self.warn_s = warn_s
        self.log = log
        self._xmin: int | None = None
        self._since = 0.0
        self._warned = 0.0
        self._checked = 0.0

    async def check(self, cursor: Cursor, *, force: bool = False) -> HeldBack | None:
        now = time.monotonic()
        if not force and now - self._checked < 1.0:
            return None
        self._checked = now
        held = await self.source.held_back(cursor)
        if held.rows == 0:
            if self._warned:
                self.log("the relay is no longer waiting on xmin")
            self._xmin, self._warned = None, 0.0
            return held
        if held.xmin != self._xmin:
            self._xmin, self._since, self._warned = held.xmin, now, 0.0
        waited = now - self._since
        if waited >= self.warn_s and now - self._warned >= self.warn_s:
            self._warned = now
            blocker = await self.source.blocker()
            who = blocker.describe() if blocker else f"transaction xid {held.xmin}"
            self.log(f"waiting on xmin for {waited:.0f}s: {held.rows}{'+' if held.rows >= 100_000 else ''} "
                     f"committed row(s) past the cursor wait for {who} to finish; a long-open transaction "
                     f"delays the relay")
        return held
