"""Where annotate's events go: the log (a JSONL file, or a Kafka topic), then the projection."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from .projector import Projector


class EventLog(Protocol):
    """Appends an envelope to the log and returns once the projection shows it (read-your-writes)."""

    def append(self, envelope: dict[str, Any]) -> None: ...


class FileLog:
    """Embedded mode: append a JSON line to the events file (if any) and project it in process."""

    def __init__(self, projector: Projector, path: str | Path | None) -> None:
        self.projector = projector
        self.path = Path(path) if path is not None else None

    def append(self, envelope: dict[str, Any]) -> None:
        """Write the line, then apply it; an event the projector refuses is taken out of the file again, so
        a refused note never stays in the log (the tool checks notes first: keel.tools.Tools.annotate)."""
        event = self.projector.parse(envelope)          # reject before it reaches the log
        if self.projector.store.has_event(event.tenant, event.id):
            return                                      # a retried note (its id is its idempotency key)
        if self.path is None:
            self.projector.apply(event)
            return
        line = json.dumps(envelope, ensure_ascii=False, separators=(",", ":"))
        with self.path.open("a+b") as f:
            size = f.seek(0, 2)
            if size > 0:
                f.seek(size - 1)
                if f.read(1) != b"\n":
                    f.write(b"\n")
            f.write(line.encode() + b"\n")
            f.flush()
            try:
                self.projector.apply(event)
            except Exception:
                f.truncate(size)                        # the file as it was: the refused line is gone
                raise
