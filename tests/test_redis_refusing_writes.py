"""Issue 44's signals, on a real redis-server of the test's own that runs out of memory:

* the error names the cause ("Redis out of memory: refusing writes"), not the queued command that met it;
* a worker's readiness says so at once, not after --unready-after;
* the write retry waits at most RETRY_CAP_S between tries, and the first try after Redis accepts writes again
  writes the batch;
* dead letters are counted exactly once although the batch's write is redone after its counts were written.
"""
from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
from support.redis_nodes import RedisNode
from support.workers import ROOT, embedded_digests, topic_records, write_jsonl

from keel.cartridge import load_cartridge
from keel.digest import digest
from keel.errors import StoreRefusingWrites
from keel.store.redis import RedisStore
from workers.applier import BatchApplier, BatchPlan, DeadLetter
from workers.dlq import DeadLetterCounts
from workers.pipeline import RETRY_CAP_S, BatchPipeline
from workers.progress import Progress

REFUSING = "Redis out of memory: refusing writes"


@pytest.fixture
def node(tmp_path: Path):
    n = RedisNode(tmp_path / "redis").start()
    yield n
    n.stop()


def squeeze(node: RedisNode) -> None:
    node.client().config_set("maxmemory-policy", "noeviction")
    node.client().config_set("maxmemory", "1")          # below what it uses: every write refused


def release(node: RedisNode) -> None:
    node.client().config_set("maxmemory", "0")


def envelopes(n: int, tenants: int) -> list[dict]:
    out = []
    for i in range(n):
        day = f"2026-{1 + (i // 28) % 11:02d}-{1 + i % 28:02d}"
        out.append({"id": f"e{i}", "tenant": f"t{i % tenants}", "type": "debt.snapshot", "subject": f"debt:d{i % 5}",
                    "occurred_at": day, "recorded_at": day,
                    "payload": {"creditor": "Banco", "product": "Visa", "balance_cop": i, "rate_ea_pct": 20.0,
                                "installment_cop": 10, "month": day[:7]}})
    return out


class Sent:
    """Where the pipeline's dead letters go instead of a Kafka topic (this test is about Redis)."""

    def __init__(self) -> None:
        self.sent: list[DeadLetter] = []

    async def send(self, letters: list[DeadLetter]) -> None:
        self.sent += letters


class SqueezedAfterCounts(BatchApplier):
    """Redis runs out of memory right after the first batch's dead letters were counted, before its graph
    writes: the write is redone with its counts already in Redis (what issue 44's worker log showed)."""

    def __init__(self, *args: object, node: RedisNode, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.node = node
        self.squeezed = False

    def write(self, plan: BatchPlan) -> None:
        if not self.squeezed:
            self.squeezed = True
            squeeze(self.node)
        super().write(plan)


def test_a_refused_write_names_redis_out_of_memory_not_the_command(node: RedisNode) -> None:
    store = RedisStore.from_url(node.url, namespace="refusing")
    try:
        store.register_tenant("t0")
        squeeze(node)
        with pytest.raises(StoreRefusingWrites) as e:
            store.register_tenant("t1")
        assert str(e.value).startswith(REFUSING), str(e.value)
        assert "pipeline" not in str(e.value) and "Command #" not in str(e.value)
        assert "maxmemory" in str(e.value)                           # what to do about it
    finally:
        release(node)
        store.close()


def test_readiness_names_it_at_once_and_clears_on_progress() -> None:
    progress = Progress(unready_after_s=3600.0, log=logging.getLogger("test"), label="test")
    assert progress.unready() is None
    progress.outage("Redis: something", refusing=REFUSING)
    assert progress.unready() == REFUSING                            # not after an hour: now
    progress.outage("Redis: a timeout")                              # another outage keeps the cause known
    assert progress.unready() == REFUSING
    progress.progressed()
    assert progress.unready() is None
    progress.outage("Redis: a timeout")                              # an ordinary outage waits unready_after_s
    assert progress.unready() is None


def test_the_retry_resumes_on_its_next_try_and_counts_each_dead_letter_once(node: RedisNode, tmp_path: Path) -> None:
    cartridge = load_cartridge(ROOT / "cartridges" / "finance")
    events = envelopes(120, 4)
    bad = [(b"t1", b"\xff\xfe not UTF-8"), (b"t2", b'{"id": "broken", '), (b"t1", b"[]")]   # no tenant to read: ""
    values = [(e["tenant"].encode(), json.dumps(e).encode()) for e in events[:60]] + bad + \
             [(e["tenant"].encode(), json.dumps(e).encode()) for e in events[60:]]
    records = topic_records(values, partitions=1)
    store = RedisStore.from_url(node.url, namespace="squeezed")
    writer = RedisStore.from_url(node.url, namespace="squeezed")
    failures: list[str] = []
    at_release: list[int] = []

    def on_outage(e: BaseException) -> None:
        failures.append(str(e))
        if len(failures) == 6:                    # past the ramp (0.2, 0.4, 0.8, 1, 1): Redis takes writes again
            release(node)
            at_release.append(len(failures))

    applier = SqueezedAfterCounts(cartridge, store, writer=writer, node=node)
    counts = DeadLetterCounts(writer.client, "squeezed")
    sent = Sent()
    pipeline = BatchPipeline(applier, sent, counts, log=logging.getLogger("test"), on_outage=on_outage)  # type: ignore[arg-type]
    try:
        plan = asyncio.run(pipeline.process(records, stopping=lambda: False))
        assert plan is not None
        assert all(f.startswith("Redis out of memory: refusing writes") for f in failures), failures
        assert len(failures) == at_release[0] == 6          # the first try after the release wrote the batch
        waits = list(pipeline.waits)                        # one per failed try (planning or writing)
        assert len(waits) == 6 and waits[0] == 0.2 and max(waits) == RETRY_CAP_S == 1.0, waits
        tries = len(sent.sent) // 3                         # produced again with each try (the topic may repeat)
        assert len(sent.sent) == 3 * tries and tries >= 2
        assert counts.counts() == {"": 3}                   # counted once, though written before each try
        utf8 = next(d.reason for d in sent.sent if d.record.value.startswith(b"\xff"))
        assert "its producer must encode it as UTF-8" in utf8 and "file" not in utf8, utf8
        again = asyncio.run(pipeline.process(records, stopping=lambda: False))   # a redelivery of the batch
        assert again is not None and counts.counts() == {"": 3}
        expected = embedded_digests(cartridge, write_jsonl(tmp_path / "e.jsonl", events))
        assert {t: digest(store, t) for t in expected} == expected
    finally:
        pipeline.close()
        release(node)
        store.close()
        writer.close()


def test_a_primary_without_its_replicas_is_named_too(node: RedisNode) -> None:
    """min-replicas-to-write 1 and no replica: Redis answers NOREPLICAS; said as a refusal, not as a command."""
    store = RedisStore.from_url(node.url, namespace="noreplicas")
    try:
        node.client().config_set("min-replicas-to-write", "1")
        with pytest.raises(StoreRefusingWrites) as e:
            store.register_tenant("t1")
        assert e.value.refusal == ("Redis refusing writes: fewer replicas in sync than min-replicas-to-write "
                                   "(NOREPLICAS)")
        assert str(e.value).startswith(e.value.refusal) and "Command #" not in str(e.value)
    finally:
        node.client().config_set("min-replicas-to-write", "0")
        store.close()
