"""The producer of the ingress paths: idempotent, acks=all, returning once Kafka acknowledged; topics and
error translation come from keel.kafka, shared with the stream workers."""
from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from aiokafka import AIOKafkaProducer

from keel.errors import KafkaUnavailable
from keel.kafka import TopicSpec, bootstrap_list, ensure_topics, kafka_guard

from .records import OutRecord

__all__ = ["Acks", "KafkaSink", "TopicSpec"]

MAX_RECORD_BYTES = 1_000_000      # below the broker's default message.max.bytes (1,048,588)


@dataclass(frozen=True)
class Acks:
    """The pending acknowledgements of records handed to the producer."""
    topic: str
    futures: list[asyncio.Future]


class KafkaSink:
    """Produces records with acks=all and idempotence (retries neither reorder nor duplicate a partition's
    records) and returns only once Kafka acknowledged every record of a call."""

    def __init__(self, bootstrap: str, *, linger_ms: int = 5, max_record_bytes: int = MAX_RECORD_BYTES,
                 client_id: str = "keel-ingress") -> None:
        self.bootstrap = bootstrap
        self.max_record_bytes = max_record_bytes
        self._options = {"linger_ms": linger_ms, "client_id": client_id}
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap_list(self.bootstrap), acks="all",
                                    enable_idempotence=True, max_batch_size=512 * 1024,
                                    max_request_size=self.max_record_bytes + 48_576,
                                    **self._options)  # type: ignore[arg-type]
        async with kafka_guard("connect", self.bootstrap):
            await producer.start()
        self._producer = producer

    async def stop(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            async with kafka_guard("close", self.bootstrap):
                await producer.stop()

    def fits(self, record: OutRecord) -> bool:
        """Whether a record is small enough for the broker (callers dead-letter or reject the others)."""
        return record.size() <= self.max_record_bytes

    async def send_all(self, records: Sequence[OutRecord]) -> None:
        """Produce records in order; return once every one is acknowledged by all in-sync replicas."""
        await self.confirm(await self.enqueue(records))

    async def enqueue(self, records: Sequence[OutRecord]) -> Acks:
        """Hand records to the producer in order (it batches and sends them); `confirm` waits for the acks."""
        if self._producer is None:
            raise KafkaUnavailable("Kafka producer used before start()")
        if not records:
            return Acks("", [])
        topic = records[0].topic
        async with kafka_guard(f"produce to {topic}", self.bootstrap):
            return Acks(topic, [await self._producer.send(r.topic, value=r.value, key=r.key,
                                                          headers=list(r.headers) or None) for r in records])

    async def confirm(self, acks: Acks) -> None:
        """Wait until Kafka acknowledged every record of an `enqueue`."""
        if acks.futures:
            async with kafka_guard(f"produce to {acks.topic}", self.bootstrap):
                await asyncio.gather(*acks.futures)

    async def ensure_topics(self, topics: Sequence[str], spec: TopicSpec) -> None:
        """Create missing topics (LogAppendTime, `spec` partitions) the way the stream workers do."""
        await ensure_topics(self.bootstrap, topics, spec)
