"""Redis store checks shared by the single-node and Cluster suites (tests/test_store_redis.py,
tests/test_redis_cluster.py): plumbing (`RedisCase`), a random workload and `RedisChecks`."""
from __future__ import annotations

import random
import uuid
from typing import Any

import pytest

from keel import reading
from keel.digest import digest
from keel.errors import UsageError
from keel.store.base import (
    GLOBAL_TENANT,
    Key,
    Store,
    ViewRequest,
    Write,
    fact_write,
    label_writes,
    new_write,
    relation_write,
)
from keel.store.memory import MemoryStore
from keel.store.redis import RedisStore
from keel.store.redis.keys import layout_key, registry_key, watermarked_key
from keel.store.roles import StoreReads
from keel.timeline import covering, new_assertion, void_of
from keel.times import format_time, parse_time

pytestmark = pytest.mark.services

DAY = 86_400_000_000
T0 = parse_time("2026-09-01")


def d(n: float) -> int:
    return T0 + int(n * DAY)


class RedisCase:
    """Shared plumbing: `url` and a shared `client` set per class; every store gets its own namespace."""

    url: str
    client: Any
    cluster: bool = False
    store_class: type[RedisStore] = RedisStore          # the store under test (a subclass: tiny segments, spies)

    def setup_method(self) -> None:
        self._stores: list[RedisStore] = []

    def teardown_method(self) -> None:
        for store in self._stores:
            store.drop_namespace()

    def make_store(self) -> Store:
        return self.redis_store()

    def redis_store(self, namespace: str | None = None) -> RedisStore:
        store = self.store_class(self.client, namespace=namespace or f"t{uuid.uuid4().hex[:12]}", owns_client=False)
        self._stores.append(store)
        return store


# ---- a random workload, replayed into MemoryStore and the store under test ---------------------

ENTITIES = ["debt:a", "debt:b.x@y-z", "due:q-2026-09", "acct:1"]
NAMES = ["p", "q|x", "%25r", "with space", "ü{n}*?[", "a\nb"]


def random_batches(seed: int, n: int = 120) -> list[tuple[list[Write], str | None]]:
    """Writes of every shape: corrections at one point, closes, late points, other recorded_at, expiries."""
    rnd = random.Random(seed)
    out: list[tuple[list[Write], str | None]] = []
    for i in range(n):
        writes: list[Write] = []
        for _ in range(rnd.randint(0, 5)):
            e = rnd.choice(ENTITIES)
            point = d(rnd.randint(0, 20)) + rnd.choice([0, 0, 0, 1, 999_999])
            rec = point + rnd.choice([0, 0, 5, DAY, -DAY]) * rnd.randint(0, 3)
            src, by = rnd.choice([None, "s", "sys"]), rnd.choice([None, None, "human:ana"])
            kind = rnd.random()
            if rnd.random() < 0.15:      # a void (a correction's): the point counts for nothing while it wins
                key = rnd.choice([("f", e, rnd.choice(NAMES), ""), ("l", e, "name"), ("r", e, "rel", rnd.choice(ENTITIES))])
                writes.append(new_write(key, new_assertion(point, void_of(f"ev{i}"), True, src, f"ev{i}", rec, by)))
            elif kind < 0.5:
                scope = rnd.choice([None, None, "tenant", "task", "agent"])
                writes.append(fact_write(
                    e, rnd.choice(NAMES), rnd.choice([1, -2, 2.5, 1e300, "x", "ü\"q", None, {"a": [1]}, True, [1, "y"]]),
                    point, rnd.random() < 0.2, source=src, evidence=rnd.choice([f"ev{i}", f"other{i % 3}", None]),
                    recorded_at=rec, by=by, scope=scope, owner=rnd.choice(["t|1", "a%2", "x"]),
                    expires_at=rnd.choice([None, None, point + 3 * DAY])))
            elif kind < 0.8:
                writes.append(relation_write(e, rnd.choice(["rel", "r|2"]), rnd.choice(ENTITIES), point,
                                             rnd.random() < 0.3, source=src, evidence=f"ev{i}", recorded_at=rec, by=by))
            else:
                writes += label_writes(e, rnd.choice([None, "r#1"]), rnd.choice([{}, {"name": "N"}, {"n|x": 2}]),
                                       valid_from=point, source=src, evidence=f"ev{i}", recorded_at=rec, by=by)
        out.append((writes, rnd.choice([None, f"ev{i}"])))
    return out


def same_keys(s: Store, keys: list[Key], expected: list[Key]) -> bool:
    """Store.keys promises a stable order, the backend's own: the memory store's is creation order, Redis's an
    entity's timelines, then the relations naming it, sorted; compare as such."""
    return keys == expected if isinstance(s, MemoryStore) else sorted(keys) == sorted(expected)


def assert_same_graph(m: MemoryStore, s: Store, tenant: str) -> None:
    assert digest(s, tenant) == digest(m, tenant)
    assert list(s.dump(tenant)) == list(m.dump(tenant))
    assert s.event_ids(tenant) == m.event_ids(tenant)
    assert list(s.search_entities(tenant)) == list(m.search_entities(tenant))
    mine, theirs = list(s.entity_indexes(tenant)), list(m.entity_indexes(tenant))
    assert [(e, f) for e, f, _ in mine] == [(e, f) for e, f, _ in theirs]
    assert all(same_keys(s, a[2], b[2]) for a, b in zip(mine, theirs))
    entities = sorted({e for key, _ in m.dump(tenant) for e in ((key[1], key[3]) if key[0] == "r" else (key[1],))})
    own_as_of = type(s).as_of_many is not StoreReads.as_of_many
    for e in entities:
        keys: list[Key] = m.keys(tenant, e)
        assert same_keys(s, s.keys(tenant, e), keys)
        assert s.entity_recorded_at(tenant, e) == m.entity_recorded_at(tenant, e)
        for known_at in (None, d(0), d(3.5), d(12), d(40)):
            versions = s.versions_many(tenant, keys, known_at)
            assert versions == m.versions_many(tenant, keys, known_at), (e, known_at)
            assert s.as_of_many(tenant, keys, d(5), known_at) == m.as_of_many(tenant, keys, d(5), known_at)
            for t in range(-1, 24):
                for at in (d(t) - 1, d(t), d(t) + 1):
                    # a store that keeps StoreReads.as_of_many answers covering(versions_many) by definition: the
                    # versions read once stand for it (a whole read per time made these tests minutes long)
                    got = s.as_of_many(tenant, keys, at, known_at) if own_as_of else \
                        [covering(v, at) for v in versions]
                    assert got == m.as_of_many(tenant, keys, at, known_at), (e, format_time(at), known_at)
        for at in (d(2), d(30)):
            assert reading.facts(s, tenant, e, at=at) == reading.facts(m, tenant, e, at=at)
            assert reading.relations(s, tenant, e, at=at) == reading.relations(m, tenant, e, at=at)
            assert reading.entity_info(s, tenant, e, at=at) == reading.entity_info(m, tenant, e, at=at)
        assert reading.history(s, tenant, e) == reading.history(m, tenant, e)
    assert_same_views(m, s, tenant, entities)


def assert_same_views(m: MemoryStore, s: Store, tenant: str, entities: list[str]) -> None:
    """`views` of every entity (in one call), with and without scopes, at several times and knowledge times."""
    requests = [ViewRequest(tenant, e, scopes, parts) for e in [*entities, "thing:unknown"]
                for scopes, parts in ((None, "lfr"), (["", "task:t|1", "agent:a%2"], "lfr"), (None, "r"))]
    for known_at in (None, d(0), d(3.5), d(12), d(40)):
        for at in (d(-1), d(2), d(7.5) + 1, d(30)):
            assert reading.views(s, requests, at=at, known_at=known_at) == reading.views(m, requests, at=at, known_at=known_at), \
                (format_time(at), known_at)


class RedisChecks(RedisCase):
    """Redis-specific checks, run on a single node and on Cluster."""

    # ---- equivalence with the reference store ------------------------------------------------

    @pytest.mark.parametrize("seed", [1, 2, 3])
    def test_random_writes_equal_the_memory_store(self, seed: int) -> None:
        s, m = self.redis_store(), MemoryStore()
        for writes, event_id in random_batches(seed):
            m.apply_writes("acme", writes, event_id)
            s.apply_writes("acme", writes, event_id)
        assert_same_graph(m, s, "acme")

    def test_commit_batch_equals_event_by_event(self) -> None:
        batches = [(w, f"e{i}") for i, (w, _) in enumerate(random_batches(7, 200))]
        s, m = self.redis_store(), MemoryStore()
        for i in range(0, len(batches), 37):
            s.commit_batch("acme", batches[i:i + 37], ("keel.x.events", 3, i + 36))
        for writes, event_id in batches:
            m.apply_writes("acme", writes, event_id)
        assert_same_graph(m, s, "acme")
        assert s.applied_offset("acme", "keel.x.events", 3) == 185 + 36

    def test_many_assertions_at_one_point_keep_log_order(self) -> None:
        s, m = self.redis_store(), MemoryStore()
        for store in (s, m):
            for i in range(25):      # sequence numbers of two digits and more
                store.open_fact("acme", "thing:x", "p", i, valid_from=d(1), evidence=f"e{i}", recorded_at=d(1 + i))
            store.apply_writes("acme", [fact_write("thing:x", "p", v, d(1), False, source="s", evidence="same",
                                                   recorded_at=d(30), by=None) for v in ("a", "b", "c")], "one")
        assert_same_graph(m, s, "acme")
        assert reading.facts(s, "acme", "thing:x", at=d(2))[0]["value"] == "c"
        assert reading.facts(s, "acme", "thing:x", at=d(2), known_at=d(10))[0]["value"] == 9

    # ---- batches, idempotency, offsets ----------------------------------------------------------

    def test_commit_batch_marks_ids_and_offset_and_a_recommit_changes_nothing(self) -> None:
        s = self.redis_store()
        events = [([fact_write(f"thing:t{i % 4}", "p", i, d(i), False, source="s", evidence=f"e{i}",
                               recorded_at=d(i), by=None)], f"e{i}") for i in range(50)]
        assert s.applied_offset("acme", "topic", 0) is None
        s.commit_batch("acme", events, ("topic", 0, 149))
        before = digest(s, "acme")
        version = s.search_version("acme")
        assert s.applied_offset("acme", "topic", 0) == 149
        assert s.event_ids("acme") == sorted(f"e{i}" for i in range(50))
        s.commit_batch("acme", events, ("topic", 0, 149))
        s.commit_batch("acme", events[10:20] + events[10:20], ("topic", 0, 120))     # older offset, repeats
        assert digest(s, "acme") == before
        assert s.search_version("acme") == version
        assert s.applied_offset("acme", "topic", 0) == 149          # offsets only move forward
        assert s.applied_offset("acme", "topic", 1) is None
        assert s.applied_offset("acme", "other", 0) is None

    def test_commit_batch_with_some_events_already_applied_applies_the_rest(self) -> None:
        s, m = self.redis_store(), MemoryStore()
        events = [([fact_write("thing:t", "p", i, d(i % 5), False, source="s", evidence=f"e{i}", recorded_at=d(i),
                               by=None)], f"e{i}") for i in range(20)]
        s.commit_batch("acme", events[:8], ("t", 0, 7))
        s.commit_batch("acme", events[4:], ("t", 0, 19))
        for writes, event_id in events:
            m.apply_writes("acme", writes, event_id)
        assert_same_graph(m, s, "acme")
        assert s.applied_offset("acme", "t", 0) == 19

    def test_commit_batch_is_all_or_nothing(self) -> None:
        s = self.redis_store()
        s.commit_batch("acme", [([fact_write("thing:t", "p", 1, d(1), False, source="s", evidence="e0",
                                             recorded_at=d(1), by=None)], "e0")], ("t", 0, 0))
        before = digest(s, "acme")
        bad = [([fact_write("thing:t", "p", 2, d(2), False, source="s", evidence="e1", recorded_at=d(2), by=None)],
                "e1"),
               ([fact_write("thing:t", "p", float("nan"), d(3), False, source="s", evidence="e2", recorded_at=d(3),
                            by=None)], "e2")]
        with pytest.raises(ValueError):
            s.commit_batch("acme", bad, ("t", 0, 2))
        assert digest(s, "acme") == before
        assert s.applied_offset("acme", "t", 0) == 0 and not s.has_event("acme", "e1")

    def test_apply_writes_skips_an_event_id_already_applied(self) -> None:
        s = self.redis_store()
        w = fact_write("thing:t", "p", 1, d(1), False, source="s", evidence="e1", recorded_at=d(1), by=None)
        s.apply_writes("acme", [w], "e1")
        before = digest(s, "acme")
        s.apply_writes("acme", [w._replace(assertion=w.assertion._replace(value=2))], "e1")
        assert digest(s, "acme") == before

    def test_commit_many_equals_commit_batch_per_tenant(self) -> None:
        s, m = self.redis_store(), MemoryStore()
        batches = [(w, f"e{i}") for i, (w, _) in enumerate(random_batches(13, 90))]
        tenants = ["t0", "t1", "t2", "t3"]
        s.commit_batch("t1", batches[1::4][:3], ("p", 1, 4))                  # some already applied
        steps = [(t, batches[i::4], ("p", i, 89)) for i, t in enumerate(tenants)]
        steps.append(("t9", [], ("p", 9, 3)))                                   # offset only
        s.commit_many(steps)
        s.commit_many(steps)                                                    # a re-commit changes nothing
        for t, events, _ in steps:
            for writes, event_id in events:
                m.apply_writes(t, writes, event_id)
        for t in tenants:
            assert_same_graph(m, s, t)
        assert [s.applied_offset(t, "p", i) for i, t in enumerate(tenants)] == [89] * 4
        assert s.applied_offset("t9", "p", 9) == 3
        assert s.tenants() == tenants

    def test_a_step_of_thousands_of_events_and_entities_commits_whole(self) -> None:
        """A worker's step can carry tens of thousands of ids, marks and entities: more values than one Lua
        call can take (the scripts send them in chunks)."""
        s, m = self.redis_store(), MemoryStore()
        events = [(label_writes(f"thing:{i}", None, {"n": i}, valid_from=d(1), source="s", evidence=f"e{i}",
                                recorded_at=d(1), by=None)
                   + [relation_write(f"thing:{i}", "in", "box:1", d(1), False, source="s", evidence=f"e{i}",
                                     recorded_at=d(1), by=None)], f"e{i}") for i in range(9000)]
        s.commit_batch("acme", events, ("topic", 0, 8999))
        for writes, event_id in events:
            m.apply_writes("acme", writes, event_id)
        assert len(s.event_ids("acme")) == 9000 and s.applied_offset("acme", "topic", 0) == 8999
        assert digest(s, "acme") == digest(m, "acme")
        assert len(reading.relations(s, "acme", "box:1", at=d(2))) == 9000

    def test_an_empty_batch_only_moves_the_offset(self) -> None:
        s = self.redis_store()
        s.commit_batch("acme", [], ("t", 2, 41))
        assert s.applied_offset("acme", "t", 2) == 41
        assert s.event_ids("acme") == [] and list(s.dump("acme")) == []

    def test_two_writers_of_one_tenant_interleave_correctly(self) -> None:
        """Each client guesses the provenance list length; a wrong guess is detected and retried."""
        ns = f"t{uuid.uuid4().hex[:12]}"
        a, b, m = self.redis_store(ns), self.redis_store(ns), MemoryStore()
        for i, (writes, event_id) in enumerate(random_batches(11, 60)):
            (a if i % 3 else b).apply_writes("acme", writes, event_id)
            m.apply_writes("acme", writes, event_id)
        assert_same_graph(m, a, "acme")

    # ---- keys and names -------------------------------------------------------------------------

    def test_every_key_of_a_tenant_carries_its_hash_tag(self) -> None:
        s = self.redis_store()
        for writes, event_id in random_batches(5, 40):
            s.apply_writes("t.1-x", writes, event_id)
        s.commit_batch("t.1-x", [], ("topic", 0, 1))
        names = s.key_names("t.1-x")
        assert len(names) > 8
        tag = "{" + s.namespace + "/t.1-x}"
        assert all(n.startswith("keel:" + tag + ":g1:") for n in names)
        if self.cluster:
            slots = {self.client.keyslot(n) for n in names}
            assert len(slots) == 1
        else:
            scanned = set(self.client.scan_iter(match=f"keel:{{{s.namespace}*", count=1000))
            namespace_keys = {registry_key(s.namespace), layout_key(s.namespace), watermarked_key(s.namespace)}
            assert scanned == set(names) | namespace_keys       # the registry, written after the layout stamps

    def test_entity_ids_and_names_with_special_characters(self) -> None:
        s, m = self.redis_store(), MemoryStore()
        weird = "note@mail.example-1.x"
        for store in (s, m):
            store.upsert_entity("acme", "thing", weird, ref="db#{1}|*", valid_from=d(1), **{"la|bel": "v%7C"})
            store.open_fact("acme", f"thing:{weird}", "p|*?[]{x}", "v", valid_from=d(1), scope="task", owner="t|%7C")
            store.link("acme", f"thing:{weird}", "rel|*", "other:x@y", d(1))
            store.link("acme", "other:x@y", "self", "other:x@y", d(2))
        assert_same_graph(m, s, "acme")
        assert same_keys(s, s.keys("acme", "other:x@y"), m.keys("acme", "other:x@y"))

    def test_names_are_checked(self) -> None:
        s = self.redis_store()
        for bad in ("", "a b", "x{y}", "-x", "a" * 65, "a/b", "a:b"):
            with pytest.raises(UsageError):
                s.has_event(bad, "e1")
        with pytest.raises(UsageError):
            RedisStore(self.client, namespace="bad{ns}", owns_client=False)
        s.open_fact(GLOBAL_TENANT, "type:debt", "n", "x", valid_from=d(1), scope="global")
        assert reading.facts(s, GLOBAL_TENANT, "type:debt", at=d(2))[0]["value"] == "x"
        assert GLOBAL_TENANT in s.tenants()

    def test_times_outside_the_exact_range_are_refused(self) -> None:
        s = self.redis_store()
        with pytest.raises(UsageError):
            s.open_fact("acme", "thing:x", "p", 1, valid_from=2 ** 53 + 5)
        assert reading.facts(s, "acme", "thing:x", at=2 ** 62) == []

    # ---- tenants, search -----------------------------------------------------------------------

    def test_tenants_and_drop_tenant(self) -> None:
        s = self.redis_store()
        assert s.tenants() == []
        s.open_fact("b", "thing:x", "p", 1, valid_from=d(1))
        s.apply_writes("a", [], "e1")
        assert s.tenants() == ["a", "b"]
        assert s.drop_tenant("b") > 0
        assert s.tenants() == ["a"] and s.keys("b", "thing:x") == []
        assert not reading.exists(s, "b", "thing:x")

    def test_search_version_and_entities(self) -> None:
        s, m = self.redis_store(), MemoryStore()
        v0 = s.search_version("acme")
        for store in (s, m):
            store.upsert_entity("acme", "thing", "a", ref="r", name="Alpha", valid_from=d(1))
            store.upsert_entity("acme", "thing", "a", name="Alpha 2", valid_from=d(0))    # late, earlier point
            store.link("acme", "thing:a", "in", "group:g", d(1))
        v1 = s.search_version("acme")
        assert v1 != v0
        assert list(s.search_entities("acme")) == list(m.search_entities("acme"))
        entity, _, timelines = list(s.search_entities("acme"))[1]
        labels = dict(timelines)
        assert entity == "thing:a" and set(labels) == {("l", "thing:a", "name"), ("l", "thing:a", "ref")}
        assert [a.value for a in labels[("l", "thing:a", "name")]] == ["Alpha 2", "Alpha"]
        assert s.search_version("acme") == v1

    # ---- generations ---------------------------------------------------------------------------

    def test_generations_rebuild_switch_and_drop(self) -> None:
        ns = f"t{uuid.uuid4().hex[:12]}"
        s, reader = self.redis_store(ns), self.redis_store(ns)     # two clients: one caches generation 1
        s.open_fact("acme", "thing:x", "p", "old", valid_from=d(1), evidence="e1")
        s.apply_writes("acme", [], "e1")
        assert reading.facts(reader, "acme", "thing:x", at=d(2))[0]["value"] == "old"
        assert s.current_generation("acme") == 1
        old_digest = digest(s, "acme")

        gen = s.new_generation("acme")
        assert gen == 2 and s.new_generation("acme") == 3 and s.current_generation("acme") == 1
        rebuild = s.for_generation("acme", gen)
        rebuild.open_fact("acme", "thing:x", "p", "new", valid_from=d(1), evidence="e1")
        rebuild.commit_batch("acme", [([], "e1")], ("topic", 0, 7))
        # nothing visible until the switch
        assert reading.facts(reader, "acme", "thing:x", at=d(2))[0]["value"] == "old"
        assert digest(s, "acme") == old_digest
        assert reader.applied_offset("acme", "topic", 0) is None

        s.switch_generation("acme", gen)
        views = reading.views(reader, [ViewRequest("acme", "thing:x"), ViewRequest("acme", "thing:x", parts="f")], at=d(2))
        assert [v.facts[0]["value"] for v in views if v] == ["new", "new"]            # cached gen 1 is noticed
        assert reading.facts(reader, "acme", "thing:x", at=d(2))[0]["value"] == "new"
        assert reader.applied_offset("acme", "topic", 0) == 7
        assert reader.search_version("acme")[0] == gen
        assert s.current_generation("acme") == gen
        reader.open_fact("acme", "thing:x", "q", 1, valid_from=d(1))                # writes follow the switch
        assert [f["predicate"] for f in reading.facts(s, "acme", "thing:x", at=d(2))] == ["p", "q"]

        old_keys = s.key_names("acme", 1)
        with pytest.raises(UsageError):
            s.drop_generation("acme", gen)
        assert s.drop_generation("acme", 1) > 0
        assert self.client.exists(*old_keys) == 0
        assert reading.facts(s, "acme", "thing:x", at=d(2))[0]["value"] == "new"
        assert s.tenants() == ["acme"]
        assert s.new_generation("acme") == 4                                         # numbers are never reused

    # ---- bulk load (a replay's shadow generation) -----------------------------------------------

    def raw_generation(self, s: RedisStore, tenant: str, gen: int) -> dict[str, Any]:
        """{key name after `g<gen>:`: contents} of every key of a generation (found by SCAN, not its index)."""
        c = self.client
        head = f"keel:{{{s.namespace}/{tenant}}}:g{gen}:"
        out: dict[str, Any] = {}
        read = {"string": c.get, "list": lambda k: c.lrange(k, 0, -1), "set": lambda k: sorted(c.smembers(k)),
                "hash": c.hgetall, "zset": lambda k: c.zrange(k, 0, -1, withscores=True)}
        for name in c.scan_iter(match=head.replace("[", "\\[") + "*", count=1000):
            kind = c.type(name)
            out[name[len(head):]] = (kind, read[kind](name))
        assert set(out) <= {k[len(head):] for k in s.key_names(tenant, gen)}     # the index knows every key
        return out

    def bulk_steps(self) -> list[tuple[list[tuple[list[Write], str | None]], tuple[str, int, int] | None]]:
        """Steps of every kind: random writes (all shapes, escaped names, late recorded_at lowering an entity's
        first), repeated ids (in a step and across steps), no-id events, empty events, offset-only steps."""
        events = random_batches(11, 300)
        steps: list[Any] = []
        for i in range(0, 240, 29):
            steps.append((events[i:i + 29], ("topic", 0, i + 28)))
        steps.append(([], ("topic", 0, 300)))                                  # only moves the offset
        steps.append((events[10:20] + events[240:270] + events[250:255], ("topic", 0, 290)))  # repeats, behind
        steps.append(([([], "empty-1"), ([], None)], None))
        steps.append((events[270:], ("topic", 1, 5)))
        return steps

    def test_tenant_starts_notice_a_generation_switch(self) -> None:
        ns = f"t{uuid.uuid4().hex[:12]}"
        s, reader = self.redis_store(ns), self.redis_store(ns)     # the reader guesses generation 1
        s.commit_batch("acme", [([], "e1")], ("topic", 0, 3))
        s.commit_batch("beta", [([], "b1")], ("topic", 0, 4))
        assert [start[0] for start in reader.tenant_starts([("acme", []), ("beta", [])])] == [["e1"], ["b1"]]
        gen = s.new_generation("acme")
        s.for_generation("acme", gen).commit_batch("acme", [([], "e2")], ("topic", 0, 9))
        s.switch_generation("acme", gen)
        starts = reader.tenant_starts([("acme", [("topic", 0)]), ("beta", [("topic", 0)])])
        assert starts == [(["e2"], {("topic", 0): 9}, s.event_marks("acme"), s.latest_recorded("acme")),
                          (["b1"], {("topic", 0): 4}, s.event_marks("beta"), s.latest_recorded("beta"))]
        assert reader.current_generation("acme") == gen

    def test_a_bulk_load_leaves_exactly_what_apply_leaves(self) -> None:
        s = self.redis_store()
        steps = self.bulk_steps()
        applied, loaded = s.new_generation("acme"), s.new_generation("acme")
        view = s.for_generation("acme", applied)
        loader = s.load_generation("acme", loaded)
        for i, (events, position) in enumerate(steps):
            view.commit_batch("acme", events, position)
            loader.add(events, position)
            if i % 3 == 1:
                loader.flush(wait=i % 2 == 0)                   # flushing now or later, waiting or not: the same
        assert loader.pending > 0
        loader.flush()
        assert loader.pending == 0
        assert digest(s.for_generation("acme", loaded), "acme") == digest(view, "acme")
        # APPLY goes on from a loaded generation as from its own
        more = random_batches(12, 60)
        view.commit_batch("acme", more, ("topic", 0, 400))
        s.for_generation("acme", loaded).commit_batch("acme", more, ("topic", 0, 400))
        assert digest(s.for_generation("acme", loaded), "acme") == digest(view, "acme")
        s.switch_generation("acme", loaded)
        m = MemoryStore()
        for events, _ in [*steps, (more, None)]:
            for writes, event_id in events:
                m.apply_writes("acme", writes, event_id)
        assert_same_graph(m, s, "acme")

    def test_an_aborted_bulk_load_leaves_nothing_once_dropped(self) -> None:
        s = self.redis_store()
        gen = s.new_generation("acme")
        loader = s.load_generation("acme", gen)
        for events, position in self.bulk_steps():
            loader.add(events, position)
        loader.flush(wait=False)                 # the steps may still be running
        loader.abort()
        assert loader.pending == 0
        s.drop_generation("acme", gen)
        assert self.raw_generation(s, "acme", gen) == {}

    def test_a_bulk_load_refuses_the_current_or_a_written_generation(self) -> None:
        s = self.redis_store()
        with pytest.raises(UsageError):
            s.load_generation("acme", 1)
        gen = s.new_generation("acme")
        s.for_generation("acme", gen).commit_batch("acme", [], ("topic", 0, 1))
        with pytest.raises(UsageError):
            s.load_generation("acme", gen)
