"""The worker's batch logic without Kafka: records → mirrors → one commit per tenant, against a fake durable
store with RedisStore's batch API. The pass mark is the same as with real services: equal digests."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.workers import (
    CARTRIDGES,
    ROOT,
    T0_MS,
    FailingStore,
    by_partition_batches,
    embedded_digests,
    sample_records,
    topic_records,
    write_jsonl,
)

from keel import reading
from keel.cartridge import load_cartridge
from keel.digest import digest
from keel.errors import StoreUnavailable
from keel.times import format_time
from workers.applier import BatchApplier
from workers.records import Record


def run(applier: BatchApplier, batches: list[list[Record]]) -> list:
    plans = []
    for batch in batches:
        plan = applier.plan(batch)
        applier.commit(plan)
        plans.append(plan)
    return plans


@pytest.mark.parametrize("name", CARTRIDGES)
@pytest.mark.parametrize("size", [1, 7, 1000])
def test_sample_stream_equals_embedded_build(name: str, size: int) -> None:
    cartridge = load_cartridge(ROOT / "cartridges" / name)
    durable = FailingStore()
    plans = run(BatchApplier(cartridge, durable), by_partition_batches(sample_records(name), size))
    assert not [d for p in plans for d in p.dead_letters]
    expected = embedded_digests(cartridge, ROOT / "cartridges" / name / "events.jsonl")
    assert {t: digest(durable, t) for t in expected} == expected


@pytest.mark.parametrize("name", CARTRIDGES)
@pytest.mark.parametrize("written_first", [False, True])
def test_overlapped_batches_equal_embedded_build(name: str, written_first: bool) -> None:
    """As the worker runs them: batch k+1 is planned before k is settled, with k written before or after
    that plan. Mirrors whose graph was released reload it from the durable store on a handler's read, and
    the writes Redis does not hold yet are applied on top (those it holds are skipped by event id)."""
    cartridge = load_cartridge(ROOT / "cartridges" / name)
    durable = FailingStore()
    applier = BatchApplier(cartridge, durable)
    previous = None
    for batch in by_partition_batches(sample_records(name), 7):
        if previous is not None and written_first:
            applier.write(previous)
        plan = applier.plan(batch)
        if previous is not None:
            if not written_first:
                applier.write(previous)
            applier.settle(previous)
        previous = plan
    assert previous is not None
    applier.commit(previous)
    expected = embedded_digests(cartridge, ROOT / "cartridges" / name / "events.jsonl")
    assert {t: digest(durable, t) for t in expected} == expected
    assert {t: digest(applier.mirrors.memory, t) for t in expected} == expected     # the mirrors too


@pytest.mark.parametrize("name", CARTRIDGES)
def test_redelivery_changes_nothing(name: str) -> None:
    cartridge = load_cartridge(ROOT / "cartridges" / name)
    records = sample_records(name)
    durable = FailingStore()
    run(BatchApplier(cartridge, durable), by_partition_batches(records, 10))
    before = {t: digest(durable, t) for t in durable.tenants()}
    # the same worker, then a fresh one (mirrors loaded from the durable store), get everything again
    for applier in (BatchApplier(cartridge, durable), BatchApplier(cartridge, durable)):
        plans = run(applier, by_partition_batches(records, 13))
        assert sum(p.skipped for p in plans) == len(records)
        assert sum(p.applied for p in plans) == 0
    assert {t: digest(durable, t) for t in durable.tenants()} == before


def test_same_events_published_twice_are_duplicates() -> None:
    cartridge = load_cartridge(ROOT / "cartridges" / "fleet")
    first = sample_records("fleet")
    values = [(r.key, r.value) for r in first]
    twice = topic_records(values + values)
    durable = FailingStore()
    plans = run(BatchApplier(cartridge, durable), by_partition_batches(twice, 16))
    assert sum(p.applied for p in plans) == len(first)
    assert sum(p.duplicates for p in plans) == len(first)
    expected = embedded_digests(cartridge, ROOT / "cartridges" / "fleet" / "events.jsonl")
    assert {t: digest(durable, t) for t in expected} == expected


def test_store_failure_mid_batch_then_retry_gives_the_same_graph(tmp_path: Path) -> None:
    cartridge = load_cartridge(ROOT / "cartridges" / "finance")
    envelopes = [good(i, tenant=f"t{i % 3}") for i in range(60)]
    records = topic_records([raw(e) for e in envelopes], partitions=2)
    durable = FailingStore()
    applier = BatchApplier(cartridge, durable)
    for i, batch in enumerate(by_partition_batches(records, 9)):
        plan = applier.plan(batch)
        durable.fail_after = durable.commits + i % len(plan.tenants)     # some tenants committed, then a failure
        with pytest.raises(StoreUnavailable):
            applier.commit(plan)
        assert not plan.touched & set(applier.mirrors.memory.tenants())  # dropped: they held uncommitted writes
        applier.commit(applier.plan(batch))                              # the worker retries the whole batch
    expected = embedded_digests(cartridge, write_jsonl(tmp_path / "e.jsonl", envelopes))
    assert {t: digest(durable, t) for t in expected} == expected


def test_forgetting_a_partition_reloads_mirrors_from_the_store() -> None:
    cartridge = load_cartridge(ROOT / "cartridges" / "finance")
    records = sample_records("finance", partitions=1)
    durable = FailingStore()
    applier = BatchApplier(cartridge, durable)
    half = len(records) // 2
    run(applier, [records[:half]])
    assert applier.forget({(records[0].topic, records[0].partition)}) == 1
    run(applier, [records[half:]])
    expected = embedded_digests(cartridge, ROOT / "cartridges" / "finance" / "events.jsonl")
    assert {t: digest(durable, t) for t in expected} == expected


def good(i: int, tenant: str = "acme", **changes: object) -> dict:
    env = {"id": f"snap-{i}", "tenant": tenant, "type": "debt.snapshot", "subject": f"debt:d{i % 3}",
           "occurred_at": f"2026-09-{1 + i % 28:02d}",
           "payload": {"creditor": "Banco", "product": "Visa", "balance_cop": 1000 * i, "rate_ea_pct": 20.0,
                       "installment_cop": 10, "month": "2026-09"}}
    env["recorded_at"] = env["occurred_at"]          # canonical, as `keel publish` sends it
    env.update(changes)
    return {k: v for k, v in env.items() if v is not None}


def raw(env: dict) -> tuple[bytes, bytes]:
    return env["tenant"].encode(), json.dumps(env).encode()


def test_bad_records_become_dead_letters_and_the_rest_is_applied(tmp_path: Path) -> None:
    cartridge = load_cartridge(ROOT / "cartridges" / "finance")
    bad_payload = good(100)
    bad_payload["payload"] = {**bad_payload["payload"], "balance_cop": "lots"}
    values = [raw(good(1)), (b"acme", b"{not json"), raw(good(2, type="debt.vanished")), raw(bad_payload),
              (b"other", json.dumps(good(3)).encode()), (None, json.dumps(good(4)).encode()),
              (b"acme", None), raw(good(5))]
    records = topic_records(values, partitions=1)
    durable = FailingStore()
    applier = BatchApplier(cartridge, durable)
    [plan] = run(applier, [records])
    reasons = {d.record.offset: d.reason for d in plan.dead_letters}
    assert sorted(reasons) == [1, 2, 3, 4, 5, 6]
    assert "not valid JSON" in reasons[1]
    assert "unknown event type 'debt.vanished'" in reasons[2]
    assert "payload.balance_cop: expected number" in reasons[3]
    assert "is not the envelope's tenant" in reasons[4] and "is not the envelope's tenant" in reasons[5]
    assert "empty record" in reasons[6]
    assert {d.record.offset: (d.event_id, d.tenant) for d in plan.dead_letters}[3] == ("snap-100", "acme")
    assert all(d.record is records[d.record.offset] for d in plan.dead_letters)    # original bytes kept
    expected = embedded_digests(cartridge, write_jsonl(tmp_path / "good.jsonl", [good(1), good(5)]))
    assert digest(durable, "acme") == expected["acme"]
    # a redelivery dead-letters again only what has no readable tenant (it has no applied offset to check)
    [again] = run(BatchApplier(cartridge, durable), [records])
    assert sorted(d.record.offset for d in again.dead_letters) == [1, 6]


def test_a_failing_handler_is_a_dead_letter_and_nothing_of_it_is_written(monkeypatch: pytest.MonkeyPatch) -> None:
    cartridge = load_cartridge(ROOT / "cartridges" / "finance")
    original = cartridge.registry.handler("debt.snapshot")

    def flaky(event, store):
        original(event, store)
        if event.payload["balance_cop"] == 2000:
            raise ZeroDivisionError("boom")
    monkeypatch.setitem(cartridge.registry._handlers, "debt.snapshot", flaky)
    durable = FailingStore()
    [plan] = run(BatchApplier(cartridge, durable), [topic_records([raw(good(1)), raw(good(2)), raw(good(3))])])
    [dead] = plan.dead_letters
    assert "ZeroDivisionError: boom" in dead.reason and dead.event_id == "snap-2"
    assert durable.event_ids("acme") == ["snap-1", "snap-3"]
    assert plan.applied == 2


def test_recorded_at_is_the_record_timestamp_when_the_envelope_has_none() -> None:
    cartridge = load_cartridge(ROOT / "cartridges" / "finance")
    durable = FailingStore()
    run(BatchApplier(cartridge, durable), [topic_records([raw(good(1, recorded_at=None))], timestamp_ms=T0_MS)])
    [fact] = reading.history(durable, "acme", "debt:d1", predicate="balance_cop")
    assert fact["recorded_at"] == format_time(T0_MS * 1000)
    kept = good(2, tenant="other", recorded_at="2026-10-01T00:00:00Z")
    run(BatchApplier(cartridge, durable), [topic_records([raw(kept)], topic="other")])
    [fact] = reading.history(durable, "other", "debt:d2", predicate="balance_cop")
    assert fact["recorded_at"] == "2026-10-01T00:00:00Z"
    late = good(4, recorded_at="2026-10-01T00:00:00Z")     # earlier than acme's latest: taken as that latest
    run(BatchApplier(cartridge, durable), [topic_records([raw(late)], topic="other")])
    versions = reading.history(durable, "acme", "debt:d1", predicate="balance_cop", known_at=format_time(T0_MS * 1000))
    assert [(v["value"], v["recorded_at"]) for v in versions] == [(1000, format_time(T0_MS * 1000)),
                                                                   (4000, format_time(T0_MS * 1000))]


def test_notes_apply_in_order_and_a_refused_note_is_a_dead_letter() -> None:
    cartridge = load_cartridge(ROOT / "cartridges" / "finance")
    note = {"id": "note-1", "tenant": "acme", "type": "keel.annotated", "subject": "debt:d1",
            "occurred_at": "2026-09-20T00:00:00Z", "source": "keel.annotate",
            "payload": {"predicate": "next_step", "value": "call", "scope": "tenant", "evidence": "snap-1"}}
    refused = {**note, "id": "note-2", "payload": {**note["payload"], "evidence": "nope"}}
    global_note = {**note, "id": "note-3", "subject": "type:debt", "payload": {**note["payload"], "scope": "global"}}
    durable = FailingStore()
    applier = BatchApplier(cartridge, durable, allow_global_notes=True)
    records = topic_records([raw(good(1)), raw(note), raw(refused), raw(global_note)])
    [plan] = run(applier, [records])
    assert [d.event_id for d in plan.dead_letters] == ["note-2"]
    assert "evidence 'nope' is not an event of this tenant" in plan.dead_letters[0].reason
    assert [f["value"] for f in reading.history(durable, "acme", "debt:d1", predicate="next_step", scopes=["tenant"])] == \
        ["call"]
    assert durable.event_ids("_global") == ["acme/note-3"]
    run(BatchApplier(cartridge, durable, allow_global_notes=True), [records])      # redelivered: no twin
    assert len(reading.history(durable, "_global", "type:debt", scopes=["global"])) == 1
