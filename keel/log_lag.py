"""How far the Redis graph is behind its log, measured when an answer is made: the log end of the tenant's
partition (Kafka) minus what Redis holds of it (the partition's applied watermark, Store.advance_partitions).

The `lag` the workers store with a tenant's commit is only as fresh as that commit: a stalled pipeline keeps
answering with the lag of its last batch. This measure cannot go stale: when Kafka does not answer, the last log
ends read are used and the answer says when they were read (`lag_measured_at`).

Kafka's log ends are read by one consumer (no group) on a private event loop thread, and Redis's watermarks with
one HMGET, at most once per `ttl_s` for all partitions: a busy tools server asks the broker and Redis about once
a second, not once per call, and a call never waits for another's read.
"""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from .errors import KafkaUnavailable, StoreUnavailable
from .kafka import admin_client, bootstrap_list
from .store.roles import BatchWrites
from .times import Micros, now_micros
from .wire import partition_for

READ_TIMEOUT_S = 2.0
RETRY_AFTER_S = 10.0     # after a failed read the last ends are used for this long


class LogLag:
    """`measure(tenant)` -> (records of the tenant's partition Redis does not hold, when the log end was read)."""

    def __init__(self, bootstrap: str, topic: str, store: BatchWrites, *, ttl_s: float = 1.0) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.store = store
        self.ttl_s = ttl_s
        # (partition -> log end, partition -> Redis's applied watermark, when both were read)
        self._snapshot: tuple[dict[int, int], dict[int, int | None], Micros | None] = ({}, {}, None)
        self._read_at: float | None = None           # monotonic time of the last successful read
        self._failed_at: float | None = None
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._consumer: AIOKafkaConsumer | None = None
        self._partitions: list[int] = []             # the topic's partitions (read once it exists)

    def stale_after(self) -> float:
        """Seconds after which a measure's log end is older than this class ever keeps it while Kafka answers."""
        return max(2 * self.ttl_s, 2.0)

    def measure(self, tenant: str) -> tuple[int | None, Micros | None]:
        """(lag, when the log end it is measured against was read); (None, None) when nothing could be read."""
        self._refresh()
        ends, applied, read_at = self._snapshot
        if not ends:
            return None, None
        partition = partition_for(tenant, len(ends))
        end = ends.get(partition)
        if end is None:
            return None, None
        held = applied.get(partition)
        return max(0, end - (held + 1 if held is not None else 0)), read_at

    def _refresh(self) -> None:
        """Read the log ends and Redis's watermarks again when older than `ttl_s`: one thread reads, the others
        answer with what was read last (only the first ever call waits for a read)."""
        now = time.monotonic()
        fresh = self._read_at is not None and now - self._read_at < self.ttl_s
        resting = self._failed_at is not None and now - self._failed_at < RETRY_AFTER_S
        if fresh or resting or not self._lock.acquire(blocking=self._read_at is None):
            return
        try:
            try:
                ends = asyncio.run_coroutine_threadsafe(self._read(), self._running()).result(READ_TIMEOUT_S)
            except (KafkaError, KafkaUnavailable, FutureTimeout, OSError):
                ends = None                          # keep the last ends; the answer says when they were read
            if not ends:                             # a broker that does not answer is asked again later,
                self._failed_at = time.monotonic()   # not by every call (each would wait READ_TIMEOUT_S)
                return
            try:
                applied = self.store.partitions_applied(self.topic, sorted(ends))
            except StoreUnavailable:
                return
            self._snapshot = (ends, applied, now_micros())
            self._read_at, self._failed_at = time.monotonic(), None
        finally:
            self._lock.release()

    def _running(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name="keel-log-lag", daemon=True)
            self._thread.start()
        return self._loop

    async def _read(self) -> dict[int, int]:
        if self._consumer is None:
            consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap_list(self.bootstrap), enable_auto_commit=False,
                                        client_id="keel-log-lag", request_timeout_ms=int(READ_TIMEOUT_S * 1000))
            await consumer.start()
            self._consumer = consumer
        if not self._partitions:
            async with admin_client(self.bootstrap) as admin:
                [described] = await admin.describe_topics([self.topic])
            if described["error_code"] != 0:
                return {}
            self._partitions = sorted(p["partition"] for p in described["partitions"])
        ends = await self._consumer.end_offsets([TopicPartition(self.topic, p) for p in self._partitions])
        return {tp.partition: int(end) for tp, end in ends.items()}

    def close(self) -> None:
        if self._loop is None:
            return
        if self._consumer is not None:
            try:
                asyncio.run_coroutine_threadsafe(self._consumer.stop(), self._loop).result(READ_TIMEOUT_S)
            except (KafkaError, FutureTimeout, OSError):
                pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(READ_TIMEOUT_S)
        self._loop = None
