"""The event log in Redis mode (keel's Kafka boundary, beside keel.kafka): `annotate` produces its event to the cartridge's topic and returns once a
worker has applied it (read-your-writes), or raises WriteTimeout after `settings.apply_timeout_s`."""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from aiokafka import AIOKafkaProducer

from .cartridge import Cartridge
from .config import Settings
from .envelope import Catalog
from .errors import WriteTimeout
from .kafka import KafkaUnavailable, TopicSpec, ensure_topics, kafka_guard, new_producer
from .store.roles import StoreReads
from .wire import canonical_bytes, dlq_topic, events_topic, record_key

T = TypeVar("T")
Sender = Callable[[str, bytes, bytes], None]        # (topic, key, value), returns once acknowledged


class _KafkaSender:
    """A producer living on its own event-loop thread, so `append` works from sync code and from inside
    another running event loop (the MCP server) alike."""

    def __init__(self, settings: Settings, timeout_s: float, ensure: list[str]) -> None:
        self.settings = settings
        self.timeout_s = timeout_s
        self.ensure = ensure            # topics created (LogAppendTime) before the first record
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="keel-kafka-log", daemon=True)
        self._thread.start()
        self._producer: AIOKafkaProducer | None = None
        self._ensured = False

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(self.timeout_s)
        except FutureTimeout:
            future.cancel()
            raise KafkaUnavailable(f"Kafka at {self.settings.kafka_bootstrap} did not acknowledge within "
                                   f"{self.timeout_s:g}s") from None

    async def _send(self, topic: str, key: bytes, value: bytes) -> None:
        bootstrap = self.settings.kafka_bootstrap
        if not self._ensured:
            await ensure_topics(bootstrap, self.ensure, TopicSpec())
            self._ensured = True
        async with kafka_guard(f"produce to {topic}", bootstrap):
            if self._producer is None:
                producer = new_producer(bootstrap, linger_ms=0)
                await producer.start()
                self._producer = producer
            await self._producer.send_and_wait(topic, value=value, key=key)

    def __call__(self, topic: str, key: bytes, value: bytes) -> None:
        self._call(self._send(topic, key, value))

    async def _stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    def close(self) -> None:
        if self._thread.is_alive():
            try:
                self._call(self._stop())
            finally:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._thread.join(5)


class KafkaLog:
    """EventLog (keel.eventlog) over Kafka: append = produce (key tenant, acks=all) + wait until applied."""

    def __init__(self, cartridge: Cartridge, store: StoreReads, settings: Settings, *,
                 sender: Sender | None = None, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cartridge = cartridge
        self.store = store
        self.settings = settings
        self.topic = events_topic(cartridge.name)
        self.catalog = Catalog(cartridge)
        self._sender = sender
        self._sleep = sleep
        self._clock = clock

    def append(self, envelope: dict[str, Any]) -> None:
        """Produce the envelope (canonical form) and poll the store until the event is applied."""
        event = self.catalog.parse(envelope)                  # reject before it reaches the log
        timeout = self.settings.apply_timeout_s
        deadline = self._clock() + timeout
        self._send(self.topic, record_key(event.tenant), canonical_bytes(event))
        delay = 0.005
        while not self.store.has_event(event.tenant, event.id):
            left = deadline - self._clock()
            if left <= 0:
                raise WriteTimeout(event.id, event.tenant, timeout)
            self._sleep(min(delay, left))
            delay = min(delay * 2, 0.25)

    def _send(self, topic: str, key: bytes, value: bytes) -> None:
        if self._sender is None:
            self._sender = _KafkaSender(self.settings, max(self.settings.apply_timeout_s, 1.0),
                                        [self.topic, dlq_topic(self.cartridge.name)])
        self._sender(topic, key, value)

    def close(self) -> None:
        if isinstance(self._sender, _KafkaSender):
            self._sender.close()
