"""The audit log on Kafka (beside keel.audit's JSON-lines file): records produced to `keel.<cartridge>.audit`, key =
tenant, acks=all, each acknowledged before the call's answer goes out; and reading them back by id."""
from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from contextlib import aclosing
from typing import Any

from .config import Settings
from .errors import UsageError
from .kafka import read_to_end, topic_partitions
from .kafka_log import _KafkaSender
from .wire import record_key

SEND_TIMEOUT_S = 10.0


def audit_topic(cartridge: str) -> str:
    """`keel.<cartridge>.audit`: one audit record (keel.audit) per tool call, key = tenant."""
    return f"keel.{cartridge}.audit"


class AuditTopic:
    """keel.audit.AuditWriter over Kafka: `write` returns once every in-sync replica has the record (created, like
    Keel's other topics, with retention -1 when missing: set `retention.ms` to your retention, docs/operations.md)."""

    def __init__(self, cartridge: str, settings: Settings, timeout_s: float = SEND_TIMEOUT_S, *,
                 topic: str | None = None) -> None:
        self.topic = topic or audit_topic(cartridge)
        self._sender = _KafkaSender(settings, timeout_s, [self.topic])

    def write(self, record: Mapping[str, Any]) -> None:
        value = json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        self._sender(self.topic, record_key(str(record.get("tenant") or "")), value)

    def close(self) -> None:
        self._sender.close()


def find_topic_record(bootstrap: str, topic: str, record_id: str) -> dict[str, Any]:
    """The record `record_id` of the audit topic, read from its start to its current end (no consumer group)."""
    found = asyncio.run(_find(bootstrap, topic, record_id))
    if found is None:
        raise UsageError(f"no audit record {record_id!r} in {topic}")
    return found


async def _find(bootstrap: str, topic: str, record_id: str) -> dict[str, Any] | None:
    tps = await topic_partitions(bootstrap, topic)
    if not tps:
        raise UsageError(f"no topic {topic} at {bootstrap}: no audit record was written there")
    needle = record_id.encode()
    async with aclosing(read_to_end(bootstrap, tps, "keel-audit")) as records:
        async for r in records:
            if r.value is not None and needle in r.value:
                record = _record(r.value)
                if record is not None and record.get("id") == record_id:
                    return record
    return None


def _record(value: bytes) -> dict[str, Any] | None:
    try:
        record = json.loads(value)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None
