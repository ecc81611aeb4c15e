"""Dead letters: rejected records go to `keel.<cartridge>.dlq` with their original key, value and headers,
plus `keel.*` headers saying why and where they came from; each is counted once per source record in Redis.

A batch's dead letters are produced (and acknowledged by Kafka) before the batch's Redis commit, so a crash
can never lose one; a crash after producing and before the commit means the batch is redone and its dead
letters are produced again: the topic may hold duplicates (same `keel.source.*` headers), the counts never do.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from typing import Any

from aiokafka import AIOKafkaProducer
from redis.exceptions import RedisError

from keel.errors import StoreUnavailable
from keel.kafka import kafka_guard

from .applier import DeadLetter

REASON = "keel.reason"
SOURCE_TOPIC = "keel.source.topic"
SOURCE_PARTITION = "keel.source.partition"
SOURCE_OFFSET = "keel.source.offset"
SOURCE_TIMESTAMP = "keel.source.timestamp"
EVENT_ID = "keel.event_id"
TENANT = "keel.tenant"
CARTRIDGE = "keel.cartridge"
MAX_REASON = 4000


def dead_letter_headers(letter: DeadLetter, cartridge: str) -> list[tuple[str, bytes]]:
    """The record's own headers, then Keel's (reason, source topic/partition/offset/timestamp, event id, tenant)."""
    r = letter.record
    ours: list[tuple[str, str | None]] = [
        (REASON, letter.reason[:MAX_REASON]), (CARTRIDGE, cartridge), (SOURCE_TOPIC, r.topic),
        (SOURCE_PARTITION, str(r.partition)), (SOURCE_OFFSET, str(r.offset)),
        (SOURCE_TIMESTAMP, None if r.timestamp_ms is None else str(r.timestamp_ms)),
        (EVENT_ID, letter.event_id), (TENANT, letter.tenant)]
    return list(r.headers) + [(k, v.encode()) for k, v in ours if v is not None]


def reason_of(headers: Iterable[tuple[str, bytes]]) -> dict[str, str]:
    """Keel's headers of a dead-letter record as text (for tools and tests)."""
    return {k: v.decode("utf-8", "replace") for k, v in headers if k.startswith("keel.")}


class DeadLetterQueue:
    """Produces dead letters to the cartridge's dead-letter topic and waits for Kafka's acknowledgement."""

    def __init__(self, producer: AIOKafkaProducer, topic: str, cartridge: str, bootstrap: str) -> None:
        self.producer = producer
        self.topic = topic
        self.cartridge = cartridge
        self.bootstrap = bootstrap

    async def send(self, letters: list[DeadLetter]) -> None:
        if not letters:
            return
        async with kafka_guard(f"produce to {self.topic}", self.bootstrap):
            pending = [await self.producer.send(self.topic, value=d.record.value, key=d.record.key,
                                                headers=dead_letter_headers(d, self.cartridge))
                       for d in letters]
            await asyncio.gather(*pending)


# Counts each source record once: SADD answers 1 only the first time a member is added.
_COUNT = """
local n = 0
for i = 1, #ARGV, 2 do
  if redis.call('SADD', KEYS[1], ARGV[i]) == 1 then
    redis.call('HINCRBY', KEYS[2], ARGV[i + 1], 1)
    n = n + 1
  end
end
return n
"""


class DeadLetterCounts:
    """Per-tenant dead-letter counts in Redis, exact under redelivery (keyed by source topic/partition/offset).

    Keys share the namespace's hash tag with RedisStore's tenant registry (`keel:{<ns>}:…`); records
    without a readable tenant are counted under "".
    """

    def __init__(self, client: Any, namespace: str) -> None:
        self.client = client
        self.seen = f"keel:{{{namespace}}}:dlq:seen"
        self.counts_key = f"keel:{{{namespace}}}:dlq:count"
        self._count = client.register_script(_COUNT)

    def record(self, letters: list[DeadLetter]) -> int:
        """Count letters not counted before; returns how many were new."""
        if not letters:
            return 0
        args: list[str] = []
        for d in letters:
            r = d.record
            args += [json.dumps([r.topic, r.partition, r.offset]), d.tenant or ""]
        try:
            return int(self._count(keys=[self.seen, self.counts_key], args=args))
        except RedisError as e:
            raise StoreUnavailable(f"Redis dead-letter count failed: {type(e).__name__}: {e}") from e

    def counts(self) -> dict[str, int]:
        """{tenant: dead letters}; "" holds records whose tenant could not be read."""
        try:
            raw = self.client.hgetall(self.counts_key)
        except RedisError as e:
            raise StoreUnavailable(f"Redis dead-letter count read failed: {type(e).__name__}: {e}") from e
        return {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in sorted(raw.items())}
