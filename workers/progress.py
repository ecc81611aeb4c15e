"""Whether a worker's ingestion is moving: the readiness check that tells an outage from a slow batch.

Progress is a committed batch, or every assigned partition found caught up with Redis holding what was written.
An outage (Redis, the key store, Kafka) only notes its cause: the worker keeps retrying, and readiness turns
503 once nothing progressed for `unready_after_s`, naming the last cause. Redis refusing writes (out of
memory) is the exception: readiness turns 503 at once, saying so, since no write can succeed until an operator
or Redis frees memory (a 20 s squeeze never showed behind the 30 s default, issue 44). The first progress
after an outage logs one line saying ingestion resumed, so an operator reading the log sees both ends of it.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable


class Progress:
    """The progress clock of one cartridge's ingestion, and its readiness check."""

    def __init__(self, unready_after_s: float, log: logging.Logger, label: str,
                 waiting: Callable[[], int] = lambda: 0) -> None:
        """`waiting`: how many partitions wait for their resume point (a cause readiness can name)."""
        self.unready_after_s = unready_after_s
        self.log = log
        self.label = label
        self.waiting = waiting
        self.at = time.monotonic()            # last commit, or last time the partitions were found caught up
        self.last_outage: str | None = None   # why the last write, fetch or lag request failed
        self._stalled = False                 # an outage was noted: log one line when ingestion resumes
        self.refusing: str | None = None      # Redis refuses writes (out of memory): unready now, this cause

    def outage(self, cause: str, *, refusing: str | None = None) -> None:
        """An outage stops ingestion: keep its cause; the retrying code logs it, progress logs the resumption.
        `refusing`: Redis refuses writes, readiness names it without waiting for `unready_after_s`."""
        self.last_outage = cause
        self._stalled = True
        if refusing is not None:
            self.refusing = refusing

    def progressed(self) -> None:
        now = time.monotonic()
        if self._stalled:
            self.log.info("%s: ingestion resumed after %.0fs without progress (last cause: %s)", self.label,
                          now - self.at, self.last_outage)
        self.at = now
        self._stalled = False
        self.last_outage = None
        self.refusing = None

    def idle_s(self) -> float:
        return time.monotonic() - self.at

    def unready(self) -> str | None:
        """Readiness: why nothing was committed (nor found caught up) for `unready_after_s`; None while it was."""
        if self.refusing is not None:
            return self.refusing
        idle = self.idle_s()
        if idle <= self.unready_after_s:
            return None
        waiting = self.waiting()
        cause = self.last_outage or (f"{waiting} partition(s) waiting for their resume point" if waiting
                                     else "no outage seen: a batch may be slow")
        return f"no batch committed for {idle:.0f}s: {cause}"
