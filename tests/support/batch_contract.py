"""The batch-writes role of the store contract (keel.store.roles.BatchWrites: apply_writes, commit_batch and
commit_many with offsets, applied ids and offsets, the partitions' watermarks and the `held` check), written
once; the memory store, the Redis store (single node and Cluster), the worker's RecordingStore and the Redis bulk
loader subclass BatchWritesContract.

    class TestMyBatches(BatchWritesContract):
        def make_batch_store(self) -> Store: ...   # a fresh, empty store
        checks_held = False       # only when its writes keep no watermark and refuse no `held` (StateBehind)
"""
from __future__ import annotations

from typing import Any

import pytest

from keel.digest import digest
from keel.errors import StateBehind
from keel.store.base import EventWrites, Store, Write, fact_write, relation_write
from keel.store.memory import MemoryStore

from .reads_contract import day

T = "acme"
TOPIC = "keel.t.events"


def event(n: int, value: Any = None, event_id: str | None = None) -> EventWrites:
    """An event writing a fact on thing:n and linking it to group:g, with id `e<n>` unless given."""
    eid = f"e{n}" if event_id is None else event_id
    writes: list[Write] = [
        fact_write(f"thing:{n}", "p", n if value is None else value, day(n), False, source="s", evidence=eid,
                   recorded_at=None, by=None),
        relation_write(f"thing:{n}", "in", "group:g", day(n), False, source="s", evidence=eid, recorded_at=None,
                       by=None)]
    return writes, eid


class BatchWritesContract:
    """Subclasses provide make_batch_store(); every test starts from an empty store. Then where a worker resumes,
    and how a store that lost acknowledged writes is noticed (keel.errors.StateBehind): the partitions' applied
    watermarks and the `held` check of a commit step, for the stores that keep them (`checks_held`)."""
    checks_held = True

    def make_batch_store(self) -> Store:  # pragma: no cover - overridden
        raise NotImplementedError

    def held_store(self) -> Store:
        if not self.checks_held:
            pytest.skip(f"{type(self).__name__}: writes without watermarks or the `held` check")
        return self.make_batch_store()

    def test_event_ids_are_recorded_with_the_writes(self) -> None:
        s = self.make_batch_store()
        assert not s.has_event(T, "e1")
        s.apply_writes(T, [fact_write("thing:one", "p", 1, day(1), False, source=None, evidence="e1",
                                      recorded_at=None, by=None)], "e1")
        s.apply_writes(T, [], "e0")
        assert s.has_event(T, "e1") and s.event_ids(T) == ["e0", "e1"]
        assert not s.has_event("other", "e1")

    def test_a_batch_applies_its_events_and_stores_the_offset(self) -> None:
        s = self.make_batch_store()
        assert s.applied_offset(T, TOPIC, 0) is None
        s.commit_batch(T, [event(1), event(2)], (TOPIC, 0, 41))
        assert s.has_event(T, "e1") and s.has_event(T, "e2") and not s.has_event(T, "e3")
        assert s.applied_offset(T, TOPIC, 0) == 41
        assert s.applied_offset(T, TOPIC, 1) is None and s.applied_offset("other", TOPIC, 0) is None
        m = MemoryStore()
        m.apply_writes(T, *event(1))
        m.apply_writes(T, *event(2))
        assert digest(s, T) == digest(m, T)

    def test_committing_a_batch_again_changes_nothing(self) -> None:
        s = self.make_batch_store()
        batch = [event(1), event(2)]
        s.commit_batch(T, batch, (TOPIC, 0, 7))
        before = digest(s, T)
        s.commit_batch(T, batch, (TOPIC, 0, 7))
        assert digest(s, T) == before and s.applied_offset(T, TOPIC, 0) == 7

    def test_an_event_id_applied_before_is_skipped_whole(self) -> None:
        s = self.make_batch_store()
        s.commit_batch(T, [event(1)], (TOPIC, 0, 1))
        s.commit_batch(T, [event(1, value="changed"), event(2, value="once"), event(2, value="twice", event_id="e2")],
                       (TOPIC, 0, 3))
        m = MemoryStore()
        m.apply_writes(T, *event(1))
        m.apply_writes(T, *event(2, value="once"))
        assert digest(s, T) == digest(m, T)

    def test_tenant_starts_read_what_the_single_reads_read(self) -> None:
        s = self.make_batch_store()
        s.commit_batch(T, [event(1), event(2)], (TOPIC, 0, 41))
        s.commit_batch(T, [event(3)], (TOPIC, 2, 7))
        s.commit_batch("other", [event(4)], (TOPIC, 1, 3))
        wanted = [(T, [(TOPIC, 0), (TOPIC, 1), (TOPIC, 2)]), ("other", {(TOPIC, 1)}), ("nobody", [(TOPIC, 0)]),
                  (T, ())]
        expected = [(s.event_ids(t), {tp: s.applied_offset(t, *tp) for tp in tps}, s.event_marks(t),
                     s.latest_recorded(t)) for t, tps in wanted]
        assert s.tenant_starts(wanted) == expected
        assert expected[0][0] == ["e1", "e2", "e3"] and expected[0][1] == {(TOPIC, 0): 41, (TOPIC, 1): None, (TOPIC, 2): 7}
        assert expected[2] == ([], {(TOPIC, 0): None}, {}, None)
        assert s.tenant_starts([]) == []

    def test_the_offset_only_moves_forward(self) -> None:
        s = self.make_batch_store()
        s.commit_batch(T, [event(1)], (TOPIC, 2, 10))
        s.commit_batch(T, [event(2)], (TOPIC, 2, 5))
        assert s.applied_offset(T, TOPIC, 2) == 10 and s.has_event(T, "e2")
        s.commit_batch(T, [], (TOPIC, 2, 12))       # a batch of refused records still moves the offset
        assert s.applied_offset(T, TOPIC, 2) == 12

    def test_commit_many_equals_its_steps_one_by_one(self) -> None:
        s, one = self.make_batch_store(), MemoryStore()
        steps = [(T, [event(1), event(2)], (TOPIC, 0, 2)), ("beta", [event(3)], (TOPIC, 1, 9)),
                 (T, [event(2), event(4)], (TOPIC, 0, 4))]
        s.commit_many(steps)
        for tenant, events, position in steps:
            one.commit_batch(tenant, events, position)
        for tenant in (T, "beta"):
            assert digest(s, tenant) == digest(one, tenant)
        assert (s.applied_offset(T, TOPIC, 0), s.applied_offset("beta", TOPIC, 1)) == (4, 9)

    def test_watermarks_only_move_forward(self) -> None:
        s = self.held_store()
        s.advance_partitions({(TOPIC, 0): 41, (TOPIC, 3): 7}, {})
        s.advance_partitions({(TOPIC, 0): 12}, {})          # a late writer's older batch: no step back
        assert s.partitions_applied(TOPIC, [0, 1, 3]) == {0: 41, 1: None, 3: 7}
        assert s.partitions_applied("keel.other.events", [0]) == {0: None}
        assert s.holds_data()

    def test_a_watermark_below_what_the_writer_saw_is_refused_whole(self) -> None:
        s = self.held_store()
        s.advance_partitions({(TOPIC, 0): 41, (TOPIC, 1): 5}, {})
        with pytest.raises(StateBehind) as caught:
            s.advance_partitions({(TOPIC, 0): 60, (TOPIC, 1): 9}, {(TOPIC, 0): 41, (TOPIC, 1): 8})
        assert (caught.value.topic, caught.value.partition, caught.value.held, caught.value.stored) == (TOPIC, 1, 8, 5)
        assert s.partitions_applied(TOPIC, [0, 1]) == {0: 41, 1: 5}       # nothing written
        with pytest.raises(StateBehind) as caught:
            s.advance_partitions({(TOPIC, 2): 3}, {(TOPIC, 2): 1})
        assert caught.value.stored is None
        s.advance_partitions({(TOPIC, 0): 60, (TOPIC, 1): 9}, {(TOPIC, 0): 41, (TOPIC, 1): 5})
        assert s.partitions_applied(TOPIC, [0, 1]) == {0: 60, 1: 9}

    def test_a_step_whose_tenant_went_back_is_refused_whole(self) -> None:
        s = self.held_store()
        s.commit_batch(T, [event(1)], (TOPIC, 0, 10, None, None))
        before = digest(s, T)
        with pytest.raises(StateBehind) as caught:
            s.commit_batch(T, [event(2)], (TOPIC, 0, 20, None, 15))    # the writer saw 15 land; Redis has 10
        e = caught.value
        assert (e.tenant, e.topic, e.partition, e.held, e.stored) == (T, TOPIC, 0, 15, 10)
        assert digest(s, T) == before and not s.has_event(T, "e2") and s.applied_offset(T, TOPIC, 0) == 10
        with pytest.raises(StateBehind) as caught:                         # a tenant Redis does not hold at all
            s.commit_batch("other", [event(3)], (TOPIC, 0, 20, 30, 4))
        assert caught.value.stored is None and not s.has_event("other", "e3")
        s.commit_batch(T, [event(2)], (TOPIC, 0, 20, 30, 10))             # what it holds: applied
        assert s.has_event(T, "e2") and s.applied_offset(T, TOPIC, 0) == 20
        s.commit_many([(T, [event(4)], (TOPIC, 0, 25, None, 20)), ("third", [event(5)], (TOPIC, 1, 3, None, None))])
        assert s.has_event(T, "e4") and s.has_event("third", "e5")
