"""Dead letters: rejected records go to `keel.<cartridge>.dlq` with their original key, value and headers,
plus `keel.*` headers saying why and where they came from; each is counted once per source record in Redis.

A batch's dead letters are produced (and acknowledged by Kafka) before the batch's Redis commit, so a crash
can never lose one; a crash after producing and before the commit means the batch is redone and its dead
letters are produced again: the topic may hold duplicates (same `keel.source.*` headers), the counts never do.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

from aiokafka import AIOKafkaProducer

from keel.kafka import kafka_guard
from keel.store.redis import dead_letter_keys, guard
from keel.wire import (
    CARTRIDGE,
    EVENT_ID,
    MAX_REASON,
    REASON,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TIMESTAMP,
    SOURCE_TOPIC,
    TENANT,
)

from .applier import DeadLetter


def dead_letter_headers(letter: DeadLetter, cartridge: str) -> list[tuple[str, bytes]]:
    """The record's own headers, then Keel's (reason, source topic/partition/offset/timestamp, event id, tenant)."""
    r = letter.record
    ours: list[tuple[str, str | None]] = [
        (REASON, letter.reason[:MAX_REASON]), (CARTRIDGE, cartridge), (SOURCE_TOPIC, r.topic),
        (SOURCE_PARTITION, str(r.partition)), (SOURCE_OFFSET, str(r.offset)),
        (SOURCE_TIMESTAMP, None if r.timestamp_ms is None else str(r.timestamp_ms)),
        (EVENT_ID, letter.event_id), (TENANT, letter.tenant)]
    return list(r.headers) + [(k, v.encode()) for k, v in ours if v is not None]


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
        self.namespace = namespace
        self.seen, self.counts_key = dead_letter_keys(namespace)
        self._count = client.register_script(_COUNT)

    def record(self, letters: list[DeadLetter]) -> int:
        """Count letters not counted before; returns how many were new."""
        if not letters:
            return 0
        args: list[str] = []
        for d in letters:
            r = d.record
            args += [json.dumps([r.topic, r.partition, r.offset]), d.tenant or ""]
        with guard(self.namespace, "dead-letter count"):
            return int(self._count(keys=[self.seen, self.counts_key], args=args))

    def counts(self) -> dict[str, int]:
        """{tenant: dead letters}; "" holds records whose tenant could not be read."""
        with guard(self.namespace, "dead-letter count read"):
            raw = self.client.hgetall(self.counts_key)
        return {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in sorted(raw.items())}
