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
        event = self.projector.parse(envelope)          # reject before it reaches the log
        if self.projector.store.has_event(event.tenant, event.id):
            return                                      # a retried note (its id is its idempotency key)
        if self.path is not None:
            line = json.dumps(envelope, ensure_ascii=False, separators=(",", ":"))
            with self.path.open("a+", encoding="utf-8") as f:
                f.seek(0, 2)
                if f.tell() > 0:
                    f.seek(f.tell() - 1)
                    if f.read(1) != "\n":
                        f.write("\n")
                f.write(line + "\n")
        self.projector.apply(event)
