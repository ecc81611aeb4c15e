"""Progress of a replay on stderr: a one-line bar with events/s and ETA on a terminal, plain lines otherwise."""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

BAR = 24
SMOOTHING = 0.3        # weight of the latest interval's rate in the ETA's rate (as tqdm's `smoothing`)


class Progress:
    """Records scanned out of the partitions' end offsets, and events applied."""

    def __init__(self, label: str, *, stream: TextIO | None = None, tty: bool | None = None,
                 every_s: float | None = None, quiet: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.every_s = every_s if every_s is not None else (0.2 if self.tty else 5.0)
        self.quiet = quiet
        self.clock = clock
        self.started = clock()
        self._last = 0.0
        self._drawn = False
        self._seen: tuple[float, int] | None = None     # (time, scanned) of the previous update
        self._scan_rate = 0.0                           # records/s, smoothed over the updates since scanning began

    def update(self, scanned: int, total: int, applied: int, *, force: bool = False) -> None:
        if self.quiet:
            return
        now = self.clock()
        if not force and now - self._last < self.every_s:
            return
        self._last = now
        elapsed = max(now - self.started, 1e-6)
        rate = applied / elapsed
        left = max(total - scanned, 0)
        scan_rate = self._rate(now, scanned)
        eta = f"{left / scan_rate:,.0f}s" if scan_rate > 0 else "?"
        if self.tty:
            done = min(scanned / total, 1.0) if total else 1.0
            bar = "#" * int(done * BAR) + "." * (BAR - int(done * BAR))
            self.stream.write(f"\r{self.label} [{bar}] {done:6.1%}  {scanned:,}/{total:,} records  "
                              f"{rate:,.0f} events/s  ETA {eta}   ")
            self._drawn = True
        else:
            self.stream.write(f"{self.label}: {scanned:,}/{total:,} records scanned, {applied:,} events applied, "
                              f"{rate:,.0f} events/s, ETA {eta}\n")
        self.stream.flush()

    def _rate(self, now: float, scanned: int) -> float:
        """The scan rate for the ETA: from the first records on (not from the start, which includes connecting
        and finding the tenants: that made a 7 s run say 45 s), smoothed over the latest intervals."""
        if self._seen is None or self._seen[1] == 0:
            self._seen = (now, scanned)
            return self._scan_rate
        then, before = self._seen
        if now > then:
            latest = (scanned - before) / (now - then)
            self._scan_rate = latest if not self._scan_rate else \
                SMOOTHING * latest + (1 - SMOOTHING) * self._scan_rate
            self._seen = (now, scanned)
        return self._scan_rate

    def note(self, text: str) -> None:
        """A line of its own (a switch, a retry), not overwritten by the bar."""
        if self.quiet:
            return
        self.end()
        self.stream.write(text + "\n")
        self.stream.flush()

    def end(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
