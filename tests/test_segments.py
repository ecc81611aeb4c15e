"""The Redis store's restatements (keel/store/redis/segments.py), property-based: whatever the writes (late points,
corrections, ends, voids, expiries, relations linked again) and wherever segments are closed, a read that the
open segment says it serves equals the read of the whole timelines, and the open segment serves reads now
unless a write could reach below a cut. Pure Python: the same strings the Redis store appends and reads."""
from __future__ import annotations

from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from keel.store.redis.segments import Fold, decode, encode_step, restate
from keel.timeline import covering, new_assertion, void_of

OWNER = "debt:a"
KEYS = [("f", OWNER, "balance", ""), ("r", OWNER, "owed_by", "household:h")]

write = st.tuples(
    st.sampled_from([0, 1]),                      # which timeline
    st.integers(0, 12),                           # point
    st.sampled_from(["value", "end", "void", "expiring"]),
    st.integers(0, 3),                            # value
    st.booleans(),                                # close the open segment after this step
)


def _assertion(i: int, point: int, kind: str, value: int) -> Any:
    if kind == "end":
        return new_assertion(point, None, True, "s", f"e{i}", 1_000 + i)
    if kind == "void":
        return new_assertion(point, void_of(f"e{i - 1}"), True, "s", f"e{i}", 1_000 + i)
    if kind == "expiring":
        return new_assertion(point, value, False, "s", f"e{i}", 1_000 + i, None, point + 2)
    return new_assertion(point, value, False, "s", f"e{i}", 1_000 + i)


def _reads(tl: Any, kind: str, t: int) -> Any:
    if tl is None:
        return None
    return covering(tl.runs(), t) if kind == "r" else tl.as_of(t)


@settings(max_examples=400, deadline=None)
@given(st.lists(write, min_size=1, max_size=30), st.integers(0, 12))
@example([(0, 1, "value", 1, False), (0, 8, "value", 2, True), (0, 8, "void", 0, True), (0, 4, "value", 3, True),
          (0, 4, "void", 0, False)], 12)      # a later cut keeps an earlier one whose point is void by then
def test_an_open_segment_serves_exactly_what_whole_timelines_answer(ops: list[tuple[int, int, str, int, bool]],
                                                                    now: int) -> None:
    closed: list[str] = []
    open_segment = ""
    for i, (which, point, kind, value, roll) in enumerate(ops):
        step = encode_step([([(KEYS[which], _assertion(i, point, kind, value))], f"e{i}")])
        open_segment += "".join(b for b in step.blocks if b)
        if roll:
            fold = Fold(decode(open_segment), whole=False)
            if not fold.serves(now):
                fold = Fold(decode("".join(closed) + open_segment), whole=True)
            closed.append(open_segment)
            open_segment = restate(fold.timelines, now, fold.anchors)
    whole = Fold(decode("".join(closed) + open_segment), whole=True)
    served = Fold(decode(open_segment), whole=False)
    assert set(served.timelines) == set(whole.timelines)
    checked = 0
    for t in range(-1, 15):
        if not served.serves(t):
            continue
        for p, tl in whole.timelines.items():
            assert _reads(served.timelines.get(p), p[0], t) == _reads(tl, p[0], t), (p, t)
            checked += 1
    if not served.dirty:
        assert served.serves(max(now, 12)), "a clean open segment serves every read from its roll's now on"


def test_a_void_at_a_cut_falls_to_the_point_kept_before_it_and_one_below_forces_whole_timelines() -> None:
    """A restatement keeps the point deciding before its cut (segments.restate), so a void at the cut (a
    correction after a roll) falls to that point: the open segment still serves, and answers as the whole
    timeline. A void below the cut may hit that very point: then only whole timelines are exact."""
    key = KEYS[0]

    def step(*writes: tuple[int, int, str, int]) -> str:
        return "".join(b for b in encode_step([([(key, _assertion(*w)) for w in writes], "e")]).blocks if b)
    history = step((0, 1, "value", 5), (1, 4, "value", 6))
    fold = Fold(decode(history), whole=False)
    segment = restate(fold.timelines, 10, fold.anchors)
    assert Fold(decode(segment), whole=False).serves(10)
    void_at_cut = step((2, 4, "void", 0))
    served = Fold(decode(segment + void_at_cut), whole=False)
    whole = Fold(decode(history + void_at_cut), whole=True)
    assert served.serves(10)
    for p, tl in whole.timelines.items():
        for t in (4, 10):
            assert served.timelines[p].as_of(t) == tl.as_of(t), (p, t)
        assert tl.as_of(10).assertion.value == 5            # the void at 4 falls to the value at 1
    assert not Fold(decode(segment + void_at_cut + step((3, 1, "void", 0))), whole=False).serves(10)


def test_a_cut_kept_from_an_earlier_restatement_whose_point_is_void_forces_whole_timelines_on_a_void_below() -> None:
    """A restatement whose fold serves keeps the earlier cut as its anchor when the point deciding now lies below
    it (segments.restate): here every point from the anchor down to a late value is void, so reads at the
    anchor already fall to that late value. A void of that value must then make the open segment inexact (the
    point below it, kept by an earlier restatement only, is gone from this one), as a void at an anchor does."""
    key = KEYS[0]

    def step(i: int, point: int, kind: str, value: int = 0) -> str:
        return "".join(b for b in encode_step([([(key, _assertion(i, point, kind, value))], f"e{i}")]).blocks if b)

    def roll(segment: str) -> str:
        fold = Fold(decode(segment), whole=False)
        assert fold.serves(12)
        return restate(fold.timelines, 12, fold.anchors)
    history = step(0, 1, "value", 1) + step(1, 8, "value", 2)
    segment = roll(history)                     # cut at 8, keeps 1 (the point deciding before it)
    history += step(2, 8, "void")
    segment = roll(segment + step(2, 8, "void"))
    history += step(3, 4, "value", 3)
    segment = roll(segment + step(3, 4, "value", 3))     # the anchor stays 8 (void); rows from 4 on
    history += step(4, 4, "void")
    served = Fold(decode(segment + step(4, 4, "void")), whole=False)
    whole = Fold(decode(history), whole=True)
    assert whole.timelines["f|balance||"].as_of(10).assertion.value == 1
    assert not served.serves(10)
