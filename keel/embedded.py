"""Embedded mode: replay a JSONL events file into an in-memory store, reporting bad lines."""
from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from .cartridge import Cartridge
from .echo import cut, printable
from .envelope import OFFBOARDED, in_a_file
from .errors import EnvelopeRejected, HandlerFailed, UsageError
from .projector import Projector
from .store.base import Store
from .store.memory import MemoryStore
from .times import format_time


@dataclass
class Rejected:
    line: int
    event_id: str | None
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: event {self.event_id or '?'}: {self.reason}"


@dataclass
class ReplayReport:
    applied: int = 0
    duplicates: int = 0
    rejected: list[Rejected] = field(default_factory=list)
    clamped: list[Rejected] = field(default_factory=list)    # applied, recorded_at raised to the tenant's latest
    tenants: set[str] = field(default_factory=set)
    lines: int = 0          # lines of the file read (blank ones and duplicates included), as `wc -l` counts


BOM = b"\xef\xbb\xbf"


def open_events(path: str | Path) -> BinaryIO:
    """An events file opened for reading; a folder or an unreadable path is a usage error."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"events file {p} is a folder; give a JSONL file")
    try:
        return open(p, "rb")
    except FileNotFoundError:
        raise UsageError(f"events file {p} not found") from None
    except OSError as e:
        raise UsageError(f"events file {p} cannot be read: {e.strerror or e}") from None


@contextmanager
def bulk_allocation() -> Iterator[None]:
    """No automatic garbage collection while a replay allocates millions of long-lived objects.

    The collector would scan every new tuple, list and dict of the graph at least once and the growing
    older generations again and again (a third of the apply time), yet a replay makes no reference cycles:
    the graph is trees of tuples, lists and dicts, and handlers write through buffered tuples. Afterwards
    everything allocated is moved to the oldest generation without a scan (`gc.freeze()` then
    `gc.unfreeze()`), so the skipped collections do not come back as one long pause on the next allocation;
    the next full collection sees the graph like any other long-lived data. (When the caller had frozen
    objects itself, the new ones stay frozen with them rather than unfreezing the caller's.)"""
    was_enabled, frozen_before = gc.isenabled(), gc.get_freeze_count()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if not frozen_before:
            gc.unfreeze()
        if was_enabled:
            gc.enable()


Reveal = Callable[[bytes], bytes | dict[str, Any]]     # a line before it is parsed: personal fields decrypted


def replay_file(projector: Projector, path: str | Path, *,
                on_reject: Callable[[Rejected], None] | None = None, reveal: Reveal | None = None) -> ReplayReport:
    """Apply every line of a JSONL file in order; bad lines are reported and skipped, never fatal. `reveal`
    (keel.privacy.reveal_line) decrypts a line's personal fields first."""
    report = ReplayReport()
    with open_events(path) as f, bulk_allocation():
        for number, raw in enumerate(f, 1):
            report.lines = number
            if number == 1 and raw.startswith(BOM):     # a UTF-8 byte-order mark some editors write
                raw = raw[len(BOM):]
            if raw.isspace() or not raw:     # a blank line
                continue
            try:
                event, outcome = projector.apply_raw(raw if reveal is None else reveal(raw),
                                                     origin=f"at line {number}")
            except (EnvelopeRejected, HandlerFailed) as e:
                reason = in_a_file(e.reason) if isinstance(e, EnvelopeRejected) else str(e)
                rejected = Rejected(number, e.event_id, reason)
                report.rejected.append(rejected)
                if on_reject is not None:
                    on_reject(rejected)
                continue
            if event.type == OFFBOARDED:        # the tenant left (keel offboard): nothing of it is kept
                report.tenants.discard(event.tenant)
                drop = getattr(projector.store, "drop", None)
                if drop is not None:
                    drop(event.tenant)
                continue
            report.tenants.add(event.tenant)
            if event.clamped_from is not None:
                report.clamped.append(Rejected(number, event.id, (
                    f"recorded_at {format_time(event.clamped_from)} is earlier than the tenant's latest; "
                    f"taken as recorded at {format_time(event.recorded_at)}")))
            if outcome == "applied":
                report.applied += 1
            else:
                report.duplicates += 1
    return report


def print_reject(path: str | Path, stream: TextIO | None = None) -> Callable[[Rejected], None]:
    def report(r: Rejected) -> None:
        print(printable(cut(f"{path}:{r}", 600)), file=stream if stream is not None else sys.stderr)
    return report


def build_embedded(cartridge: Cartridge, path: str | Path, *, store: Store | None = None,
                   allow_global_notes: bool = False, stream: TextIO | None = None,
                   reveal: Reveal | None = None) -> tuple[Projector, ReplayReport]:
    """A memory store built from an events file; rejects go to `stream` with their line numbers; `reveal`
    decrypts each line's personal fields (keel.privacy)."""
    projector = Projector(cartridge, store if store is not None else MemoryStore(),
                          allow_global_notes=allow_global_notes)
    report = replay_file(projector, path, on_reject=print_reject(path, stream), reveal=reveal)
    return projector, report
