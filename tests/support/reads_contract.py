"""The reads role of the store contract (keel.store.roles.StoreReads; docs/semantics.md, docs/contracts.md), written
once; every backend subclasses StoreReadsContract. The graph is written with the handler-style writers of
keel.store.base.Store and read through keel.reading (the tool-result reads, built on StoreReads alone).

    class TestMyStore(StoreReadsContract):
        def make_store(self) -> Store: ...   # a fresh, empty store

Includes hypothesis properties: the timeline rules against a brute-force model of the definition, and
the known_at definition (answer at K == answer of a store built from only the writes recorded by K).
"""
from __future__ import annotations

from itertools import pairwise
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from keel import reading
from keel.digest import digest
from keel.envelope import Instant
from keel.store.base import EntityInfo, Store, ViewRequest
from keel.store.memory import MemoryStore
from keel.times import format_time, parse_time

T = "acme"
E = "thing:one"


def day(n: int) -> str:
    """Day n of September 2026 onwards as a date string (n may exceed 30)."""
    return format_time(parse_time("2026-09-01") + (n - 1) * 86_400_000_000)


def values(facts: list[dict[str, Any]], predicate: str = "p") -> list[Any]:
    return [f["value"] for f in facts if f["predicate"] == predicate]


class StoreReadsContract:
    """Subclasses provide make_store(); every test starts from an empty store."""

    def make_store(self) -> Store:  # pragma: no cover - overridden
        raise NotImplementedError

    # ---- timelines -------------------------------------------------------------------------

    def test_open_fact_is_valid_from_its_start(self) -> None:
        s = self.make_store()
        s.open_fact(T, E, "p", 10, valid_from=day(5), source="src", evidence="e1")
        assert values(reading.facts(s, T, E, at=day(4))) == []
        assert values(reading.facts(s, T, E, at=day(5))) == [10]
        [f] = reading.facts(s, T, E, at=day(40))
        assert f == {"predicate": "p", "value": 10, "valid_from": day(5), "valid_to": None,
                     "recorded_at": day(5), "source": "src", "evidence": "e1", "scope": None, "by": None,
                     "expires_at": None, "corrected_by": None}

    def test_freshness_is_the_latest_recorded_at_applied(self) -> None:
        s = self.make_store()
        assert s.freshness(T).known_through is None
        s.open_fact(T, E, "p", 1, valid_from=day(1), recorded_at=day(3), evidence="e1")
        s.open_fact(T, E, "p", 0, valid_from=day(1), recorded_at=day(2), evidence="e0")   # recorded earlier
        assert s.freshness(T).known_through == parse_time(day(3))
        assert reading.view(s, T, E).freshness == s.freshness(T)                  # a view carries it, same request
        s.open_fact(T, E, "q", 1, valid_from=day(1), recorded_at=Instant(parse_time(day(4))), evidence="e2")
        assert s.freshness(T).known_through == parse_time(day(4))        # an event's time (an int subclass)
        assert s.freshness("other").known_through is None

    def test_a_new_version_closes_the_old_one_without_rewriting_it(self) -> None:
        s = self.make_store()
        s.open_fact(T, E, "p", 1, valid_from=day(1), evidence="e1")
        s.open_fact(T, E, "p", 2, valid_from=day(10), evidence="e2")
        assert values(reading.facts(s, T, E, at=day(9))) == [1]
        assert values(reading.facts(s, T, E, at=day(10))) == [2]
        h = reading.history(s, T, E)
        assert [(v["value"], v["valid_from"], v["valid_to"], v["evidence"]) for v in h] == [
            (1, day(1), day(10), "e1"), (2, day(10), None, "e2")]

    def test_late_event_lands_in_its_place(self) -> None:
        s = self.make_store()
        s.open_fact(T, E, "p", 3, valid_from=day(20), recorded_at=day(20))
        s.open_fact(T, E, "p", 1, valid_from=day(1), recorded_at=day(21))
        s.open_fact(T, E, "p", 2, valid_from=day(10), recorded_at=day(22))
        h = reading.history(s, T, E)
        assert [(v["value"], v["valid_from"], v["valid_to"]) for v in h] == [
            (1, day(1), day(10)), (2, day(10), day(20)), (3, day(20), None)]
        assert values(reading.facts(s, T, E, at=day(15))) == [2]

    def test_same_valid_from_is_a_correction(self) -> None:
        s = self.make_store()
        s.open_fact(T, E, "p", 100, valid_from=day(1), evidence="e1", recorded_at=day(1), source="sys")
        s.open_fact(T, E, "p", 90, valid_from=day(1), evidence="e2", recorded_at=day(3), by="human:ana")
        [was, v] = reading.history(s, T, E)
        assert (v["value"], v["evidence"], v["corrected_by"], v["by"]) == (90, "e2", "human:ana", "human:ana")
        assert (v["superseded_at"], v["superseded_by"]) == (None, None)
        assert (was["value"], was["superseded_at"], was["superseded_by"]) == (100, day(3), "e2")
        [old] = reading.history(s, T, E, known_at=day(2))
        assert (old["value"], old["evidence"], old["corrected_by"]) == (100, "e1", None)
        assert (old["superseded_at"], old["superseded_by"]) == (None, None)     # still believed then

    def test_correction_without_by_names_the_source(self) -> None:
        s = self.make_store()
        s.open_fact(T, E, "p", 1, valid_from=day(1), source="a", evidence="e1")
        s.open_fact(T, E, "p", 2, valid_from=day(1), source="b", evidence="e2")
        assert reading.history(s, T, E)[-1]["corrected_by"] == "b"

    def test_close_fact_ends_the_covering_version(self) -> None:
        s = self.make_store()
        s.open_fact(T, E, "p", 1, valid_from=day(1))
        s.close_fact(T, E, "p", valid_to=day(5))
        assert values(reading.facts(s, T, E, at=day(4))) == [1]
        assert values(reading.facts(s, T, E, at=day(5))) == []
        assert [(v["valid_from"], v["valid_to"]) for v in reading.history(s, T, E)] == [(day(1), day(5))]
        s.open_fact(T, E, "p", 2, valid_from=day(8))
        assert values(reading.facts(s, T, E, at=day(6))) == []
        assert reading.history(s, T, E)[-1]["valid_to"] is None

    def test_late_version_inside_a_closed_one_keeps_the_close(self) -> None:
        s = self.make_store()
        s.open_fact(T, E, "p", 1, valid_from=day(1))
        s.close_fact(T, E, "p", valid_to=day(10))
        s.open_fact(T, E, "p", 2, valid_from=day(5))
        assert [(v["value"], v["valid_from"], v["valid_to"]) for v in reading.history(s, T, E)] == [
            (1, day(1), day(5)), (2, day(5), day(10))]

    def test_history_orders_by_predicate_then_valid_from(self) -> None:
        s = self.make_store()
        s.open_fact(T, E, "b", 1, valid_from=day(2))
        s.open_fact(T, E, "a", 1, valid_from=day(3))
        s.open_fact(T, E, "a", 0, valid_from=day(1))
        assert [(v["predicate"], v["valid_from"]) for v in reading.history(s, T, E)] == [
            ("a", day(1)), ("a", day(3)), ("b", day(2))]
        assert [v["predicate"] for v in reading.history(s, T, E, predicate="b")] == ["b"]

    def test_values_keep_their_json_types(self) -> None:
        s = self.make_store()
        for i, v in enumerate([29.22, 4200000, "text", True, None, {"k": [1, 2]}, [1, "x"]]):
            s.open_fact(T, E, f"p{i}", v, valid_from=day(1))
        got = {f["predicate"]: f["value"] for f in reading.facts(s, T, E, at=day(2))}
        assert got == {"p0": 29.22, "p1": 4200000, "p2": "text", "p3": True, "p4": None, "p5": {"k": [1, 2]},
                       "p6": [1, "x"]}
        assert isinstance(got["p1"], int) and isinstance(got["p0"], float)

    def test_times_given_as_instants_are_kept_as_micros(self) -> None:
        """Envelope times reach handlers as keel.envelope.Instant (an int subclass): points, recorded_at and
        expiries given so are stored and read back as plain micros."""
        s = self.make_store()
        at, rec, exp = (Instant(parse_time(day(n))) for n in (1, 2, 9))
        s.open_fact(T, E, "p", 5, valid_from=at, recorded_at=rec, evidence="e1", expires_at=exp)
        s.link(T, E, "r", "thing:o", Instant(parse_time(day(1))), recorded_at=rec, evidence="e1")
        [f] = reading.facts(s, T, E, at=day(3))
        assert (f["value"], f["valid_from"], f["valid_to"]) == (5, day(1), day(9))
        assert [r["object"] for r in reading.relations(s, T, E, at=day(3))] == ["thing:o"]

    # ---- entities and labels ---------------------------------------------------------------

    def test_labels_are_kept_per_valid_time(self) -> None:
        s = self.make_store()
        s.upsert_entity(T, "thing", "one", ref="db#1", name="Old", valid_from=day(1))
        s.upsert_entity(T, "thing", "one", ref="db#1", name="New", valid_from=day(10))
        old = reading.entity_info(s, T, E, at=day(5))
        new = reading.entity_info(s, T, E, at=day(11))
        assert old is not None and new is not None
        assert (old.type, old.ref, old.labels) == ("thing", "db#1", {"name": "Old"})
        assert new.labels == {"name": "New"}

    def test_an_entity_only_referenced_by_a_relation_exists(self) -> None:
        s = self.make_store()
        s.link(T, "thing:one", "part_of", "group:g", day(1))
        assert reading.exists(s, T, "group:g")
        info = reading.entity_info(s, T, "group:g", at=day(2))
        assert info is not None and (info.type, info.ref, info.labels) == ("group", None, {})
        assert reading.entity_info(s, T, "group:zzz", at=day(2)) is None

    def test_entity_is_unknown_before_it_was_recorded(self) -> None:
        s = self.make_store()
        s.upsert_entity(T, "thing", "one", valid_from=day(1), recorded_at=day(3))
        assert reading.exists(s, T, E) and reading.exists(s, T, E, known_at=day(3))
        assert not reading.exists(s, T, E, known_at=day(2))
        assert reading.entity_info(s, T, E, at=day(5), known_at=day(2)) is None

    def test_recorded_many_matches_one_by_one(self) -> None:
        s = self.make_store()
        s.upsert_entity(T, "thing", "one", valid_from=day(2), recorded_at=day(3))
        s.link(T, E, "part_of", "group:g", day(1), recorded_at=day(5))
        assert s.recorded_many(T, [E, "group:g", "thing:none"]) == [
            parse_time(day(3)), parse_time(day(5)), None] == [
            s.entity_recorded_at(T, e) for e in (E, "group:g", "thing:none")]
        assert s.recorded_many(T, []) == []

    def test_views_answer_several_entities_and_tenants_at_once(self) -> None:
        s = self.make_store()
        s.upsert_entity(T, "thing", "one", ref="r1", name="One", valid_from=day(1), recorded_at=day(2))
        s.open_fact(T, E, "p", 1, valid_from=day(1), recorded_at=day(2))
        s.open_fact(T, E, "n", "mine", valid_from=day(1), recorded_at=day(2), scope="agent", owner="a|1")
        s.open_fact(T, E, "n", "theirs", valid_from=day(1), recorded_at=day(2), scope="agent", owner="a2")
        s.link(T, "group:g", "has", E, day(1), recorded_at=day(3))           # E only as the object
        s.upsert_entity(T, "thing", "two", name="Two", valid_from=day(1))     # no facts, no relations
        s.open_fact("other", "type:thing", "tip", "x", valid_from=day(1), scope="global")
        reqs = [ViewRequest(T, E, ["", "agent:a|1"]), ViewRequest(T, "thing:none"),
                ViewRequest("other", "type:thing", ["global"], "f"), ViewRequest("nobody", E),
                ViewRequest(T, E, None, "r"), ViewRequest(T, "thing:two"), ViewRequest(T, E, [], "lf")]
        one, none, tip, nobody, rels, two, no_notes = reading.views(s, reqs, at=day(5))
        assert none is None and nobody is None
        assert one is not None and one.info == EntityInfo(E, "thing", "r1", {"name": "One"})
        assert [(f["predicate"], f["value"], f["scope"]) for f in one.facts] == [("n", "mine", "agent"), ("p", 1, None)]
        assert [(r["subject"], r["relation"], r["object"]) for r in one.relations] == [("group:g", "has", E)]
        assert rels is not None and (rels.info.labels, rels.facts, len(rels.relations)) == ({}, [], 1)
        assert tip is not None and [(f["value"], f["scope"]) for f in tip.facts] == [("x", "global")]
        assert two is not None and (two.info.labels, two.facts, two.relations) == ({"name": "Two"}, [], [])
        assert no_notes is not None and (no_notes.facts, no_notes.relations) == ([], [])
        for k in (None, day(1), day(2), day(3)):
            assert reading.views(s, reqs, at=day(5), known_at=k) == [
                reading.view(s, r.tenant, r.entity, at=day(5), known_at=k, scopes=r.scopes, parts=r.parts) for r in reqs]
        assert reading.views(s, reqs, at=day(5), known_at=day(1))[0] is None           # not yet recorded
        before_link = reading.view(s, T, E, at=day(5), known_at=day(2))
        assert before_link is not None and before_link.relations == [] and len(before_link.facts) == 3
        assert reading.views(s, [], at=day(5)) == []

    # ---- relations -------------------------------------------------------------------------

    def test_relations_either_direction_with_filter(self) -> None:
        s = self.make_store()
        s.link(T, "thing:a", "part_of", "group:g", day(1), source="x", evidence="e1")
        s.link(T, "thing:b", "part_of", "group:g", day(2))
        s.link(T, "group:g", "owned_by", "person:p", day(1))
        rels = reading.relations(s, T, "group:g", at=day(3))
        assert [(r["subject"], r["relation"], r["object"]) for r in rels] == [
            ("group:g", "owned_by", "person:p"), ("thing:a", "part_of", "group:g"), ("thing:b", "part_of", "group:g")]
        assert [r["subject"] for r in reading.relations(s, T, "group:g", rel="part_of", at=day(3))] == ["thing:a", "thing:b"]
        assert rels[1] == {"subject": "thing:a", "relation": "part_of", "object": "group:g",
                           "valid_from": day(1), "valid_to": None}

    def test_unlink_ends_a_relation_and_relinking_while_linked_changes_nothing(self) -> None:
        s = self.make_store()
        s.link(T, "thing:a", "part_of", "group:g", day(1))
        s.link(T, "thing:a", "part_of", "group:g", day(3))
        [r] = reading.relations(s, T, "thing:a", at=day(4))
        assert (r["valid_from"], r["valid_to"]) == (day(1), None)
        s.unlink(T, "thing:a", "part_of", "group:g", day(5))
        assert reading.relations(s, T, "thing:a", at=day(6)) == []
        [r] = reading.relations(s, T, "thing:a", at=day(4))
        assert (r["valid_from"], r["valid_to"]) == (day(1), day(5))

    def test_views_read_again_at_other_times_and_after_writes_equal_the_memory_stores(self) -> None:
        """A store may reuse a view it built (the Redis store does, while nothing it read changed and the time
        stays where its answer holds): reads walking forward and back over days with versions, expiries and
        relations with ends, results changed by the caller, and writes in between must all still answer as the
        memory store does."""
        s, m = self.make_store(), MemoryStore()

        def both(write: str, *args: Any, **kwargs: Any) -> None:
            getattr(s, write)(*args, **kwargs)
            getattr(m, write)(*args, **kwargs)

        def check(days: list[int]) -> None:
            for d in days:
                got, want = reading.view(s, T, E, at=day(d)), reading.view(m, T, E, at=day(d))
                assert got is not None and want is not None
                assert (got.info, got.facts, got.relations) == (want.info, want.facts, want.relations), d
                got.facts.append({"changed": "by the caller"})
                got.info.labels["changed"] = True
                for row in got.relations:
                    row["valid_to"] = "changed"

        both("open_fact", T, E, "p", 1, valid_from=day(2))
        both("open_fact", T, E, "p", 2, valid_from=day(5))
        both("open_fact", T, E, "n", "x", valid_from=day(3), scope="tenant", expires_at=day(7))
        both("link", T, "thing:a", "part_of", E, day(2))
        both("link", T, "thing:b", "part_of", E, day(4))
        both("unlink", T, "thing:a", "part_of", E, day(6))
        days = list(range(1, 11))
        check(days + days[::-1] + days)
        both("link", T, "thing:c", "part_of", E, day(8))            # a new subject
        both("open_fact", T, E, "p", 3, valid_from=day(9))
        both("unlink", T, "thing:b", "part_of", E, day(9))          # a subject's relation ends
        check(days + days[::-1])

    # ---- knowledge time --------------------------------------------------------------------

    def test_known_at_hides_what_was_recorded_later(self) -> None:
        s = self.make_store()
        s.open_fact(T, E, "p", 1, valid_from=day(1), recorded_at=day(1))
        s.open_fact(T, E, "p", 2, valid_from=day(5), recorded_at=day(8))
        assert values(reading.facts(s, T, E, at=day(6), known_at=day(7))) == [1]
        assert values(reading.facts(s, T, E, at=day(6), known_at=day(8))) == [2]
        [v] = reading.history(s, T, E, known_at=day(7))
        assert v["valid_to"] is None

    def test_relations_respect_known_at(self) -> None:
        s = self.make_store()
        s.link(T, "thing:a", "part_of", "group:g", day(1), recorded_at=day(4))
        assert reading.relations(s, T, "thing:a", at=day(2), known_at=day(3)) == []
        assert len(reading.relations(s, T, "thing:a", at=day(2), known_at=day(4))) == 1

    # ---- notes, scopes, expiry -------------------------------------------------------------

    def test_scoped_notes_are_separate_timelines(self) -> None:
        s = self.make_store()
        s.open_fact(T, E, "p", "domain", valid_from=day(1))
        s.open_fact(T, E, "p", "mine", valid_from=day(2), scope="agent", owner="a1")
        s.open_fact(T, E, "p", "theirs", valid_from=day(2), scope="agent", owner="a2")
        s.open_fact(T, E, "p", "team", valid_from=day(2), scope="task", owner="t1")
        mine = reading.facts(s, T, E, at=day(3), scopes=["", "agent:a1"])
        assert [(f["value"], f["scope"]) for f in mine] == [("domain", None), ("mine", "agent")]
        assert [f["value"] for f in reading.facts(s, T, E, at=day(3), scopes=["", "task:t1"])] == ["domain", "team"]

    def test_expiry_ends_a_note(self) -> None:
        s = self.make_store()
        s.open_fact(T, E, "n", "x", valid_from=day(1), scope="tenant", expires_at=day(3))
        assert values(reading.facts(s, T, E, at=day(2)), "n") == ["x"]
        assert values(reading.facts(s, T, E, at=day(3)), "n") == []
        [v] = reading.history(s, T, E)
        assert (v["valid_to"], v["expires_at"], v["scope"]) == (day(3), day(3), "tenant")

    # ---- evidence, the change log, tenants, digest -------------------------------------------

    def test_evidence_standing_reads_provenance_and_retraction_voids(self) -> None:
        from keel.store.base import fact_write, new_write
        from keel.store.provenance import evidence_standing
        from keel.timeline import new_assertion, void_of
        s = self.make_store()

        def fact(value: int, evidence: str, *, scope: str | None = None, owner: str | None = None) -> Any:
            return fact_write(E, "p", value, parse_time(day(1)), False, source=None, evidence=evidence,
                              recorded_at=None, by=None, scope=scope, owner=owner)
        s.apply_writes(T, [fact(1, "e1"), fact_write("other:x", "q", 1, parse_time(day(1)), False, source=None,
                                                     evidence="e2", recorded_at=None, by=None)], "e1")
        s.apply_writes(T, [fact(2, "e3", scope="agent", owner="a1")], "e3")       # a note: no domain write
        assert evidence_standing(s, T, "e1", entity=E) == "touched"
        assert evidence_standing(s, T, "e1", type="thing") == "touched"
        assert evidence_standing(s, T, "e2", entity=E) is None                    # wrote about another entity
        assert evidence_standing(s, T, "e3", entity=E) is None
        assert evidence_standing(s, T, "e1", entity="thing:unknown") is None
        corrected = new_write(("f", E, "p", ""), new_assertion(parse_time(day(1)), void_of("e1"), True, None, "c1",
                                                               parse_time(day(2)), None))
        s.apply_writes(T, [corrected], "c1")
        assert evidence_standing(s, T, "e1", entity=E) == "touched"               # a correction's void: still evidence
        retraction = new_write(("f", E, "p", ""), new_assertion(parse_time(day(1)), void_of("e1", retraction=True),
                                                                True, None, "r1", parse_time(day(3)), None))
        s.apply_writes(T, [retraction], "r1")
        assert evidence_standing(s, T, "e1", entity=E) == "retracted"
        assert evidence_standing(s, T, "e1", type="thing") == "retracted"
        assert evidence_standing(s, T, "r1", entity=E) == "retraction"
        assert evidence_standing(s, "other", "e1", entity=E) is None

    def test_changes_are_every_write_in_apply_order(self) -> None:
        """Store.changes (keel/changes.py): the tenant's writes in apply order, paged by position or found by
        recorded time, each decoding to the assertion the timeline holds, with known_through read with them."""
        s = self.make_store()
        if not getattr(s, "keeps_changes", True):
            pytest.skip("a worker's mirror keeps no change log")
        s.open_fact(T, E, "p", 1, valid_from=day(5), recorded_at=day(5), evidence="e1")
        s.link(T, E, "r", "thing:two", day(1), recorded_at=day(6), evidence="e2")      # a late event
        s.open_fact(T, E, "n", {"a": [1, 2.5]}, valid_from=day(6), recorded_at=day(6), evidence="e3", by="agent:x",
                    scope="tenant", expires_at=day(9))
        s.close_fact(T, E, "p", valid_to=day(9), recorded_at=day(7), evidence="e4")
        page = s.changes(T, count=10)
        keys = [("f", E, "p", ""), ("r", E, "r", "thing:two"), ("f", E, "n", "tenant"), ("f", E, "p", "")]
        assert [(e.position, e.key) for e in page.entries] == list(enumerate(keys))
        assert (page.start, page.length, page.known_through) == (0, 4, parse_time(day(7)))
        for entry in page.entries:
            assert entry.assertion in s.assertions_many(T, [entry.key])[0]
        assert page.entries[2].assertion.value == {"a": [1, 2.5]}
        assert page.entries[3].assertion.closed and page.entries[2].assertion.expires_at == parse_time(day(9))
        later = s.changes(T, since=parse_time(day(5)), count=2)                 # recorded strictly after
        assert [e.position for e in later.entries] == [1, 2] and later.length == 4
        assert s.changes(T, since=parse_time(day(7)), count=5).entries == []
        s.open_fact(T, E, "q", "x", valid_from=day(1), recorded_at=day(8), evidence="e5")
        more = s.changes(T, start=4, generation=page.generation, count=10)     # a cursor: ingest went on
        assert [(e.position, e.key) for e in more.entries] == [(4, ("f", E, "q", ""))]
        elsewhere = s.changes(T, start=4, generation=page.generation + 7, since=parse_time(day(6)), count=10)
        assert elsewhere.start == 3         # a position of another generation: from `since` instead
        assert s.changes("nobody", count=5).entries == []

    def test_change_rows_equal_the_memory_stores(self) -> None:
        """keel.changes builds each row from a window of its timeline (Store.windows_many, cut by some backends):
        the rows equal those the memory store builds from whole timelines."""
        from keel.changes import change_rows
        from keel.store.base import fact_write, new_write
        from keel.timeline import new_assertion, void_of
        s, m = self.make_store(), MemoryStore()
        if not getattr(s, "keeps_changes", True):
            pytest.skip("a worker's mirror keeps no change log")
        for i in range(40):
            point, rec = day(1 + (i % 7) // 2), day(10 + i)
            writes = [fact_write(E, "p", i % 5, point, i % 9 == 8, source="s", evidence=f"e{i}", recorded_at=rec,
                                 by=None)]
            if i % 11 == 10:
                writes.append(new_write(("f", E, "p", ""), new_assertion(parse_time(day(2)), void_of(f"e{i - 3}"),
                                                                         True, None, f"e{i}", parse_time(rec))))
            if i % 13 == 12:
                writes.append(fact_write(E, "q", "late", day(1), False, source="s", evidence=f"e{i}", recorded_at=rec,
                                         by=None, scope="tenant", expires_at=day(3)))
            for store in (s, m):
                store.apply_writes(T, writes, f"e{i}")
        entries = m.changes(T, count=1000).entries
        assert s.changes(T, count=1000).entries == entries
        assert change_rows(s, T, entries) == change_rows(m, T, entries)

    def test_tenants_are_isolated(self) -> None:
        s = self.make_store()
        s.open_fact("a", E, "p", 1, valid_from=day(1))
        s.open_fact("b", E, "p", 2, valid_from=day(1))
        assert values(reading.facts(s, "a", E, at=day(2))) == [1]
        assert values(reading.facts(s, "b", E, at=day(2))) == [2]
        assert not reading.exists(s, "c", E)
        assert s.has_tenant("a") and not s.has_tenant("c")

    def test_digest_equals_the_memory_store_for_the_same_writes(self) -> None:
        s, m = self.make_store(), MemoryStore()
        for st_ in (s, m):
            st_.upsert_entity(T, "thing", "one", ref="r", name="N", valid_from=day(1), evidence="e1")
            st_.open_fact(T, E, "p", 1.5, valid_from=day(3), evidence="e2", recorded_at=day(4))
            st_.open_fact(T, E, "p", 2, valid_from=day(3), evidence="e3", by="human:x")
            st_.open_fact(T, E, "p", 0, valid_from=day(1), evidence="e4")
            st_.close_fact(T, E, "p", valid_to=day(9))
            st_.link(T, E, "part_of", "group:g", day(2))
            st_.apply_writes(T, [], "e1")
        assert digest(s, T) == digest(m, T)
        assert digest(s, "nobody") == digest(MemoryStore(), "nobody")

    # ---- properties ------------------------------------------------------------------------

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors])
    @given(st.lists(st.tuples(st.integers(1, 12), st.booleans(), st.integers(0, 3), st.integers(1, 12)),
                    min_size=1, max_size=14))
    def test_timeline_matches_the_definition(self, ops: list[tuple[int, bool, int, int]]) -> None:
        """Value at t as known at K == the last-logged visible assertion at the greatest point <= t."""
        s = self.make_store()
        for i, (point, closed, value, rec) in enumerate(ops):
            if closed:
                s.close_fact(T, E, "p", valid_to=day(point), evidence=f"e{i}", recorded_at=day(rec))
            else:
                s.open_fact(T, E, "p", value, valid_from=day(point), evidence=f"e{i}", recorded_at=day(rec))
        for k in (None, 3, 6, 12):
            visible = [(i, o) for i, o in enumerate(ops) if k is None or o[3] <= k]
            for t in range(14):
                at_or_before = [(o[0], i, o) for i, o in visible if o[0] <= t]
                expected: list[Any] = []
                if at_or_before:
                    _, i, (_, closed, value, _) = max(at_or_before)
                    expected = [] if closed else [(value, f"e{i}")]
                got = reading.facts(s, T, E, at=day(t), known_at=None if k is None else day(k))
                assert [(f["value"], f["evidence"]) for f in got] == expected, (k, t)
            history = reading.history(s, T, E, known_at=None if k is None else day(k))
            believed = [h for h in history if h["superseded_at"] is None]
            for a, b in pairwise(believed):
                assert a["valid_to"] is not None and a["valid_to"] <= b["valid_from"]
            for h in history:       # a superseded version was replaced at its own valid_from, by then
                if h["superseded_at"] is not None:
                    assert k is None or h["superseded_at"] <= day(k)
                    assert h["superseded_by"] is not None

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors])
    @given(st.lists(st.tuples(st.sampled_from(["open", "close", "link", "unlink", "label"]),
                              st.integers(1, 10), st.integers(0, 2), st.integers(1, 10)), min_size=1, max_size=12),
           st.integers(1, 10))
    def test_known_at_equals_a_rebuild_from_what_was_recorded_by_then(self, ops: list[tuple[str, int, int, int]],
                                                                      k: int) -> None:
        full, partial = self.make_store(), self.make_store()
        for i, op in enumerate(ops):
            _write(full, i, op)
            if op[3] <= k:
                _write(partial, i, op)
        for t in (1, 4, 7, 11):
            assert reading.facts(full, T, E, at=day(t), known_at=day(k)) == reading.facts(partial, T, E, at=day(t))
            assert reading.relations(full, T, E, at=day(t), known_at=day(k)) == reading.relations(partial, T, E, at=day(t))
            assert reading.entity_info(full, T, E, at=day(t), known_at=day(k)) == reading.entity_info(partial, T, E, at=day(t))
        assert reading.history(full, T, E, known_at=day(k)) == reading.history(partial, T, E)


def _write(s: Store, i: int, op: tuple[str, int, int, int]) -> None:
    kind, point, value, rec = op
    prov = {"evidence": f"e{i}", "recorded_at": day(rec), "source": "gen"}
    if kind == "open":
        s.open_fact(T, E, "p", value, valid_from=day(point), **prov)
    elif kind == "close":
        s.close_fact(T, E, "p", valid_to=day(point), **prov)
    elif kind == "link":
        s.link(T, E, "rel", f"other:o{value}", day(point), **prov)
    elif kind == "unlink":
        s.unlink(T, E, "rel", f"other:o{value}", day(point), **prov)
    else:
        s.upsert_entity(T, "thing", "one", valid_from=day(point), name=f"n{value}", **prov)
