"""keel.timeline's functions over plain lists: `holding` and `next_point` (what keel/changes.py reads a change's
rows by) and `superseded` (what keel/projector.py writes for a correction or retraction).

Properties over generated timelines (values, ends, voids, expiries, corrections at a point): `holding` is the
assertion of `Timeline.as_of` believed now; `holding(below=True)` and `next_point` match the plain scans
changes.py used before they moved here; `superseded` matches the loop projector.py used before."""
from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from keel.timeline import (
    Assertion,
    Timeline,
    holding,
    insert,
    is_void,
    new_assertion,
    next_point,
    superseded,
    valid_until,
    void_of,
)

POINTS = 10

spec_strategy = st.lists(st.tuples(st.integers(0, POINTS), st.sampled_from(["v", "v", "end", "void", "note"]),
                                   st.integers(0, 2), st.integers(1, 4), st.integers(0, 3)), max_size=14)


def entries_of(specs: list[tuple[Any, ...]]) -> list[Assertion]:
    """Assertions by point, then log order; evidence `e<n>` of a few events (so several share an event)."""
    out: list[Assertion] = []
    for i, (point, kind, value, expires, event) in enumerate(specs):
        evidence = f"e{event}"
        if kind == "end":
            a = new_assertion(point, None, True, f"s{i}", evidence, 100 + i)
        elif kind == "void":
            a = new_assertion(point, void_of(f"e{(event + 1) % 4}"), True, f"s{i}", evidence, 100 + i)
        else:
            a = new_assertion(point, value, False, f"s{i}", evidence, 100 + i,
                              expires_at=point + expires if kind == "note" else None)
        insert(out, a)
    return out


def scan_holding(entries: list[Assertion], t: int, below: bool = False) -> Assertion | None:
    """changes.py's former `_held`: a scan down from t."""
    i = len(entries)
    while i and (entries[i - 1].point > t or (below and entries[i - 1].point == t)):
        i -= 1
    while i:
        w = entries[i - 1]
        if is_void(w):
            point = w.point
            while i and entries[i - 1].point == point:
                i -= 1
            continue
        return None if w.closed or (w.expires_at is not None and w.expires_at <= t) else w
    return None


def scan_next_point(entries: list[Assertion], point: int) -> int | None:
    """changes.py's former `_next_point`."""
    last: dict[int, Assertion] = {}
    for x in entries:
        if x.point > point:
            last[x.point] = x
    return next((p for p, x in last.items() if not is_void(x)), None)


def loop_superseded(assertions: list[Assertion], target: str) -> list[tuple[int, Assertion | None]]:
    """projector.py's former loop of `_supersede`."""
    out = []
    for point in sorted({a.point for a in assertions if a.evidence == target}):
        group = [a for a in assertions if a.point == point]
        if group[-1].evidence != target:
            continue
        before = [a for a in group if a.evidence != target]
        out.append((point, before[-1] if before else None))
    return out


@settings(max_examples=400, deadline=None)
@given(spec_strategy, st.integers(-1, POINTS + 5))
def test_holding_and_next_point_follow_the_timeline(specs: list[tuple[Any, ...]], t: int) -> None:
    entries = entries_of(specs)
    version = Timeline.over(entries).as_of(t)
    assert holding(entries, t) == (None if version is None else version.assertion)
    assert holding(entries, t) == scan_holding(entries, t)
    assert holding(entries, t, below=True) == scan_holding(entries, t, below=True)
    assert next_point(entries, t) == scan_next_point(entries, t)


@settings(max_examples=400, deadline=None)
@given(spec_strategy, st.integers(0, 3))
def test_superseded_is_what_a_correction_rewrites(specs: list[tuple[Any, ...]], event: int) -> None:
    entries = entries_of(specs)
    assert superseded(entries, f"e{event}") == loop_superseded(entries, f"e{event}")


def test_superseded_reaches_a_correction_s_own_voids() -> None:
    """Correcting a correction: its void is the last assertion at the point, so it is superseded, and the value it
    hid comes back."""
    first = new_assertion(5, "a", False, "s", "e1", 100)
    void = new_assertion(5, void_of("e1"), True, "s", "e2", 101)
    assert superseded([first, void], "e2") == [(5, first)]
    assert superseded([first, void], "e1") == []               # e1 no longer believed at 5: nothing to undo
    assert holding([first, void], 5) is None and holding([first], 5) == first


@given(st.one_of(st.none(), st.integers(0, 5)), st.one_of(st.none(), st.integers(0, 5)))
def test_valid_until_is_the_next_point_or_the_expiry_whichever_first(expires: int | None, nxt: int | None) -> None:
    a = new_assertion(0, "v", False, "s", "e", 100, expires_at=expires)
    expected = nxt if expires is None or (nxt is not None and nxt < expires) else expires     # changes.py's before
    assert valid_until(a, nxt) == expected
