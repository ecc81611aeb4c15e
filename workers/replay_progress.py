"""Progress of a replay on stderr: a one-line bar with events/s and ETA on a terminal, plain lines otherwise."""
from __future__ import annotations

import sys
import time
from typing import TextIO

BAR = 24


class Progress:
    """Records scanned out of the partitions' end offsets, and events applied."""

    def __init__(self, label: str, *, stream: TextIO | None = None, tty: bool | None = None,
                 every_s: float | None = None, quiet: bool = False) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.every_s = every_s if every_s is not None else (0.2 if self.tty else 5.0)
        self.quiet = quiet
        self.started = time.monotonic()
        self._last = 0.0
        self._drawn = False

    def update(self, scanned: int, total: int, applied: int, *, force: bool = False) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        if not force and now - self._last < self.every_s:
            return
        self._last = now
        elapsed = max(now - self.started, 1e-6)
        rate = applied / elapsed
        scan_rate = scanned / elapsed
        left = max(total - scanned, 0)
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
