"""`Timeline.reach`: a store holding every assertion at points in [B, U] answers a read exactly when the read's
reach lies inside; layout 2's past reads choose the closed segments they fetch by it (segment_past.py).

Property: for generated timelines (values, ends, voids, expiries, corrections, late recorded_at), a read at t
(believed now or at known_at), and a held interval [B, U] (either side unbounded), the timeline of the held
assertions plus arbitrary others answers like the whole timeline whenever its reach says it can."""
from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from support.timelines import POINTS, assertion, assertion_strategy

from keel.timeline import Timeline, covering, new_assertion, void_of


def answer(tl: Timeline, t: int, known_at: int | None, relation: bool) -> Any:
    return covering(tl.runs(known_at), t) if relation else tl.as_of(t, known_at)


read_strategy = st.tuples(st.integers(-1, POINTS + 1), st.sampled_from([None, 98, 100, 102, 104, 106]),
                          st.booleans(), st.one_of(st.none(), st.integers(0, POINTS)),
                          st.one_of(st.none(), st.integers(0, POINTS)))


@settings(max_examples=3000, deadline=None)
@given(specs=st.lists(assertion_strategy, max_size=14), read=read_strategy, extra=st.lists(st.booleans(), max_size=14))
def test_a_read_inside_its_reach_answers_as_the_whole_timeline(specs: list[tuple[Any, ...]], read: tuple[Any, ...],
                                                               extra: list[bool]) -> None:
    t, known_at, relation, low_held, high_held = read
    if low_held is not None and high_held is not None and low_held > high_held:
        low_held, high_held = high_held, low_held
    whole, held = Timeline(), Timeline()
    for i, spec in enumerate(specs):
        a = assertion(i, spec)
        whole.add(a)
        inside = (low_held is None or a.point >= low_held) and (high_held is None or a.point <= high_held)
        if inside or (i < len(extra) and extra[i]):
            held.add(a)
    low, high = held.reach(t, known_at, relation)
    below_ok = low_held is None or (low is not None and low >= low_held)
    above_ok = high_held is None or (high is not None and high <= high_held)
    if below_ok and above_ok:
        assert answer(held, t, known_at, relation) == answer(whole, t, known_at, relation)


def test_reach_of_a_fact_is_its_deciding_point_and_the_next_one() -> None:
    tl = Timeline()
    for i, (point, value) in enumerate([(1, "a"), (4, "b"), (8, "c")]):
        tl.add(new_assertion(point, value, False, "s", f"e{i}", 100 + i))
    tl.add(new_assertion(4, void_of("e1"), True, "s", "e9", 110))        # b retracted: a runs on to 8
    assert tl.reach(5, None, False) == (1, 8)
    assert tl.reach(5, 105, False) == (4, 8)          # before the retraction b decided
    assert tl.reach(9, None, False) == (8, None)      # the last version: any later point would end it
    assert tl.reach(0, None, False) == (None, 0)      # nothing yet: an earlier point would decide


def test_reach_of_a_relation_spans_its_run_and_the_point_before() -> None:
    tl = Timeline()
    for i, (point, closed) in enumerate([(1, False), (3, True), (5, False), (7, False), (9, True)]):
        tl.add(new_assertion(point, None if closed else "x", closed, "s", f"e{i}", 100 + i))
    assert tl.reach(8, None, True) == (3, 9)          # the run 5..9 (linked again at 7), ended at 3 before it
    assert tl.reach(2, None, True) == (None, 3)       # the first run: an earlier link could extend it
    assert tl.reach(4, None, True) == (3, 4)          # unlinked at 3: nothing covers 4
