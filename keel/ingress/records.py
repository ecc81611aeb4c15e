"""Kafka records the ingress paths produce: canonical envelopes for the events topic and dead letters.

Dead-letter headers are keel.wire's (`keel.reason`, `keel.cartridge`, `keel.event_id`, `keel.tenant`), plus
`keel.source` (`outbox`) and where the row came from (`keel.source.table`, `keel.source.xid`,
`keel.source.position`).
"""
from __future__ import annotations

from dataclasses import dataclass

from keel.envelope import Event
from keel.wire import CARTRIDGE, EVENT_ID, MAX_REASON, REASON, SOURCE, TENANT, canonical_bytes, record_key

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


def event_record(topic: str, event: Event, value: bytes | None = None) -> OutRecord:
    """An accepted event: key = tenant, value = canonical envelope (or `value`: it with personal fields sealed)."""
    return OutRecord(topic, record_key(event.tenant), canonical_bytes(event) if value is None else value)


def dead_letter(topic: str, cartridge: str, value: bytes | None, reason: str, *, event_id: str | None,
                tenant: str | None, source: dict[str, str]) -> OutRecord:
    """A rejected envelope with its bytes (None when too large to keep) and why, keyed by tenant when known."""
    headers = [(REASON, reason[:MAX_REASON]), (CARTRIDGE, cartridge), (EVENT_ID, event_id), (TENANT, tenant),
               *((f"{SOURCE}.{k}" if k else SOURCE, v) for k, v in source.items())]
    return OutRecord(topic, tenant.encode() if tenant else None, value,
                     tuple((k, v.encode()) for k, v in headers if v is not None))
