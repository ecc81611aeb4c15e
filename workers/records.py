"""A consumed Kafka record, independent of the client library (so batch logic is testable without Kafka)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Record:
    """One record of an events topic, as the worker saw it."""
    topic: str
    partition: int
    offset: int
    timestamp_ms: int | None
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()

    @classmethod
    def of(cls, r: Any) -> Record:
        """From an aiokafka ConsumerRecord."""
        return cls(r.topic, r.partition, r.offset, r.timestamp if r.timestamp is not None and r.timestamp >= 0
                   else None, r.key, r.value, tuple(r.headers or ()))

    @property
    def timestamp_micros(self) -> int | None:
        """The record time in micros (LogAppendTime on Keel's topics): recorded_at when the envelope has none."""
        return None if self.timestamp_ms is None else self.timestamp_ms * 1000
