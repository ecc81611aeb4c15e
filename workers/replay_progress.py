"""Progress of a replay on stderr: a bar (drawn by rich) with records scanned, tenants switched, events/s and
ETA when stderr is a terminal; otherwise one plain line every `every_s` seconds (5 by default), so a log file
gets a few lines and never one per tenant. The ETA is computed here (smoothed scan rate, see _rate), rich only
draws it."""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, TaskID, TaskProgressColumn, TextColumn
from rich.progress import Progress as Bar

SMOOTHING = 0.3        # weight of the latest interval's rate in the ETA's rate (as tqdm's `smoothing`)
EVERY_S_TTY = 0.2      # redraws of the bar
EVERY_S_LOG = 5.0      # plain lines when stderr is not a terminal


class Progress:
    """Records scanned out of the partitions' end offsets, events applied, tenants switched."""

    def __init__(self, label: str, *, stream: TextIO | None = None, tty: bool | None = None,
                 every_s: float | None = None, quiet: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.every_s = every_s if every_s is not None else (EVERY_S_TTY if self.tty else EVERY_S_LOG)
        self.quiet = quiet
        self.clock = clock
        self.started = clock()
        self.tenants = 0                                # switched so far
        self.partition: tuple[int, int, int] | None = None  # (partition being read, its rank 1.., partitions to read)
        self._last: float | None = None
        self._state = (0, 0, 0)                         # the latest (scanned, total, applied)
        self._bar: Bar | None = None
        self._task: TaskID | None = None
        self._seen: tuple[float, int] | None = None     # (time, scanned) of the previous update
        self._scan_rate = 0.0                           # records/s, smoothed over the updates since scanning began

    def update(self, scanned: int, total: int, applied: int, *, force: bool = False) -> None:
        self._state = (scanned, total, applied)
        if self.quiet:
            return
        now = self.clock()
        if not force and self._last is not None and now - self._last < self.every_s:
            return
        self._last = now
        elapsed = max(now - self.started, 1e-6)
        rate = applied / elapsed
        left = max(total - scanned, 0)
        scan_rate = self._rate(now, scanned)
        eta = f"{left / scan_rate:,.0f}s" if scan_rate > 0 else "?"
        where = "partition {} ({}/{})".format(*self.partition) if self.partition else ""
        if self.tty:
            self._draw(scanned, total, f"{self.tenants:,} tenants switched  {rate:,.0f} events/s  ETA {eta}"
                                       + (f"  {where}" if where else ""))
            return
        self.stream.write(f"{self.label}: {where + ', ' if where else ''}{scanned:,}/{total:,} records scanned, "
                          f"{applied:,} events applied, {self.tenants:,} tenants switched, "
                          f"{rate:,.0f} events/s, ETA {eta}\n")
        self.stream.flush()

    def switched(self, line: str | None = None) -> None:
        """A tenant was cut over: counted on the bar or the next progress line. `line` (a replay of named
        tenants, a few) is also said on its own; a replay of every tenant passes none."""
        self.tenants += 1
        if line is not None:
            self.note(line)
        elif self._bar is not None:
            self.update(*self._state)

    def _draw(self, scanned: int, total: int, text: str) -> None:
        if self._bar is None:
            self._bar = Bar(TextColumn("{task.description}"), BarColumn(), TaskProgressColumn(),
                            MofNCompleteColumn(), TextColumn("records  {task.fields[text]}"),
                            console=Console(file=self.stream, force_terminal=True), auto_refresh=False)
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=max(total, 1), text="")
        assert self._task is not None
        self._bar.update(self._task, completed=scanned, total=max(total, scanned, 1), text=text, refresh=True)

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
        """A line of its own (a switch of a named tenant, a retry), not overwritten by the bar."""
        if self.quiet:
            return
        if self._bar is not None:               # above the bar, which stays at the bottom
            self._bar.console.print(text, markup=False, highlight=False)
            return
        self.stream.write(text + "\n")
        self.stream.flush()

    def end(self) -> None:
        """The bar drawn one last time (complete) and left on the screen; nothing more on a log."""
        if self._bar is not None:
            self.update(*self._state, force=True)
            self._bar.stop()
            self._bar = None
