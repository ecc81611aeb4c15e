"""Outbox rows → Kafka records: the canonical envelope of a valid row, a dead letter for any other.

A cartridge's personal fields are sealed on the way (sealing.py): a row may hold them in clear (the product's
own database) or sealed; the topic gets them sealed, a dead letter masked.

An envelope without `recorded_at` gets the row's `created_at` (when the product's transaction wrote it),
so a re-sent duplicate is byte-identical to the first copy. A row is never an error: whatever is wrong with
it becomes the reason of its dead letter, so a bad row never blocks the relay.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from keel.cartridge import Cartridge
from keel.envelope import Catalog
from keel.errors import EnvelopeRejected
from keel.identifiers import TENANT

from .producer import KafkaSink
from .records import OutRecord, dead_letter, event_record
from .sealing import IngressSealing
from .source import OutboxRow


@dataclass
class Encoded:
    """The records of one step, in row order, with how many are events and how many dead letters."""
    records: list[OutRecord] = field(default_factory=list)
    relayed: int = 0
    dead: int = 0

    def add(self, record: OutRecord, events_topic: str) -> None:
        """Append a record, counted as an event when it goes to the events topic, else as a dead letter."""
        self.records.append(record)
        if record.topic == events_topic:
            self.relayed += 1
        else:
            self.dead += 1


class RowEncoder:
    """Outbox rows → records: canonical envelopes for valid rows, dead letters for the rest."""

    def __init__(self, cartridge: Cartridge, sink: KafkaSink, table: str,
                 sealing: IngressSealing | None = None) -> None:
        self.catalog = Catalog(cartridge)
        self.sealing = sealing or IngressSealing(None)
        self.cartridge = cartridge.name
        self.topic = cartridge.topic
        self.dlq = cartridge.dlq_topic
        self.sink = sink
        self.table = table

    def encode(self, rows: list[OutboxRow]) -> Encoded:
        out = Encoded()
        for row in rows:
            out.add(self._one(row), self.topic)
        return out

    def _one(self, row: OutboxRow) -> OutRecord:
        """The row's record; KeyStoreUnavailable (the key store cannot seal) stops the step, to be retried."""
        try:
            opened = self.sealing.opened(row.envelope.encode())
            event = self.catalog.parse(opened, default_recorded_at=row.created_at_us)
        except EnvelopeRejected as e:
            return self._dead(row, e.reason, e.event_id, e.tenant)
        record = event_record(self.topic, event, self.sealing.value(event))
        if not self.sink.fits(record):
            return self._dead(row, f"envelope of {record.size()} bytes exceeds the Kafka record limit of "
                                   f"{self.sink.max_record_bytes} bytes; it stays in the outbox row",
                              event.id, event.tenant)
        return record

    def _dead(self, row: OutboxRow, reason: str, event_id: str | None, tenant: str | None) -> OutRecord:
        """A dead letter with the row's text; without it (its size in a header) when too large for Kafka."""
        source = {"": "outbox", "table": self.table, "xid": str(row.xid), "position": str(row.position)}
        key_tenant = tenant if tenant and TENANT.match(tenant) else None
        value = self.sealing.kept(row.envelope.encode()) or b""
        letter = dead_letter(self.dlq, self.cartridge, value, reason, event_id=_short(event_id),
                             tenant=key_tenant, source=source)
        if self.sink.fits(letter):
            return letter
        return dead_letter(self.dlq, self.cartridge, None, reason, event_id=_short(event_id), tenant=key_tenant,
                           source={**source, "value_omitted": str(len(value))})


def _short(text: str | None) -> str | None:
    return text[:256] if text else text
