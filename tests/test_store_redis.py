"""The store contract and Redis-specific guarantees against a real redis-server (KEEL_REDIS_URL).

Every test works in a fresh namespace and deletes it afterwards, so a shared server is fine. Without
KEEL_REDIS_URL the tests skip (or fail under KEEL_REQUIRE_SERVICES=1). tests/test_redis_cluster.py runs
the same classes against a local 3-master Redis Cluster.
"""
from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from support.admin_contract import StoreAdminContract
from support.batch_contract import BatchWritesContract
from support.reads_contract import StoreReadsContract
from support.redis_checks import RedisCase, RedisChecks, assert_same_graph, d
from support.services import service_env

from keel import reading
from keel.errors import StoreUnavailable
from keel.store.base import (
    Store,
)
from keel.store.memory import MemoryStore
from keel.store.redis import BulkLoader, RedisStore
from keel.store.redis.text_cache import FoldCache

pytestmark = pytest.mark.services

@pytest.fixture(scope="class")
def single_node(request: pytest.FixtureRequest) -> Iterator[None]:
    url = service_env("KEEL_REDIS_URL")
    probe = RedisStore.from_url(url, namespace=f"probe{uuid.uuid4().hex[:12]}")    # private: stamped, then dropped
    request.cls.url = url
    request.cls.client = probe.client
    request.cls.cluster = False
    yield
    probe.drop_namespace()
    probe.close()


@pytest.mark.usefixtures("single_node")
class TestRedisStore(RedisChecks, StoreReadsContract, BatchWritesContract, StoreAdminContract):
    """The contract suites and the Redis checks on a single redis-server (segments closed at their usual size)."""

    def make_store(self) -> Store:
        return self.redis_store()

    def make_batch_store(self) -> Store:
        return self.redis_store()


class LoaderStore:
    """The batch contract through the bulk loader (BulkLoader): each tenant's commits go to a fresh generation by bulk
    load (flushed at once), reads to a view pinned to those generations."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.view = store
        self.loaders: dict[str, BulkLoader] = {}

    def _loader(self, tenant: str) -> BulkLoader:
        loader = self.loaders.get(tenant)
        if loader is None:
            gen = self.store.new_generation(tenant)
            loader = self.loaders[tenant] = self.store.load_generation(tenant, gen)
            self.view = self.view.for_generation(tenant, gen)
        return loader

    def commit_batch(self, tenant: str, events: Any, position: Any) -> None:
        loader = self._loader(tenant)
        loader.add(events, position)
        loader.flush()

    def commit_many(self, steps: Any) -> None:
        for tenant, events, position in steps:
            self.commit_batch(tenant, events, position)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.view, name)


@pytest.mark.usefixtures("single_node")
class TestSegmentLoaderBatches(RedisCase, BatchWritesContract):
    """The batch contract against the bulk loader (segment_loader.SegmentLoader, a replay's writer), through the
    BulkLoader interface `load_generation` gives. A replay's shadow keeps its offsets but no partition watermark,
    and checks no `held`: it is written from the log, not after it."""
    checks_held = False

    def make_batch_store(self) -> Store:
        return LoaderStore(self.redis_store())  # type: ignore[return-value]

    def test_from_url_detects_a_single_node(self) -> None:
        s = RedisStore.from_url(self.url, namespace=f"probe{uuid.uuid4().hex[:12]}")
        try:
            assert isinstance(s.client, redis.Redis)
        finally:
            s.drop_namespace()
            s.close()


def test_an_unreachable_server_is_store_unavailable() -> None:
    with pytest.raises(StoreUnavailable):
        RedisStore.from_url("redis://127.0.0.1:1/0", namespace="x", socket_connect_timeout=0.5)
    s = RedisStore.from_url("redis://127.0.0.1:1/0", namespace="x", cluster=False, socket_connect_timeout=0.5)
    with pytest.raises(StoreUnavailable) as caught:
        s.open_fact("acme", "thing:x", "p", 1, valid_from=d(1))
    assert "acme" in str(caught.value) and caught.value.tenant == "acme"
    with pytest.raises(StoreUnavailable):
        list(s.dump("acme"))
    s.close()


def test_point_encoding_round_trips_in_order() -> None:
    from keel.store.redis import decode_point, encode_point
    for point in (0, 1, -1, d(0), 2 ** 53 - 1, -(2 ** 53) + 1):
        assert decode_point(encode_point(point)) == point
    points = sorted(random.Random(3).randrange(-(2 ** 53) + 1, 2 ** 53) for _ in range(500))
    assert sorted(points, key=encode_point) == points




class _SpiedRedisStore(RedisStore):
    """Counts the view reads that decode every segment of an entity (segment_views.ViewReader._whole)."""
    roll_bytes = 700

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.whole_reads = 0
        whole = self._views._whole

        def counted(tenant: str, entities: list[str]) -> Any:
            self.whole_reads += 1
            return whole(tenant, entities)
        self._views._whole = counted  # type: ignore[method-assign]


@pytest.mark.usefixtures("single_node")
class TestSegmentReads(RedisCase):
    """Bounded reads: now from the open segment, at a past time from the closed segments its
    valid-time index names, and around that time where those do not answer exactly (segment_past.py); whole
    folds only where nothing bounds a read. Always as the memory store."""
    store_class = _SpiedRedisStore

    def history(self, s: Any, m: MemoryStore, days: int, late: bool = False) -> None:
        for store in (s, m):
            store.upsert_entity("acme", "debt", "d1", valid_from=d(0), creditor="Bank")
            store.link("acme", "debt:d1", "owed_by", "household:h", d(0))
            for i in range(days):
                store.open_fact("acme", "debt:d1", "balance", 1000 - i, valid_from=d(i), evidence=f"s{i}")
                store.link("acme", "debt:d1", "owed_by", "household:h", d(i), evidence=f"s{i}")
            if late:
                store.open_fact("acme", "debt:d1", "balance", -1, valid_from=d(3.5), evidence="late")

    def views(self, s: Any, m: MemoryStore, days: int) -> None:
        for e in ("debt:d1", "household:h"):
            for t in (-1, 0, 1, 3.5, 4, days / 2, days - 1, days + 3):
                assert reading.view(s, "acme", e, at=d(t)) == reading.view(m, "acme", e, at=d(t)), (e, t)
            assert reading.view(s, "acme", e) == reading.view(m, "acme", e)

    def test_past_reads_of_an_entity_written_in_order_read_only_the_segments_the_index_names(self) -> None:
        s, m = self.redis_store(), MemoryStore()
        self.history(s, m, 120)
        assert int(s.client.hget(s.data_prefix("acme", 1) + "sg", "debt:d1")) > 5     # many closed segments
        self.views(s, m, 120)
        assert s.whole_reads == 0

    def test_a_late_write_makes_past_reads_read_around_their_time_not_every_segment(self) -> None:
        s, m = self.redis_store(), MemoryStore()
        self.history(s, m, 120, late=True)
        s.commit_batch("acme", [], ("topic", 0, 1))
        for store in (s, m):                                     # closes the segment holding the late write
            for i in range(120, 160):
                store.open_fact("acme", "debt:d1", "balance", 1000 - i, valid_from=d(i), evidence=f"s{i}")
        self.views(s, m, 160)
        assert s.whole_reads == 0

    def test_a_view_now_folds_again_only_the_segments_that_changed(self) -> None:
        s, m = self.redis_store(), MemoryStore()
        for store in (s, m):
            store.upsert_entity("acme", "debt", "d1", valid_from=d(0))
            for k in range(30):
                store.link("acme", f"due:u{k}", "for_debt", "debt:d1", d(k), evidence=f"e{k}")
                store.open_fact("acme", f"due:u{k}", "amount", k, valid_from=d(k), evidence=f"e{k}")
        assert reading.view(s, "acme", "debt:d1") == reading.view(m, "acme", "debt:d1")
        cache = s._views._folds
        before = set(cache._entries)
        assert len(before) == 31                                # the debt's segment and its 30 subjects'
        for store in (s, m):
            store.unlink("acme", "due:u3", "for_debt", "debt:d1", d(40), evidence="x")
            store.open_fact("acme", "due:u4", "amount", 5, valid_from=d(41), evidence="y")     # the same relation
            store.open_fact("acme", "debt:d1", "balance", {"cop": 7}, valid_from=d(42), evidence="z")
            store.link("acme", "due:new", "for_debt", "debt:d1", d(43), evidence="w")  # a subject the MGET misses
        assert ("acme", "debt:d1") in s._views._subjects                    # read by MGET (ViewReader._with_mget)
        for t in (None, d(2.5), d(40), d(50)):
            assert reading.view(s, "acme", "debt:d1", at=t) == reading.view(m, "acme", "debt:d1", at=t), t
        assert "due:new" in s._views._subjects[("acme", "debt:d1")]
        assert len(set(cache._entries) - before) == 4           # the three changed segments and the new one
        s._views._folds = cache = FoldCache(budget=16 * 250)    # room for a few: the oldest go, answers stay
        for t in (None, d(40), None):
            assert reading.view(s, "acme", "debt:d1", at=t) == reading.view(m, "acme", "debt:d1", at=t), t
        assert 0 < cache._held <= cache.budget and 0 < len(cache._entries) < 30
        assert cache._held == sum(len(text) for text, _ in cache._entries)

    def test_the_subjects_remembered_are_counted_once_per_entity(self) -> None:
        """The subjects kept for views by MGET are bounded by their count in all (segment_views.SUBJECTS_KEPT):
        an entity viewed again replaces its list, it does not add to the count."""
        s, m = self.redis_store(), MemoryStore()
        for store in (s, m):
            for debt in ("d1", "d2"):
                store.upsert_entity("acme", "debt", debt, valid_from=d(0))
                for k in range(3):
                    store.link("acme", f"due:{debt}{k}", "for_debt", f"debt:{debt}", d(k))
        for round_ in range(5):
            for store in (s, m):                # a subject the MGET misses: the view goes through VIEW again
                store.link("acme", f"due:n{round_}", "for_debt", "debt:d1", d(10 + round_))
            for debt in ("debt:d1", "debt:d2"):
                assert reading.view(s, "acme", debt) == reading.view(m, "acme", debt)
        views = s._views
        assert views._subjects_held == sum(len(x) for x in views._subjects.values()) == 3 + 5 + 3

    def test_a_view_by_mget_follows_a_generation_another_store_switched(self) -> None:
        s, m = self.redis_store(), MemoryStore()
        for store in (s, m):
            store.upsert_entity("acme", "debt", "d1", valid_from=d(0))
            store.link("acme", "due:u1", "for_debt", "debt:d1", d(0))
        assert reading.view(s, "acme", "debt:d1") == reading.view(m, "acme", "debt:d1")
        assert ("acme", "debt:d1") in s._views._subjects      # the next view reads by MGET (_with_mget)
        other = self.redis_store(namespace=s.namespace)
        other.switch_generation("acme", other.new_generation("acme"))     # an empty one: s still guesses 1
        assert s.client.exists(s.data_prefix("acme", 1) + "s:debt:d1")
        assert reading.view(s, "acme", "debt:d1") is None

    def test_the_spy_counts_whole_reads(self) -> None:
        s, m = self.redis_store(), MemoryStore()
        self.history(s, m, 40)
        s.client.delete(*s.client.keys(s.data_prefix("acme", 1) + "k:*"))    # no recorded-time index: whole
        assert reading.view(s, "acme", "debt:d1", known_at=d(1)) == reading.view(m, "acme", "debt:d1", known_at=d(1))
        assert s.whole_reads > 0


@pytest.mark.usefixtures("single_node")
class TestSegmentLoader(RedisChecks):
    """The bulk loader: steps flushed without waiting run in the loader's thread; a failed flush queues
    its steps again, and the next flush writes each step once."""
    
    @pytest.mark.parametrize("fail_after", [0, 3])
    def test_a_failed_flush_flushed_again_writes_each_step_once(self, fail_after: int) -> None:
        s = self.redis_store()
        steps = self.bulk_steps()
        gen = s.new_generation("acme")
        loader = s.load_generation("acme", gen)
        real = loader.view.commit_many
        calls: list[int] = []

        def failing(batch: Any) -> None:
            calls.append(len(batch))
            real(batch[:fail_after])           # part of the steps written, then the connection "fails"
            raise StoreUnavailable("lost the connection")
        for events, position in steps[:6]:
            loader.add(events, position)
        loader.view.commit_many = failing       # type: ignore[method-assign]
        loader.flush(wait=False)                # handed to the thread: its error comes with the next flush
        with pytest.raises(StoreUnavailable):
            loader.flush()
        assert calls == [6] and loader.pending == 6 - fail_after      # the write counter tells which ran
        loader.view.commit_many = real          # type: ignore[method-assign]
        for events, position in steps[6:]:
            loader.add(events, position)
        loader.flush(wait=False)
        loader.flush()
        assert loader.pending == 0
        loader.close()
        m = MemoryStore()
        for events, _ in steps:
            for writes, event_id in events:
                m.apply_writes("acme", writes, event_id)
        s.switch_generation("acme", gen)
        assert_same_graph(m, s, "acme")
        assert s.applied_offset("acme", "topic", 0) == 300 and s.applied_offset("acme", "topic", 1) == 5


class _RollingRedisStore(RedisStore):
    roll_bytes = 1          # every step that writes an entity closes its segment: restatements everywhere


@pytest.mark.usefixtures("single_node")
class TestRedisStoreRollingEveryStep(TestRedisStore):
    """A segment closed after every step: every read now goes through restatements (anchors,
    cut relations, the fall-back to whole folds) and must still answer as the memory store does."""
    store_class = _RollingRedisStore
