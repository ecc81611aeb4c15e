"""Layout 2's past views on long histories: exact, and never from the entity's whole history.

Debts with a few hundred daily snapshots written through the finance cartridge's projector, in six shapes (in
order; every 10th snapshot 40 days late; linked to and unlinked from the household by turns; every 7th snapshot
corrected and every 13th retracted; 150 snapshots in a row retracted; linked again every day and unlinked on
two days), in small segments. Views at many past days, believed now and at recorded
times through the history, equal the memory store's, and none decodes an entity's whole history
(segment_views.ViewReader._whole): the recorded-time index, PAST and reading around t (segment_past.py) serve
them all.
"""
from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support.services import service_env

from keel import reading
from keel.cartridge import load_cartridge
from keel.projector import Projector
from keel.store.memory import MemoryStore
from keel.store.redis import RedisStore, segment_past, text_cache
from keel.store.redis.codec import encode_point
from keel.store.redis.segment_views import ViewReader
from keel.store.redis.segments import decode
from keel.store.writes import event_key, relation_write
from keel.times import parse_time

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[1]
START = datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)
N = 400


def stamp(i: int) -> str:
    return (START + datetime.timedelta(hours=i)).strftime("%Y-%m-%dT%H:%M:%SZ")


def day(i: int) -> str:
    return (datetime.date(2000, 1, 1) + datetime.timedelta(days=i)).isoformat()


def envelopes(tenant: str, shape: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    debt = f"debt:{shape}"
    i = 0
    while len(out) < N:
        point = i - 40 if shape == "late" and i % 10 == 9 else i
        env = {"id": f"{shape}-{i}", "tenant": tenant, "type": "debt.snapshot", "subject": debt,
               "occurred_at": day(point), "recorded_at": stamp(len(out)),
               "payload": {"creditor": "Banco Andino", "product": "Visa", "balance_cop": 1000 + i, "rate_ea_pct": 20.5,
                           "installment_cop": 100, "month": day(point)[:7]}}
        out.append(env)
        if shape == "voids" and i % 7 == 6:
            out.append({**env, "id": f"{shape}-{i}-fix", "corrects": env["id"], "recorded_at": stamp(len(out)),
                        "payload": {**env["payload"], "balance_cop": 5 + i}})
        elif (shape == "retracted" and 100 <= i < 250) or (shape == "voids" and i % 13 == 12):
            # "retracted": a long stretch withdrawn, the version before runs on
            out.append({"id": f"{shape}-{i}-x", "tenant": tenant, "type": "keel.retracted", "subject": debt,
                        "occurred_at": day(point), "recorded_at": stamp(len(out)), "by": "test",
                        "payload": {"event": env["id"], "reason": "test"}})
        i += 1
    return out


class Recorder(MemoryStore):
    """A MemoryStore that keeps every (writes, event id) it applied, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[Any, Any]] = []

    def apply_writes(self, tenant: str, writes: list[Any], event_id: str | None = None) -> None:
        super().apply_writes(tenant, writes, event_id)
        self.log.append((list(writes), event_id))


@pytest.fixture(scope="module")
def stores() -> Iterator[tuple[Recorder, RedisStore, dict[str, str]]]:
    cartridge = load_cartridge(ROOT / "cartridges" / "finance")
    memory = Recorder()
    projector = Projector(cartridge, memory)
    tenant = "acme"
    entities = {}
    for shape in ("plain", "late", "voids", "retracted"):
        for env in envelopes(tenant, shape):
            projector.apply_raw(env)
        entities[shape] = f"debt:{shape}"
    projector.apply_raw(envelopes(tenant, "ends")[0])
    for i in range(1, N):
        write = relation_write("debt:ends", "owed_by", f"household:{tenant}", day(i), i % 2 == 0, source="test",
                               evidence=f"link-{i}", recorded_at=stamp(N + i), by=None)
        memory.apply_writes(tenant, [write], event_key(f"link-{i}", None, parse_time(stamp(N + i))))
    entities["ends"] = "debt:ends"
    projector.apply_raw(envelopes(tenant, "runs")[0])
    for i in range(1, N):            # linked again every day, unlinked on two days: long runs with ends
        write = relation_write("debt:runs", "owed_by", f"household:{tenant}", day(i), i in (150, 300),
                               source="test", evidence=f"run-{i}", recorded_at=stamp(2 * N + i), by=None)
        memory.apply_writes(tenant, [write], event_key(f"run-{i}", None, parse_time(stamp(2 * N + i))))
    entities["runs"] = "debt:runs"
    client = redis.Redis.from_url(service_env("KEEL_REDIS_URL"), decode_responses=True)
    store = RedisStore(client, namespace=f"sp{uuid.uuid4().hex[:12]}", owns_client=False)
    store.roll_bytes = 1500          # many small segments
    for i in range(0, len(memory.log), 5):
        store.commit_batch(tenant, memory.log[i:i + 5], None)
    yield memory, store, entities
    store.drop_namespace()


@pytest.mark.parametrize("shape", ["plain", "late", "ends", "voids", "retracted", "runs"])
def test_past_views_are_exact_without_whole_histories(stores: tuple[Recorder, RedisStore, dict[str, str]],
                                                      shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    memory, store, entities = stores
    entity = entities[shape]
    whole: list[Any] = []
    real = ViewReader._whole
    monkeypatch.setattr(ViewReader, "_whole", lambda self, *a: whole.append(a) or real(self, *a))
    closed = store.client.hget(store.data_prefix("acme", store.current_generation("acme")) + "sg", entity)
    assert int(closed or 0) >= 10, "the history should span many closed segments"
    reads = 0
    for known_at in (None, parse_time(stamp(N // 3)), parse_time(stamp(N + N // 2)), parse_time(stamp(2 * N + 200))):
        for d in range(-45, N + 5, 17):
            at = parse_time(day(d))
            got = reading.view(store, "acme", entity, at=at, known_at=known_at)
            assert got == reading.view(memory, "acme", entity, at=at, known_at=known_at), (shape, d, known_at)
            reads += 1
    assert reads > 50
    assert whole == []


@pytest.mark.parametrize("shape", ["late", "voids"])
def test_overlapping_ranges_are_read_in_a_window_the_widest_range_bounds(
        stores: tuple[Recorder, RedisStore, dict[str, str]], shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Late data and corrections after a roll make a timeline's ranges overlap: INDEX then answers a window of
    its entries and the widest range ("o"), never every entry ("a"), and the views stay exact."""
    memory, store, entities = stores
    kinds: list[str] = []
    real = segment_past.spans_of
    monkeypatch.setattr(segment_past, "spans_of",
                        lambda answer, *a: kinds.append(answer if answer == "*" else answer[0]) or real(answer, *a))
    for known_at in (None, parse_time(stamp(N // 2))):
        for d in range(-45, N + 5, 23):
            at = parse_time(day(d))
            assert reading.view(store, "acme", entities[shape], at=at, known_at=known_at) == \
                reading.view(memory, "acme", entities[shape], at=at, known_at=known_at), (d, known_at)
    assert "o" in kinds
    assert "a" not in kinds and "*" not in kinds


late_strategy = st.lists(st.tuples(st.integers(0, 60), st.booleans()), min_size=20, max_size=120)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(history=late_strategy, roll=st.sampled_from([300, 900, 3000]), reads=st.lists(
    st.tuples(st.integers(-70, 130), st.integers(0, 120)), min_size=4, max_size=10))
@example(history=[(0, False), (0, True), (0, True), (0, False), (0, True), (0, False), (0, False), (0, True),
                  (0, False), (0, False), (0, True), (0, False), (0, True), (0, False), (0, True), (0, True),
                  (0, False), (0, False), (0, True), (0, True), (0, False), (0, True), (0, True), (0, False),
                  (0, True), (0, True), (0, True), (0, True), (0, True), (59, False), (12, False), (0, True),
                  (44, False), (0, True), (0, True), (42, False), (57, False), (27, False), (0, True), (0, True),
                  (58, False), (52, False), (51, False), (37, True), (0, True), (0, True), (20, True)],
         roll=900, reads=[(34, 0)] * 4)    # a restatement keeping an earlier cut whose point is void by then
@example(history=[(0, True), *[(3 * (i % 4 == 3), False) for i in range(40)]], roll=300,
         reads=[(-5, 0), (0, 1), (1, 2), (20, 3), (20, 60), (39, 0)])   # the relation's first link retracted
def test_views_over_late_data_and_retractions_equal_the_memory_store(
        history: list[tuple[int, bool]], roll: int, reads: list[tuple[int, int]]) -> None:
    """Snapshots each some days late (or not), some retracted at once, in small segments: past views, believed now
    and at a recorded time, equal the memory store's (whatever way the store bounds them)."""
    cartridge = load_cartridge(ROOT / "cartridges" / "finance")
    memory = Recorder()
    projector = Projector(cartridge, memory)
    count = 0
    for i, (late, retract) in enumerate(history):
        env = {"id": f"p-{i}", "tenant": "acme", "type": "debt.snapshot", "subject": "debt:p",
               "occurred_at": day(i - late), "recorded_at": stamp(count),
               "payload": {"creditor": "Banco Andino", "product": "Visa", "balance_cop": 1000 + i,
                           "rate_ea_pct": 20.5, "installment_cop": 100, "month": day(i - late)[:7]}}
        projector.apply_raw(env)
        count += 1
        if retract:
            projector.apply_raw({"id": f"p-{i}-x", "tenant": "acme", "type": "keel.retracted", "subject": "debt:p",
                                 "occurred_at": day(i - late), "recorded_at": stamp(count), "by": "test",
                                 "payload": {"event": env["id"], "reason": "test"}})
            count += 1
    assert_views_equal(memory, "debt:p", roll, 3, [(d, known_at) for d, r in [*reads, (len(history) // 2, count)]
                                                   for known_at in (None, parse_time(stamp(min(r, count))))])


def assert_views_equal(memory: Recorder, entity: str, roll: int, step: int,
                       reads: list[tuple[int, int | None]]) -> None:
    """Commit a memory store's writes to a fresh Redis namespace in steps, segments closed past `roll` bytes,
    and check the entity's views at (valid day, known_at) equal the memory store's."""
    client = redis.Redis.from_url(service_env("KEEL_REDIS_URL"), decode_responses=True)
    store = RedisStore(client, namespace=f"sq{uuid.uuid4().hex[:12]}", owns_client=False)
    store.roll_bytes = roll
    try:
        for i in range(0, len(memory.log), step):
            store.commit_batch("acme", memory.log[i:i + step], None)
        for d, known_at in reads:
            at = parse_time(day(d))
            assert reading.view(store, "acme", entity, at=at, known_at=known_at) == \
                reading.view(memory, "acme", entity, at=at, known_at=known_at), (d, known_at)
    finally:
        store.drop_namespace()
        client.close()


points = st.integers(0, 400)


@settings(max_examples=300, deadline=None)
@given(ranges=st.lists(st.tuples(points, st.integers(0, 60)), min_size=1, max_size=40), t=points,
       window=st.integers(1, 6), before=st.one_of(st.none(), st.integers(0, 40)), relation=st.booleans(),
       widenings=st.lists(st.tuples(st.one_of(st.none(), points), st.one_of(st.none(), points)), max_size=4))
def test_a_window_of_overlapping_ranges_is_sound_only_when_it_holds_every_entry_meeting_its_range(
        ranges: list[tuple[int, int]], t: int, window: int, before: int | None, relation: bool,
        widenings: list[tuple[int | None, int | None]]) -> None:
    """INDEX's window of a timeline whose ranges overlap ("o": entries around t, the lowest ones and an upper
    bound of the widest range, as ROLL keeps it), with or without a segment standing in for the open one
    (`before`): whenever the Span calls itself sound, every segment counted (numbered below `before`) whose range
    meets [B, U] is held, however it widened; and a relation's kept first entries hold every segment starting at
    or below the point `_covered_from_first` vouches for. Pure Python: INDEX's answer built as the Lua does."""
    prefix = "r|owed_by|household:acme|" if relation else "f|balance_cop||"
    entries = [(lo, lo + w, n) for n, (lo, w) in enumerate(ranges)]
    members = sorted(f"{prefix}{encode_point(lo)}{encode_point(hi)}{n}" for lo, hi, n in entries)
    t9 = encode_point(t)
    below = [m for m in members if m[len(prefix):len(prefix) + 9] <= t9][::-1][:window]
    above = [m for m in members if m[len(prefix):len(prefix) + 9] > t9][:window]
    widest = max(hi - lo for lo, hi, _ in entries) + 1
    span = segment_past.spans_of(["o", below, above, members[:window], "", str(widest)], prefix, t9, before, window)
    assert span is not None
    counted = [(lo, hi, n) for lo, hi, n in entries if before is None or n < before]
    for step in [None, *widenings]:
        if step is not None:
            reach = tuple(None if x is None else encode_point(x) for x in step)
            if not span.widen(reach):   # type: ignore[arg-type]
                break
        held = span.held()
        assert all(before is None or n < before for n in held)
        if span.sound():
            b, u = span.floor, span.ceiling
            meeting = {n for lo, hi, n in counted
                       if (b is None or encode_point(hi) >= b) and (u is None or encode_point(lo) <= u)}
            assert meeting <= held, (b, u)
        if span.first is not None:
            for x in range(0, 401, 7):
                if span._covered_from_first(encode_point(x)):
                    assert {n for lo, _, n in counted if lo <= x} <= held, x


@pytest.mark.parametrize("late", [(120,), (120, 0), (-3,)])
def test_an_end_in_the_open_segment_of_a_relation_whose_closed_rows_only_link(late: tuple[int, ...]) -> None:
    """A relation linked every day over many closed segments (no end among their rows: its first entry is kept),
    then unlinked late on the given days (the last in `late` at its first link, or before it): the unlink is in
    the open segment, and past views at days around it, believed now and before it arrived, equal the memory
    store's (the open segment's rows are folded whole when one is an end: `segment_past.Span.settles`)."""
    memory = Recorder()
    for i in range(200):
        memory.apply_writes("acme", [relation_write("debt:r", "owed_by", "household:acme", day(i), False,
                                                    source="test", evidence=f"l-{i}", recorded_at=stamp(i), by=None)],
                            event_key(f"l-{i}", None, parse_time(stamp(i))))
    for j, d in enumerate(late):
        memory.apply_writes("acme", [relation_write("debt:r", "owed_by", "household:acme", day(d), True,
                                                    source="test", evidence=f"u-{j}", recorded_at=stamp(200 + j),
                                                    by=None)], event_key(f"u-{j}", None, parse_time(stamp(200 + j))))
    assert_views_equal(memory, "debt:r", 800, 4, [(d, known_at) for known_at in (
        None, parse_time(stamp(199)), parse_time(stamp(100))) for d in range(-6, 206, 9)])


def test_closed_blocks_are_decoded_once_by_text_and_the_oldest_go_first() -> None:
    """Past reads keep closed segments decoded by their text: a hit is the same blocks, and past the budget
    the oldest texts go first (a text over a sixteenth of the budget is decoded, never kept)."""
    cache = text_cache.ClosedBlocks(budget=16 * 50)       # texts of 41-43 characters: about 19 kept
    texts = [f'[0,[["s","e{i}",{i}]],{{"l|x|":[[{i},0,"v{i}"]]}}]\n' for i in range(40)]
    first = cache.get(texts[0])
    assert first == decode(texts[0]) and cache.get(texts[0]) is first
    for text in texts[1:]:
        assert cache.get(text) == decode(text)
    assert cache.get(texts[0]) is not first            # pushed out by the later ones
    assert cache.get(texts[-1]) is cache.get(texts[-1])
    big = texts[0] * 2                                  # over 50 characters
    assert cache.get(big) == decode(big) and cache.get(big) is not cache.get(big)
