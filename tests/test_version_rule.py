"""One version rule (keel.timeline), mirrored in Lua by the Redis store: on random timelines the Redis answers
equal the Python ones at every interesting time.

The first test checks one fact timeline (same-point corrections, ends, expiries) against Timeline.as_of. The
second, differential, test replays random timelines of a fact and a relation (corrections, ends, voids written
by corrections and retractions, expiries, data recorded late) into MemoryStore and RedisStore (twice: segments
closed at their usual size, and closed after every write so that restatements and past segment reads are
used), and compares now, past and known_at reads."""
from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.services import service_env

from keel import reading
from keel.store.base import fact_result
from keel.store.memory import MemoryStore
from keel.store.redis import RedisStore
from keel.store.writes import Write, new_write
from keel.timeline import Assertion, Timeline, new_assertion, void_of

pytestmark = pytest.mark.services

DAY = 86_400_000_000
T0 = 1_788_220_800_000_000          # 2026-09-01
TENANT, ENTITY = "acme", "thing:one"
KEY = ("f", ENTITY, "p", "")

assertions = st.lists(st.tuples(st.integers(0, 8),                    # point (days)
                                st.booleans(),                       # an end?
                                st.integers(0, 5),                   # value
                                st.sampled_from([None, "human:x"]),  # by
                                st.one_of(st.none(), st.integers(1, 4))),   # expires after (days)
                      min_size=1, max_size=12)


@pytest.fixture(scope="module")
def redis_store() -> Iterator[RedisStore]:
    store = RedisStore.from_url(service_env("KEEL_REDIS_URL"), namespace=f"v{uuid.uuid4().hex[:12]}")
    yield store
    store.drop_namespace()
    store.close()


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ops=assertions)
def test_lua_and_python_agree_on_the_version_at_every_time(redis_store: RedisStore,
                                                           ops: list[tuple[int, bool, int, str | None, int | None]]
                                                           ) -> None:
    redis_store.drop_tenant(TENANT)
    tl = Timeline()
    for i, (d, closed, value, by, expires) in enumerate(ops):
        point = T0 + d * DAY
        a = Assertion(point, None if closed else value, closed, f"src{i}", f"ev{i}", T0 + i, by,
                      None if closed or expires is None else point + expires * DAY)
        tl.add(a)
        redis_store.apply_writes(TENANT, [(KEY, a)])
    for d in range(-1, 14):
        for at in (T0 + d * DAY - 1, T0 + d * DAY, T0 + d * DAY + 1):
            version = tl.as_of(at)
            expected = [] if version is None else [fact_result(KEY, version)]
            assert reading.facts(redis_store, TENANT, ENTITY, at=at) == expected, (d, at)


# ---- the differential test: the Redis store against the Python rule, voids and relations included ----

FACT, REL = ("f", ENTITY, "p", ""), ("r", ENTITY, "rel", "thing:two")

# One op: (timeline, point (days), kind, value, by, expires after (days), recorded late (days)).
# kind: "v" a value, "e" an end, "x" a void of the event that wrote an earlier op (a correction's or a
# retraction's), as keel.projector writes them.
ops_strategy = st.lists(st.tuples(st.sampled_from(["f", "r"]),
                                  st.integers(0, 6),
                                  st.sampled_from(["v", "v", "v", "e", "x", "xr"]),
                                  st.integers(0, 3),
                                  st.sampled_from([None, "human:x"]),
                                  st.one_of(st.none(), st.integers(1, 3)),
                                  st.sampled_from([0, 0, 0, 2, 5])),
                        min_size=1, max_size=14)


@pytest.fixture(scope="module")
def layouts() -> Iterator[list[RedisStore]]:
    url = service_env("KEEL_REDIS_URL")
    stores = [RedisStore.from_url(url, namespace=f"v{uuid.uuid4().hex[:12]}"),
              RedisStore.from_url(url, namespace=f"v{uuid.uuid4().hex[:12]}")]
    stores[1].roll_bytes = 1     # every write closes the segment: restatements, anchors and past segment reads
    yield stores
    for store in stores:
        store.drop_namespace()
        store.close()


def timeline_writes(ops: list[tuple[str, int, str, int, str | None, int | None, int]]) -> list[Write]:
    """Writes in log order. recorded_at grows with the log except for late ops, recorded earlier than their
    place in the log would say (late data: known_at reads see them before writes logged ahead of them)."""
    writes: list[Write] = []
    for i, (kind_of_key, day, kind, value, by, expires, late) in enumerate(ops):
        key = FACT if kind_of_key == "f" else REL
        point, recorded = T0 + day * DAY, T0 + (10 + i - late) * DAY
        if kind.startswith("x"):
            earlier = [w for w in writes if w.key == key and not w.assertion.closed]
            voided = earlier[value % len(earlier)].assertion if earlier else None
            event = voided.evidence if voided else f"ev{i}"
            point = voided.point if voided else point
            a = new_assertion(point, void_of(event, retraction=kind == "xr"), True, f"src{i}", f"ev{i}", recorded, by)
        elif kind == "e":
            a = new_assertion(point, None, True, f"src{i}", f"ev{i}", recorded, by)
        else:
            a = new_assertion(point, value if key is FACT else True, False, f"src{i}", f"ev{i}", recorded, by,
                              point + expires * DAY if expires and key is FACT else None)
        writes.append(new_write(key, a))
    return writes


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ops=ops_strategy)
def test_redis_agrees_with_python_on_voids_relations_and_known_at(
        layouts: list[RedisStore], ops: list[tuple[str, int, str, int, str | None, int | None, int]]) -> None:
    writes = timeline_writes(ops)
    memory = MemoryStore()
    for i, w in enumerate(writes):
        memory.apply_writes(TENANT, [w], f"e{i}")
    for store in layouts:
        store.drop_tenant(TENANT)
        for i, w in enumerate(writes):
            store.apply_writes(TENANT, [w], f"e{i}")
    keys = [FACT, REL]
    for store in layouts:
        where = f"roll_bytes {store.roll_bytes}"
        for known_at in (None, *(T0 + k * DAY for k in range(9, 10 + len(ops) + 1))):
            assert store.versions_many(TENANT, keys, known_at) == memory.versions_many(TENANT, keys, known_at), \
                (where, known_at)
            for d in range(-1, 11):
                for at in (T0 + d * DAY - 1, T0 + d * DAY):
                    assert store.as_of_many(TENANT, keys, at, known_at) == \
                        memory.as_of_many(TENANT, keys, at, known_at), (where, d, at, known_at)
                    assert reading.facts(store, TENANT, ENTITY, at=at, known_at=known_at) == \
                        reading.facts(memory, TENANT, ENTITY, at=at, known_at=known_at), (where, at, known_at)
                    assert reading.relations(store, TENANT, ENTITY, at=at, known_at=known_at) == \
                        reading.relations(memory, TENANT, ENTITY, at=at, known_at=known_at), (where, at, known_at)
        assert reading.facts(store, TENANT, ENTITY) == reading.facts(memory, TENANT, ENTITY), where
        assert reading.relations(store, TENANT, ENTITY) == reading.relations(memory, TENANT, ENTITY), where


RELINKED_AT_ITS_END = [("r", 0, "v", 0, None, None, 0),    # link at day 0
                       ("r", 1, "e", 0, None, None, 0),    # unlink at day 1
                       ("r", 1, "v", 0, None, None, 0)]    # link at day 1: corrects the unlink, the run goes on


def test_a_relation_relinked_at_its_end_keeps_its_start_after_a_restatement(layouts: list[RedisStore]) -> None:
    """Found by the differential test: a segment's restatement of a relation cut at its end drops the run's start,
    so a later link at that point (correcting the end) must send reads to the whole fold (Fold._check)."""
    writes = timeline_writes(RELINKED_AT_ITS_END)
    memory, rolling = MemoryStore(), layouts[1]
    rolling.drop_tenant(TENANT)
    for i, w in enumerate(writes):
        memory.apply_writes(TENANT, [w], f"e{i}")
        rolling.apply_writes(TENANT, [w], f"e{i}")
    assert reading.relations(memory, TENANT, ENTITY)[0]["valid_from"] == "2026-09-01T00:00:00Z"
    for at in (None, T0 + DAY, T0 + 3 * DAY):
        assert reading.relations(rolling, TENANT, ENTITY, at=at) == reading.relations(memory, TENANT, ENTITY, at=at), at
