"""A webhook request body → envelopes → accepted events, rejections and in-batch duplicates.

Body forms: one JSON object (one envelope), a JSON array of objects, or JSON lines (one envelope per
non-empty line; `application/x-ndjson`, `application/jsonl`). `application/json` bodies that are not a
single JSON value are read as JSON lines too, so senders need not set the content type precisely.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from keel.envelope import Catalog, Event
from keel.errors import EnvelopeRejected
from keel.times import Micros

LINES_TYPES = ("application/x-ndjson", "application/jsonl", "application/json-lines", "application/jsonlines",
               "application/x-jsonlines", "text/plain")


class BodyMalformed(ValueError):
    """The body holds no envelope at all (empty, or a JSON value that is neither an object nor an array)."""


@dataclass
class BatchOutcome:
    """What became of each envelope of a request, by its 0-based index in the body."""
    accepted: list[Event] = field(default_factory=list)
    indexes: list[int] = field(default_factory=list)          # body index of each accepted event
    rejected: list[dict[str, Any]] = field(default_factory=list)
    duplicates: list[dict[str, Any]] = field(default_factory=list)
    size: int = 0


def split_body(body: bytes, content_type: str) -> list[bytes | dict[str, Any]]:
    """The envelopes of a body, unparsed where possible (the catalog parses bytes fastest)."""
    if not body.strip():
        raise BodyMalformed("empty body: send one JSON envelope or JSON lines")
    if content_type not in LINES_TYPES:
        stripped = body.lstrip()
        if stripped[:1] == b"[":
            try:
                doc = json.loads(body)
            except ValueError:
                doc = None
            if isinstance(doc, list):
                return list(doc)
        elif body.count(b"\n", 0, len(body.rstrip())) == 0:
            return [body]
        else:
            try:
                doc = json.loads(body)
            except ValueError:
                doc = None
            if isinstance(doc, dict):
                return [body]
    return [line for line in body.splitlines() if line.strip()]


Item = bytes | dict[str, Any]


def check_batch(catalog: Catalog, items: list[Item], tenant: str, received_at: Micros,
                opened: Callable[[Item], Item] = lambda item: item) -> BatchOutcome:
    """Check each envelope with the catalog and against the signing tenant; the first valid envelope of an
    id is accepted, later ones are reported as duplicates. `recorded_at` defaults to the receive time.
    `opened` reveals sealed personal fields before the check (sealing.IngressSealing.opened)."""
    out = BatchOutcome(size=len(items))
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        try:
            if not isinstance(item, (bytes, dict)):
                raise EnvelopeRejected("an envelope must be a JSON object")
            event = catalog.parse(opened(item), default_recorded_at=received_at)
        except EnvelopeRejected as e:
            out.rejected.append(_rejection(index, e.event_id, e.reason))
            continue
        if event.tenant != tenant:
            out.rejected.append(_rejection(index, event.id, f"tenant {event.tenant!r} differs from the signing "
                                                            f"tenant {tenant!r}"))
            continue
        if event.id in first:
            out.duplicates.append({"index": index, "id": event.id, "first": first[event.id]})
            continue
        first[event.id] = index
        out.accepted.append(event)
        out.indexes.append(index)
    return out


def _rejection(index: int, event_id: str | None, reason: str) -> dict[str, Any]:
    return {"index": index, "id": event_id, "reason": reason}
