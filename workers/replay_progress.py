"""Progress of a replay on stderr: a rich progress bar (records scanned, events/s, ETA) on a terminal, plain
lines otherwise (logs, CI)."""
from __future__ import annotations

import sys
import time
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TaskProgressColumn, TextColumn, TimeRemainingColumn
from rich.progress import Progress as Bar


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
        self._bar: Bar | None = None
        self._task = None

    def update(self, scanned: int, total: int, applied: int, *, force: bool = False) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        if not force and now - self._last < self.every_s:
            return
        self._last = now
        rate = applied / max(now - self.started, 1e-6)
        if self.tty:
            self._draw(scanned, total, rate)
            return
        scan_rate = scanned / max(now - self.started, 1e-6)
        eta = f"{max(total - scanned, 0) / scan_rate:,.0f}s" if scan_rate > 0 else "?"
        self.stream.write(f"{self.label}: {scanned:,}/{total:,} records scanned, {applied:,} events applied, "
                          f"{rate:,.0f} events/s, ETA {eta}\n")
        self.stream.flush()

    def _draw(self, scanned: int, total: int, rate: float) -> None:
        if self._bar is None:
            self._bar = Bar(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                            MofNCompleteColumn(), TextColumn("records  {task.fields[rate]:,.0f} events/s  ETA"),
                            TimeRemainingColumn(), console=Console(file=self.stream, force_terminal=True),
                            transient=False, auto_refresh=False)
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=max(total, 1), rate=0.0)
        self._bar.update(self._task, completed=scanned, total=max(total, scanned, 1), rate=rate, refresh=True)

    def note(self, text: str) -> None:
        """A line of its own (a switch, a retry), not overwritten by the bar."""
        if self.quiet:
            return
        if self._bar is not None:
            self._bar.console.print(text, markup=False, highlight=False)
            return
        self.stream.write(text + "\n")
        self.stream.flush()

    def end(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
