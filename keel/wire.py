"""Keel's names and bytes on the wire, defined once for every process: topic names, consumer groups, record
keys and values, partitioning and dead-letter headers.

A cartridge has one events topic and one dead-letter topic; a record's key is its tenant (so one partition
holds a tenant's whole history, in order) and its value the event's canonical envelope, exactly as file mode
reads it, so a file and its topic build identical graphs.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any, Protocol

# Dead-letter headers: why a record was refused and where it came from.
REASON = "keel.reason"
CARTRIDGE = "keel.cartridge"
EVENT_ID = "keel.event_id"
TENANT = "keel.tenant"
SOURCE = "keel.source"                       # the ingress path (`outbox`); `keel.source.<what>` says where
SOURCE_TOPIC = "keel.source.topic"           # a worker's refused record: its topic, partition, offset, timestamp
SOURCE_PARTITION = "keel.source.partition"
SOURCE_OFFSET = "keel.source.offset"
SOURCE_TIMESTAMP = "keel.source.timestamp"
VALUE_OMITTED = "keel.value_omitted"         # the value was too large to keep
MAX_REASON = 4000                            # characters of a reason header
# Redrives (`keel dlq`, keel/deadletters.py): a marker in the dead-letter topic closes a letter, and the
# re-sent event says which letter it came from.
REDRIVEN = "keel.redriven"                   # on a marker record: the letter, "<partition>:<offset>"
REDRIVEN_AT = "keel.redriven_at"             # on a marker record: when
REDRIVE_OF = "keel.redrive.of"               # on a re-sent event: "<dlq topic>:<partition>:<offset>"


def events_topic(cartridge: str) -> str:
    """`keel.<cartridge>.events`: envelopes, key = tenant."""
    return f"keel.{cartridge}.events"


def dlq_topic(cartridge: str) -> str:
    """`keel.<cartridge>.dlq`: refused records with their original bytes and a reason in the headers."""
    return f"keel.{cartridge}.dlq"


def group_id(cartridge: str) -> str:
    """The consumer group of a cartridge's workers, whatever other cartridges a worker also serves."""
    return f"keel.{cartridge}.worker"


def record_key(tenant: str) -> bytes:
    """The key of a tenant's records: the tenant, so one partition holds all of them in order."""
    return tenant.encode()


class Enveloped(Protocol):
    """What gives its canonical envelope: keel.envelope.Event (this module sits below the envelope's, which
    builds on the cartridges that name their topics here)."""

    def to_envelope(self) -> dict[str, Any]: ...


def canonical_bytes(event: Enveloped, seal: Callable[[dict[str, Any]], dict[str, Any]] | None = None) -> bytes:
    """The record value of an event: its canonical envelope (`Event.to_envelope()`) as compact JSON; with `seal`
    (keel.privacy.Privacy.seal), its personal fields encrypted first."""
    envelope = event.to_envelope()
    if seal is not None:
        envelope = seal(envelope)
    return json.dumps(envelope, ensure_ascii=False, separators=(",", ":")).encode()


def partition_for(tenant: str, partitions: int) -> int:
    """The partition Kafka's default partitioner gives a record keyed by this tenant."""
    from aiokafka.partitioner import murmur2  # aiokafka only for the commands that need it
    return (murmur2(record_key(tenant)) & 0x7FFFFFFF) % partitions


def keel_headers(headers: Iterable[tuple[str, bytes]]) -> dict[str, str]:
    """Keel's headers of a consumed record as text (for tools and tests)."""
    return {k: v.decode("utf-8", "replace") for k, v in headers if k.startswith("keel.")}
