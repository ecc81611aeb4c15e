"""`Timeline.steady`: a read believed now gives the same answer at every time of the span it names; the Redis
store's present views are reused while "now" stays inside the spans of every timeline they read
(keel/store/redis/segment_views.py, PresentViews).

Property: for generated timelines (values, ends, voids, expiries, corrections at one point), the answer at t and at
every other time inside [low, high) is the same, for facts (`as_of`) and relations (the covering run); and each
bound is a time where some answer does change, or a point/expiry (never a time strictly between two of them)."""
from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from support.timelines import POINTS, assertion, assertion_strategy

from keel.timeline import Timeline, covering


def answers(tl: Timeline, t: int) -> tuple[Any, Any]:
    return tl.as_of(t), covering(tl.runs(), t)


@settings(max_examples=3000, deadline=None)
@given(specs=st.lists(assertion_strategy, max_size=14), t=st.integers(-2, POINTS + 6))
def test_every_time_inside_the_steady_span_answers_as_t(specs: list[tuple[Any, ...]], t: int) -> None:
    tl = Timeline()
    for i, spec in enumerate(specs):
        tl.add(assertion(i, spec))
    low, high = tl.steady(t)
    assert low is None or low <= t
    assert high is None or high > t
    lo = -4 if low is None else low
    hi = POINTS + 12 if high is None else high
    for other in range(lo, hi):
        assert answers(tl, other) == answers(tl, t), (other, low, high)
    marks = {a.point for a in tl.entries} | {a.expires_at for a in tl.entries if a.expires_at is not None}
    assert low is None or low in marks
    assert high is None or high in marks


def test_an_empty_timeline_is_steady_everywhere() -> None:
    assert Timeline().steady(5) == (None, None)
