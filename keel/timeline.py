"""The timeline rules (docs/semantics.md), once, for every store.

A timeline (one fact predicate, one label, or one relation triple) is a set of *points* in valid
time. Each write asserts something at a point: a value (`open_fact`, `link`, a label) or an end
(`close_fact`, `unlink`). Assertions at the same point keep log order; the last one visible wins
(a correction). The value at world time `t` is the winner at the greatest point `<= t`, unless that
winner is an end; the version it belongs to runs to the next point (or stays open). So a late event
lands in its place, a version that gets cut is closed at the new point and never rewritten, and the
answer for `known_at=K` is the same fold over only the assertions recorded by `K`.
"""
from __future__ import annotations

from bisect import bisect_right, insort_right
from collections.abc import Iterator
from operator import itemgetter
from typing import Any, NamedTuple

from .times import Micros


class Assertion(NamedTuple):
    """One write to one timeline, with its provenance."""
    point: Micros              # valid_from of a value, valid_to of an end
    value: Any                 # JSON value; None for ends
    closed: bool               # True: an end (close_fact / unlink)
    source: str | None
    evidence: str | None
    recorded_at: Micros
    by: str | None = None
    expires_at: Micros | None = None


_tuple_new = tuple.__new__
VOID = "keel.void"      # an end whose value is {VOID: <event id>}: the assertions at its point do not count


RETRACTION = "retracted"   # VOID_BY of a void written by a retraction (a correction's voids carry none)
VOID_BY = "by"


def void_of(event_id: str, *, retraction: bool = False) -> dict[str, str]:
    """The value of a void: written by a correction or retraction of `event_id` at each point where that
    event's assertion was the winner. A retraction's void says so (`by: retracted`): it is the record that
    the event was withdrawn, which the evidence check of notes reads."""
    return {VOID: event_id, VOID_BY: RETRACTION} if retraction else {VOID: event_id}


def is_retraction_void(a: Assertion) -> bool:
    """Whether an assertion is a void written by a retraction (keel.retracted) rather than a correction."""
    return is_void(a) and a.value.get(VOID_BY) == RETRACTION


def is_void(a: Assertion) -> bool:
    """Whether an assertion is a void: when it wins its point, the point is as if nothing were asserted there
    (the version before runs on), unlike an end, which ends the version before."""
    return is_void_value(a.closed, a.value)


def is_void_value(closed: bool, value: Any) -> bool:
    """`is_void` on an assertion's parts, for stores that look at encoded rows before building assertions. (The
    Redis scripts' Lua cannot call this: segment_scripts.py's PAST and INDEX pick segments by the valid-time index
    and leave voids to keel.timeline, run by the client.)"""
    return bool(closed) and type(value) is dict and VOID in value


def new_assertion(point: Micros, value: Any, closed: bool, source: str | None, evidence: str | None,
                  recorded_at: Micros, by: str | None = None, expires_at: Micros | None = None) -> Assertion:
    """`Assertion(...)` built by tuple.__new__: the NamedTuple's own __new__ is a Python function, and the write
    path makes millions of these."""
    return _tuple_new(Assertion, (point, value, closed, source, evidence, recorded_at, by, expires_at))


class Version(NamedTuple):
    """A version as believed at some knowledge time: the winning assertion and its derived interval."""
    assertion: Assertion
    valid_to: Micros | None
    corrected_by: str | None


def insert(entries: list[Assertion], a: Assertion) -> None:
    """Put an assertion in its place in a timeline's list: by point, after any assertion at the same point
    (log order kept). Stores that keep plain lists call this; the common case is an append."""
    if not entries or entries[-1].point <= a.point:
        entries.append(a)                   # in valid-time order, or a same-point correction
    else:
        insort_right(entries, a, key=_point)


class Timeline:
    """Assertions of one key, kept in one list sorted by point, then log order; as-of lookups are a
    bisect (O(log n)). Most timelines hold a single assertion, so this is one object and one list.
    The list only grows, so the cached coalesced versions stay valid while its length is unchanged;
    `over` wraps a list a store keeps (and appends to with `insert`) without copying it."""
    __slots__ = ("_runs", "entries")

    def __init__(self, first: Assertion | None = None) -> None:
        self.entries: list[Assertion] = [] if first is None else [first]
        self._runs: tuple[int, list[Version]] | None = None

    @classmethod
    def over(cls, entries: list[Assertion]) -> Timeline:
        tl = cls()
        tl.entries = entries
        return tl

    def add(self, a: Assertion) -> None:
        insert(self.entries, a)

    def assertions(self) -> Iterator[Assertion]:
        """Every assertion, by point, then log order."""
        return iter(self.entries)

    def latest_value(self) -> Any:
        """The value at the last point in valid time (current belief), or None when ended."""
        end = len(self.entries)
        while end > 0:
            w = self.entries[end - 1]
            if not is_void(w):
                return None if w.closed else w.value
            end = self._group_start(end)
        return None

    # --- the fold ---------------------------------------------------------------------------
    # A *group* is the slice entries[start:end] of the assertions at one point.

    def _group_end(self, start: int) -> int:
        entries = self.entries
        point, end = entries[start].point, start + 1
        while end < len(entries) and entries[end].point == point:
            end += 1
        return end

    def _group_start(self, end: int) -> int:
        entries = self.entries
        point, start = entries[end - 1].point, end - 1
        while start > 0 and entries[start - 1].point == point:
            start -= 1
        return start

    def _winner(self, start: int, end: int, known_at: Micros | None) -> tuple[Assertion | None, int]:
        """The winning assertion of a group and how many of its assertions are visible."""
        if known_at is None:
            w = self.entries[end - 1]
            return (None if w.closed and is_void(w) else w), end - start
        visible = [a for a in self.entries[start:end] if a.recorded_at <= known_at]
        return (visible[-1] if visible and not is_void(visible[-1]) else None), len(visible)

    def _next_point(self, start: int, known_at: Micros | None) -> Micros | None:
        """The first point at or after entries[start] with a visible assertion."""
        entries = self.entries
        while start < len(entries):
            end = self._group_end(start)
            if known_at is None and not is_void(entries[end - 1]):
                return entries[start].point
            if self._winner(start, end, known_at)[0] is not None:
                return entries[start].point
            start = end
        return None

    def _deciding(self, t: Micros, known_at: Micros | None) -> tuple[int, Assertion, int] | None:
        """The group that decides the version at t: the greatest point <= t whose winner is no void, as the
        end of its slice, its winner and how many of its assertions are visible (None: no such point)."""
        end = bisect_right(self.entries, t, key=_point)
        while end > 0:
            start = self._group_start(end)
            winner, seen = self._winner(start, end, known_at)
            if winner is not None:
                return end, winner, seen
            end = start
        return None

    def as_of(self, t: Micros, known_at: Micros | None = None) -> Version | None:
        """The version valid at world time t, as believed at known_at (None = now)."""
        found = self._deciding(t, known_at)
        if found is None:
            return None
        end, winner, seen = found
        return version_at(winner, seen, self._next_point(end, known_at), t)

    def reach(self, t: Micros, known_at: Micros | None, relation: bool) -> tuple[Micros | None, Micros | None]:
        """The points a read at t (believed at known_at) depends on, as (low, high): assertions at points below
        low or above high cannot change its answer; None for either side: any assertion there could. A store
        that holds every assertion at points in [B, U] (and maybe others) answers exactly from what it holds
        when low is not None and >= B (or it holds everything below) and high <= U (or everything above).

        A fact's read looks at its deciding point and the next visible point (its valid_to); a relation's at
        the run covering t (coalesced versions), from the visible point before the run starts (which ends the
        run before it) to where the run ends."""
        if relation:
            run = covering(self.runs(known_at), t)
            if run is not None:
                before = self._deciding(run.assertion.point - 1, known_at)
                return (None if before is None else before[1].point), run.valid_to
        found = self._deciding(t, known_at)
        if found is None:
            return None, t
        end, winner, _ = found
        if relation:                  # no run covers t: an end, an expired link, or nothing visible yet
            return winner.point, t
        return winner.point, self._next_point(end, known_at)

    def steady(self, t: Micros) -> tuple[Micros | None, Micros | None]:
        """(low, high): every read believed now at a time in [low, high) answers as the read at t, both `as_of`
        and the covering run (None: unbounded on that side). An answer changes only where a point or an expiry
        lies, so low is the greatest of those <= t and high the least > t; an expiry counts only on an
        assertion at a point <= t (a later assertion's expiry lies beyond its point, itself > t)."""
        entries = self.entries
        i = bisect_right(entries, t, key=_point)
        low = entries[i - 1].point if i else None
        high = entries[i].point if i < len(entries) else None
        for a in entries[:i]:
            x = a.expires_at
            if x is None:
                continue
            if x <= t:
                low = x if low is None or x > low else low
            elif high is None or x < high:
                high = x
        return low, high

    def deciding_point(self, t: Micros) -> Micros | None:
        """The point whose winner decides the version at t, believed now: the greatest point <= t whose winner
        is no void (None when there is none). A read at any time >= it looks at nothing before it."""
        found = self._deciding(t, None)
        return None if found is None else found[1].point

    def versions(self, known_at: Micros | None = None) -> list[Version]:
        """Every version (closed ones included) believed at known_at, by valid_from."""
        visible: list[tuple[Assertion, int]] = []
        start = 0
        while start < len(self.entries):
            end = self._group_end(start)
            winner, seen = self._winner(start, end, known_at)
            if winner is not None:
                visible.append((winner, seen))
            start = end
        out = []
        for k, (winner, seen) in enumerate(visible):
            if winner.closed:
                continue
            nxt = visible[k + 1][0].point if k + 1 < len(visible) else None
            out.append(_version(winner, seen, nxt))
        return out

    def recorded_versions(self, known_at: Micros | None = None) -> list[tuple[Version, Assertion | None]]:
        """Every version recorded by known_at (None: ever), by valid_from then log order, each with the
        assertion that superseded it at its point (None while it is the belief). The belief's versions are
        exactly those of `versions(known_at)`."""
        groups: list[list[Assertion]] = []
        start = 0
        while start < len(self.entries):
            end = self._group_end(start)
            group = self.entries[start:end]
            if known_at is not None:
                group = [a for a in group if a.recorded_at <= known_at]
            if group:
                groups.append(group)
            start = end
        out: list[tuple[Version, Assertion | None]] = []
        nxt: Micros | None = None
        following: list[Micros | None] = []     # per group: the next point whose winner is no void
        for group in reversed(groups):
            following.append(nxt)
            if not is_void(group[-1]):
                nxt = group[0].point
        following.reverse()
        for k, group in enumerate(groups):
            nxt = following[k]
            for i, a in enumerate(group):
                if not a.closed:
                    out.append((_version(a, i + 1, nxt), group[i + 1] if i + 1 < len(group) else None))
        return out

    def runs(self, known_at: Micros | None = None) -> list[Version]:
        """Coalesced versions (see `coalesce`); cached for the current belief."""
        if known_at is not None:
            return coalesce(self.versions(known_at))
        if self._runs is None or self._runs[0] != len(self.entries):
            self._runs = (len(self.entries), coalesce(self.versions()))
        return self._runs[1]


_point = itemgetter(0)     # Assertion.point, as a C-level key for bisect


def coalesce(versions: list[Version]) -> list[Version]:
    """Merge adjacent versions (one ends where the next begins) into one: a relation linked again while
    it holds stays one version, valid from its first link. Depends only on the visible assertions,
    so it keeps the known_at definition."""
    out: list[Version] = []
    for v in versions:
        if out and out[-1].valid_to == v.assertion.point:
            prev = out[-1]
            out[-1] = Version(prev.assertion, v.valid_to, prev.corrected_by)
        else:
            out.append(v)
    return out


def covering(versions: list[Version], t: Micros) -> Version | None:
    """The version whose [valid_from, valid_to) contains t (versions sorted and disjoint: a bisect)."""
    i = bisect_right(versions, t, key=lambda v: v.assertion.point) - 1
    if i < 0:
        return None
    v = versions[i]
    return v if v.valid_to is None or t < v.valid_to else None


def holding(entries: list[Assertion], t: Micros, *, below: bool = False) -> Assertion | None:
    """The assertion whose version holds at t over a plain list `entries` (by point, then log order), believed
    now: the winner of the greatest point <= t (`below`: < t) whose winner is no void, unless it is an end or
    its expiry is <= t. `Timeline.over(entries).as_of(t).assertion` when not `below` (the next point is after
    t, so only an expiry can end the version by t)."""
    found = Timeline.over(entries)._deciding(t - 1 if below else t, None)
    if found is None:
        return None
    w = found[1]
    return None if w.closed or (w.expires_at is not None and w.expires_at <= t) else w


def next_point(entries: list[Assertion], point: Micros) -> Micros | None:
    """The first point after `point` whose winner now is no void, over a plain list `entries` (by point, then log
    order): the valid_to a version at `point` gets from the points after it."""
    return Timeline.over(entries)._next_point(bisect_right(entries, point, key=_point), None)


def superseded(assertions: list[Assertion], event_id: str) -> list[tuple[Micros, Assertion | None]]:
    """What a correction or retraction of the event `event_id` changes, believed now: for each point where an
    assertion of that event (evidence == event_id) is the last one, in log order, of the assertions at the point,
    (point, the last assertion there not of that event, or None). Its writes (keel/projector.py) are a void at
    each point, then that assertion again unless it is None or a void.

    The last assertion of a point, not its winner: a void written by `event_id` (when it is itself a correction)
    is superseded too, so that correcting a correction brings back what its voids hid."""
    out: list[tuple[Micros, Assertion | None]] = []
    by_point: dict[Micros, list[Assertion]] = {}
    for a in assertions:
        by_point.setdefault(a.point, []).append(a)
    for point in sorted(by_point):
        group = by_point[point]
        if group[-1].evidence != event_id:
            continue                    # never its, or superseded at this point already: nothing of it believed
        before = [a for a in group if a.evidence != event_id]
        out.append((point, before[-1] if before else None))
    return out


def version_at(winner: Assertion, seen: int, next_point: Micros | None, t: Micros) -> Version | None:
    """THE version rule, as of world time t: the version of the winning assertion at the greatest point <= t,
    or None when that winner is an end or its version ended by t. `seen` counts the assertions visible at
    the winner's point (more than one: a correction), `next_point` is the next visible point. Every store
    decodes into Timeline, which uses it (the Redis store's scripts only choose segments; tests/test_version_rule.py
    and test_version_rule_differential.py compare the store's answers with it)."""
    if winner.closed:
        return None
    version = _version(winner, seen, next_point)
    return None if version.valid_to is not None and version.valid_to <= t else version


def _version(winner: Assertion, seen: int, next_point: Micros | None) -> Version:
    """The version a winning assertion starts: valid to the next point or its expiry, whichever comes first;
    corrected_by names who corrected it when several assertions share its point."""
    corrected_by = (winner.by or winner.source) if seen > 1 else None
    return Version(winner, valid_until(winner, next_point), corrected_by)


def valid_until(a: Assertion, next_point: Micros | None) -> Micros | None:
    """The valid_to of the version an assertion starts: the next point (None: open) or its expiry, whichever
    comes first."""
    if a.expires_at is not None and (next_point is None or a.expires_at < next_point):
        return a.expires_at
    return next_point
