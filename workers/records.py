"""A consumed Kafka record, independent of the client library (so batch logic is testable without Kafka)."""
from __future__ import annotations

from typing import Any, NamedTuple

_new = tuple.__new__


class Record(NamedTuple):
    """One record of an events topic, as the worker saw it (a tuple: a batch makes thousands of them)."""
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
        t = r.timestamp
        return _new(cls, (r.topic, r.partition, r.offset, t if t is not None and t >= 0 else None, r.key, r.value,
                          tuple(r.headers) if r.headers else ()))

    @property
    def origin(self) -> str:
        """Where the record is, as kept with its event id (an id reused later is refused naming this)."""
        return f"at {self.topic} partition {self.partition} offset {self.offset}"

    @property
    def timestamp_micros(self) -> int | None:
        """The record time in micros (LogAppendTime on Keel's topics): recorded_at when the envelope has none."""
        return None if self.timestamp_ms is None else self.timestamp_ms * 1000
