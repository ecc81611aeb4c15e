"""KafkaLog (annotate in Redis mode) without Kafka: produce, then wait until a worker applied the event."""
from __future__ import annotations

import json

import pytest
from support.workers import ROOT

from keel.cartridge import load_cartridge
from keel.config import Settings
from keel.errors import EnvelopeRejected, WriteTimeout
from keel.kafka_log import KafkaLog
from keel.projector import Projector
from keel.store.memory import MemoryStore
from keel.tools import Tools
from keel.wire import events_topic


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def world():
    cartridge = load_cartridge(ROOT / "cartridges" / "finance")
    store = MemoryStore()
    projector = Projector(cartridge, store)
    for line in (ROOT / "cartridges" / "finance" / "events.jsonl").read_bytes().splitlines():
        projector.apply_raw(line)
    return cartridge, store, projector


def test_append_returns_once_the_worker_applied_the_event(world) -> None:
    cartridge, store, projector = world
    sent = []
    clock = FakeClock()

    def worker_applies_later(topic: str, key: bytes, value: bytes) -> None:
        sent.append((topic, key, json.loads(value)))
        original = clock.sleep

        def sleep(seconds: float) -> None:       # the worker applies it during the second poll
            original(seconds)
            if clock.now > 0.01:
                projector.apply_raw(value)
        log._sleep = sleep

    log = KafkaLog(cartridge, store, Settings(apply_timeout_s=5), sender=worker_applies_later,
                   sleep=clock.sleep, clock=clock)
    tools = Tools(cartridge, store, "hogar-demo", agent="debts", log=log)
    result = tools.annotate("debt:visa", "next_step", "call the bank", "tenant", evidence="snap-visa-2026-09")
    assert result["fact"]["value"] == "call the bank"
    [(topic, key, envelope)] = sent
    assert topic == events_topic("finance") and key == b"hogar-demo"
    assert envelope["type"] == "keel.annotated" and envelope["recorded_at"] == envelope["occurred_at"]


def test_append_times_out_when_no_worker_applies_it(world) -> None:
    cartridge, store, _ = world
    clock = FakeClock()
    log = KafkaLog(cartridge, store, Settings(apply_timeout_s=2), sender=lambda *a: None, sleep=clock.sleep,
                   clock=clock)
    envelope = {"id": "note-x", "tenant": "hogar-demo", "type": "keel.annotated", "subject": "debt:visa",
                "occurred_at": "2026-10-01T00:00:00Z", "recorded_at": "2026-10-01T00:00:00Z",
                "payload": {"predicate": "p", "value": 1, "scope": "tenant", "evidence": "snap-visa-2026-09"}}
    with pytest.raises(WriteTimeout, match="note-x"):
        log.append(envelope)
    assert 2 <= clock.now < 2.5


def test_append_rejects_a_bad_envelope_before_sending(world) -> None:
    cartridge, store, _ = world
    sent = []
    log = KafkaLog(cartridge, store, Settings(), sender=lambda *a: sent.append(a))
    with pytest.raises(EnvelopeRejected):
        log.append({"id": "x", "tenant": "hogar-demo", "type": "nope.nope", "subject": "debt:visa",
                    "occurred_at": "2026-10-01", "payload": {}})
    assert sent == []
