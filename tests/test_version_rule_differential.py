"""The version rule, Python against Redis Lua (issue 23, "each rule once per language").

Hypothesis generates small logs of events about two entities: facts asserted at points (values, corrections at
the same point recorded later, notes that expire), closes (`close_fact`), links and unlinks, data recorded late
(a recorded_at earlier than events logged before it), and corrections and retractions of earlier events, whose
voids and restorations are the writes keel.projector makes (`Projector._supersede`, run on the memory store's
state as a worker runs it). The same writes go, as EventWrites in `commit_batch` steps, into MemoryStore (the
Python rule, keel.timeline) and RedisStore (Lua `PAST` and `INDEX` and the segment fold; once as it runs and
once with a tiny `roll_bytes`, so segments close and restatements are read). Every read of the
Store contract that applies the rule must answer the same: views (one and several entities), facts, relations,
history, versions_many, as_of_many, exists; now, at past valid times and `known_at` every recorded time."""
from __future__ import annotations

import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.services import service_env

from keel import reading
from keel.envelope import RETRACTED, Event
from keel.errors import EnvelopeRejected
from keel.projector import Projector
from keel.store.base import Key, Store, ViewRequest
from keel.store.memory import MemoryStore
from keel.store.redis import RedisStore
from keel.store.writes import Write, fact_write, relation_write

pytestmark = pytest.mark.services

DAY = 86_400_000_000
T0 = 1_788_220_800_000_000          # 2026-09-01
TENANT = "acme"
ENTITIES = ("thing:one", "thing:two")
PREDICATES = ("p", "q")

# One event: (kind, entity index, predicate index, point (days), value, expires after (days), recorded late
# (days), target (index among earlier events, for corrections and retractions)).
# kind: "v" assert a value, "n" a note that expires, "c" close_fact, "l" link, "u" unlink, "k" correct an
# earlier event (its writes superseded and its own value asserted), "x" retract an earlier event.
event_strategy = st.tuples(st.sampled_from(["v", "v", "v", "n", "c", "l", "l", "u", "k", "x"]),
                           st.integers(0, 1), st.integers(0, 1), st.integers(0, 5), st.integers(0, 3),
                           st.integers(1, 3), st.sampled_from([0, 0, 0, 2, 6]), st.integers(0, 20))
log_strategy = st.tuples(st.lists(event_strategy, min_size=1, max_size=12),
                         st.lists(st.integers(1, 4), min_size=1, max_size=12))   # commit_batch step sizes


@pytest.fixture(scope="module")
def client() -> Iterator[redis.Redis]:
    probe = RedisStore.from_url(service_env("KEEL_REDIS_URL"), namespace=f"vrprobe{uuid.uuid4().hex[:8]}")
    yield probe.client
    probe.drop_namespace()
    probe.close()


def event_writes(i: int, op: tuple[Any, ...], memory: MemoryStore, applied: list[str]) -> list[Write] | None:
    """The writes of event i as a worker would make them against `memory` (None: the projector refuses it)."""
    kind, e, p, day, value, expires, late, target = op
    subject, other = ENTITIES[e], ENTITIES[1 - e]
    point, recorded = T0 + day * DAY, T0 + (10 + i - late) * DAY
    eid, src = f"ev{i}", f"src{i}"
    common: dict[str, Any] = {"source": src, "evidence": eid, "recorded_at": recorded, "by": None}
    writes: list[Write] = []
    if kind in "kx":
        if not applied:
            return None
        corrected = applied[target % len(applied)]
        event = Event(id=eid, tenant=TENANT, type=RETRACTED if kind == "x" else "thing.said", subject=subject,
                      occurred_at=point, recorded_at=recorded, source=src, by=None,
                      payload={"event": corrected} if kind == "x" else {},
                      corrects=None if kind == "x" else corrected)
        try:    # the projector's own code on the memory store's state, so every store gets its very writes
            writes = Projector._supersede(SimpleNamespace(store=memory), event)  # type: ignore[arg-type]
        except EnvelopeRejected:
            return None
        if kind == "x":
            return writes
    if kind in "vk":
        writes.append(fact_write(subject, PREDICATES[p], value, point, False, **common))
    elif kind == "n":
        writes.append(fact_write(subject, PREDICATES[p], value, point, False, scope="task:t", owner="agent:a",
                                 expires_at=point + expires * DAY, **common))
    elif kind == "c":
        writes.append(fact_write(subject, PREDICATES[p], None, point, True, **common))
    else:
        writes.append(relation_write(subject, "rel", other, point, kind == "u", **common))
    return writes


def build(ops: list[tuple[Any, ...]]) -> tuple[MemoryStore, list[tuple[list[Write], str]]]:
    """The memory store fed event by event, and the events' writes in log order."""
    memory, applied, events = MemoryStore(), [], []
    for i, op in enumerate(ops):
        writes = event_writes(i, op, memory, applied)
        if writes is None:
            continue
        memory.commit_batch(TENANT, [(writes, f"ev{i}")], None)
        applied.append(f"ev{i}")
        events.append((writes, f"ev{i}"))
    return memory, events


def feed(store: Store, events: list[tuple[list[Write], str]], sizes: list[int]) -> None:
    """The same events in commit_batch steps of the generated sizes."""
    at, n = 0, 0
    while at < len(events):
        size = sizes[n % len(sizes)]
        store.commit_batch(TENANT, events[at:at + size], None)
        at, n = at + size, n + 1


def all_keys(store: Store) -> list[Key]:
    return sorted({k for e in ENTITIES for k in store.keys(TENANT, e)})


def compare(memory: MemoryStore, store: RedisStore, events: list[tuple[list[Write], str]]) -> None:
    """Times are whole days (points, expiries, recorded_at), so known_at at each recorded day and `at` at each
    day (a version starts at its point: reading at a point and just before it are different days) reach every
    state the rule can give."""
    where = f"roll_bytes {getattr(store, 'roll_bytes', '-')}"
    keys = all_keys(memory)
    assert all_keys(store) == keys, where
    requests = [ViewRequest(TENANT, e, None, "lfr") for e in ENTITIES]
    recorded = sorted({w.assertion.recorded_at for writes, _ in events for w in writes})
    for known_at in (None, recorded[0] - 1, *recorded):
        assert store.versions_many(TENANT, keys, known_at) == memory.versions_many(TENANT, keys, known_at), \
            (where, known_at)
        assert store.recorded_versions_many(TENANT, keys, known_at) == \
            memory.recorded_versions_many(TENANT, keys, known_at), (where, known_at)
        for e in ENTITIES:
            assert reading.exists(store, TENANT, e, known_at=known_at) == reading.exists(memory, TENANT, e, known_at=known_at), \
                (where, e, known_at)
            assert reading.history(store, TENANT, e, known_at=known_at) == reading.history(memory, TENANT, e, known_at=known_at), \
                (where, e, known_at)
            assert reading.facts(store, TENANT, e, known_at=known_at) == reading.facts(memory, TENANT, e, known_at=known_at), \
                (where, e, known_at)
            assert reading.relations(store, TENANT, e, known_at=known_at) == \
                reading.relations(memory, TENANT, e, known_at=known_at), (where, e, known_at)
        for at in (None, *(T0 + d * DAY for d in range(-1, 10))):
            if at is not None:
                assert store.as_of_many(TENANT, keys, at, known_at) == \
                    memory.as_of_many(TENANT, keys, at, known_at), (where, at, known_at)
            assert reading.views(store, requests, at=at, known_at=known_at) == \
                reading.views(memory, requests, at=at, known_at=known_at), (where, at, known_at)


def check(client: redis.Redis, ops: list[tuple[Any, ...]], sizes: list[int]) -> None:
    memory, events = build(ops)
    if not events:
        return
    stores = [RedisStore(client, namespace=f"vr{uuid.uuid4().hex[:12]}", owns_client=False),
              RedisStore(client, namespace=f"vr{uuid.uuid4().hex[:12]}", owns_client=False)]
    stores[1].roll_bytes = 1       # every step closes the segment: restatements, anchors, PAST reads
    try:
        for store in stores:
            feed(store, events, sizes)
        for store in stores:
            compare(memory, store, events)
    finally:
        for store in stores:
            store.drop_namespace()


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(log=log_strategy)
def test_python_and_redis_agree_on_every_read(client: redis.Redis,
                                              log: tuple[list[tuple[Any, ...]], list[int]]) -> None:
    check(client, *log)


# The projector never lets a tenant's recorded_at go back (docs/envelope.md): logs in that order take the
# bounded known_at reads (a closed segment standing for what was known then) instead of whole folds.
in_order_strategy = st.tuples(st.lists(event_strategy.map(lambda op: (*op[:6], 0, op[7])), min_size=1, max_size=12),
                              st.lists(st.integers(1, 4), min_size=1, max_size=12))


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(log=in_order_strategy)
def test_every_read_agrees_when_recorded_at_never_goes_back(client: redis.Redis,
                                                            log: tuple[list[tuple[Any, ...]], list[int]]) -> None:
    check(client, *log)
