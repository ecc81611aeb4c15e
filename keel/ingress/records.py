"""Kafka records the ingress paths produce: canonical envelopes for the events topic and dead letters.

Dead-letter headers use the names the stream workers use (`keel.reason`, `keel.cartridge`, `keel.event_id`,
`keel.tenant`), plus `keel.source` (`outbox`) and where the row came from (`keel.source.table`,
`keel.source.xid`, `keel.source.position`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from keel.envelope import Event

REASON = "keel.reason"
CARTRIDGE = "keel.cartridge"
EVENT_ID = "keel.event_id"
TENANT = "keel.tenant"
SOURCE = "keel.source"
VALUE_OMITTED = "keel.value_omitted"
MAX_REASON = 4000
RECORD_OVERHEAD = 512          # bytes reserved for the record and batch framing around key, value and headers


@dataclass(frozen=True, slots=True)
class OutRecord:
    """One record to produce."""
    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()

    def size(self) -> int:
        return (len(self.key or b"") + len(self.value or b"") + RECORD_OVERHEAD
                + sum(len(k) + len(v) for k, v in self.headers))


def canonical_bytes(event: Event) -> bytes:
    """The record value of an event: its canonical envelope (`Event.to_envelope()`) as compact JSON."""
    return json.dumps(event.to_envelope(), ensure_ascii=False, separators=(",", ":")).encode()


def event_record(topic: str, event: Event) -> OutRecord:
    """An accepted event: key = tenant, value = canonical envelope."""
    return OutRecord(topic, event.tenant.encode(), canonical_bytes(event))


def dead_letter(topic: str, cartridge: str, value: bytes | None, reason: str, *, event_id: str | None,
                tenant: str | None, source: dict[str, str]) -> OutRecord:
    """A rejected envelope with its bytes (None when too large to keep) and why, keyed by tenant when known."""
    headers = [(REASON, reason[:MAX_REASON]), (CARTRIDGE, cartridge), (EVENT_ID, event_id), (TENANT, tenant),
               *((f"{SOURCE}.{k}" if k else SOURCE, v) for k, v in source.items())]
    return OutRecord(topic, tenant.encode() if tenant else None, value,
                     tuple((k, v.encode()) for k, v in headers if v is not None))


def headers_of(headers: object) -> dict[str, str]:
    """Keel's headers of a consumed record as text (for tools and tests)."""
    return {k: v.decode("utf-8", "replace") for k, v in headers  # type: ignore[attr-defined]
            if k.startswith("keel.")}
