"""BatchPipeline without Kafka: batch k written while k+1 is planned, outages in either, mirror eviction."""
from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
from support.workers import (
    ROOT,
    by_partition_batches,
    embedded_digests,
    topic_records,
    write_jsonl,
)

from keel.cartridge import load_cartridge
from keel.digest import digest
from keel.errors import StoreUnavailable
from keel.store.memory import MemoryStore
from workers.applier import BatchApplier, DeadLetter
from workers.pipeline import BatchPipeline


class FlakyDurable(MemoryStore):
    """Fails the n-th commit step and the m-th tenant load, once each."""

    def __init__(self, fail_commit_at: set[int] = frozenset(), fail_load_at: set[int] = frozenset()) -> None:
        super().__init__()
        self.steps = 0
        self.loads = 0
        self.fail_commit_at = set(fail_commit_at)
        self.fail_load_at = set(fail_load_at)

    def commit_batch(self, tenant, events, position):
        self.steps += 1
        if self.steps in self.fail_commit_at:
            self.fail_commit_at.discard(self.steps)
            raise StoreUnavailable("injected commit failure", tenant=tenant)
        super().commit_batch(tenant, events, position)

    def event_ids(self, tenant: str) -> list[str]:
        self.loads += 1
        if self.loads in self.fail_load_at:
            self.fail_load_at.discard(self.loads)
            raise StoreUnavailable("injected load failure", tenant=tenant)
        return super().event_ids(tenant)


class NoKafka:
    """The dead-letter queue and counts, in memory."""

    def __init__(self) -> None:
        self.sent: list[DeadLetter] = []

    async def send(self, letters: list[DeadLetter]) -> None:
        self.sent += letters

    def record(self, letters: list[DeadLetter]) -> int:
        return len(letters)


def envelopes(n: int, tenants: int) -> list[dict]:
    out = []
    for i in range(n):
        day = f"2026-{1 + (i // 28) % 11:02d}-{1 + i % 28:02d}"     # file mode refuses a future recorded_at
        out.append({"id": f"e{i}", "tenant": f"t{i % tenants}", "type": "debt.snapshot", "subject": f"debt:d{i % 5}",
                    "occurred_at": day, "recorded_at": day,
                    "payload": {"creditor": "Banco", "product": "Visa", "balance_cop": i, "rate_ea_pct": 20.0,
                                "installment_cop": 10, "month": day[:7]}})
    return out


def run_overlapped(pipeline: BatchPipeline, batches: list) -> None:
    async def go() -> None:
        never = lambda: False
        pending = None
        for records in batches:
            if pending is None:
                plan = await pipeline.plan_until_done(records, stopping=never)
            else:
                written, plan = await pipeline.process_overlapped(pending, records, stopping=never)
                assert written is not None
                if plan is None:
                    plan = await pipeline.plan_until_done(records, stopping=never)
            pending = (records, plan)
        if pending is not None:
            await pipeline.process(pending[0], stopping=never, plan=pending[1])
    asyncio.run(go())
    pipeline.close()


@pytest.mark.parametrize(("fail_commit_at", "fail_load_at", "max_tenants"), [
    (set(), set(), 100_000),
    ({3, 11, 12, 40}, set(), 100_000),             # writes of batch k fail while k+1 is planned
    (set(), {5, 9, 14}, 100_000),                  # mirror loads fail while planning
    ({7, 25}, {14}, 3),                            # and a mirror smaller than the tenants in flight
])
def test_overlapped_batches_equal_the_embedded_build(fail_commit_at: set[int], fail_load_at: set[int],
                                                     max_tenants: int, tmp_path: Path) -> None:
    cartridge = load_cartridge(ROOT / "cartridges" / "finance")
    events = envelopes(400, 9)
    records = topic_records([(e["tenant"].encode(), json.dumps(e).encode()) for e in events], partitions=3)
    durable = FlakyDurable(fail_commit_at, fail_load_at)
    kafka = NoKafka()
    applier = BatchApplier(cartridge, durable, max_mirrored_tenants=max_tenants)
    pipeline = BatchPipeline(applier, kafka, kafka, log=logging.getLogger("test"), backoff=(0.001, 0.01))  # type: ignore[arg-type]
    run_overlapped(pipeline, by_partition_batches(records, 25))
    expected = embedded_digests(cartridge, write_jsonl(tmp_path / "e.jsonl", events))
    assert {t: digest(durable, t) for t in expected} == expected
    assert kafka.sent == []
    assert not durable.fail_commit_at and not durable.fail_load_at      # every injected failure happened
    if max_tenants < 9:
        assert len(applier.mirrors) <= 9
