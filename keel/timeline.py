"""The timeline rules of DESIGN §4, once, for every store.

A timeline (one fact predicate, one label, or one relation triple) is a set of *points* in valid
time. Each write asserts something at a point: a value (`open_fact`, `link`, a label) or an end
(`close_fact`, `unlink`). Assertions at the same point keep log order; the last one visible wins
(a correction). The value at world time `t` is the winner at the greatest point `<= t`, unless that
winner is an end; the version it belongs to runs to the next point (or stays open). So a late event
lands in its place, a version that gets cut is closed at the new point and never rewritten, and the
answer for `known_at=K` is the same fold over only the assertions recorded by `K`.
"""
from __future__ import annotations

from bisect import bisect_right, insort
from collections.abc import Iterator
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


class Version(NamedTuple):
    """A version as believed at some knowledge time: the winning assertion and its derived interval."""
    assertion: Assertion
    valid_to: Micros | None
    corrected_by: str | None


class Timeline:
    """Assertions of one key, indexed by point; as-of lookups are a bisect (O(log n))."""
    __slots__ = ("_runs", "at", "points")

    def __init__(self) -> None:
        self.points: list[Micros] = []
        self.at: dict[Micros, list[Assertion]] = {}
        self._runs: list[Version] | None = None

    def add(self, a: Assertion) -> None:
        self._runs = None
        same = self.at.get(a.point)
        if same is not None:
            same.append(a)
            return
        self.at[a.point] = [a]
        points = self.points
        if not points or points[-1] < a.point:
            points.append(a.point)
        else:
            insort(points, a.point)

    def assertions(self) -> Iterator[Assertion]:
        """Every assertion, by point, then log order."""
        for p in self.points:
            yield from self.at[p]

    def latest_value(self) -> Any:
        """The value at the last point in valid time (current belief), or None when ended."""
        if not self.points:
            return None
        w = self.at[self.points[-1]][-1]
        return None if w.closed else w.value

    # --- the fold ---------------------------------------------------------------------------

    def _winner(self, point: Micros, known_at: Micros | None) -> tuple[Assertion | None, int]:
        """The winning assertion at a point and how many are visible there."""
        same = self.at[point]
        if known_at is None:
            return same[-1], len(same)
        visible = [a for a in same if a.recorded_at <= known_at]
        return (visible[-1] if visible else None), len(visible)

    def _next_point(self, index: int, known_at: Micros | None) -> Micros | None:
        points = self.points
        for j in range(index + 1, len(points)):
            if known_at is None or self._winner(points[j], known_at)[0] is not None:
                return points[j]
        return None

    def as_of(self, t: Micros, known_at: Micros | None = None) -> Version | None:
        """The version valid at world time t, as believed at known_at (None = now)."""
        i = bisect_right(self.points, t) - 1
        while i >= 0:
            winner, seen = self._winner(self.points[i], known_at)
            if winner is not None:
                if winner.closed:
                    return None
                version = _version(winner, seen, self._next_point(i, known_at))
                if version.valid_to is not None and version.valid_to <= t:
                    return None
                return version
            i -= 1
        return None

    def versions(self, known_at: Micros | None = None) -> list[Version]:
        """Every version (closed ones included) believed at known_at, by valid_from."""
        visible: list[tuple[Assertion, int]] = []
        for p in self.points:
            winner, seen = self._winner(p, known_at)
            if winner is not None:
                visible.append((winner, seen))
        out = []
        for k, (winner, seen) in enumerate(visible):
            if winner.closed:
                continue
            nxt = visible[k + 1][0].point if k + 1 < len(visible) else None
            out.append(_version(winner, seen, nxt))
        return out

    def runs(self, known_at: Micros | None = None) -> list[Version]:
        """Coalesced versions (see `coalesce`); cached for the current belief."""
        if known_at is not None:
            return coalesce(self.versions(known_at))
        if self._runs is None:
            self._runs = coalesce(self.versions())
        return self._runs

    def first_recorded(self) -> Micros:
        return min(a.recorded_at for a in self.assertions())


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


def _version(winner: Assertion, seen: int, next_point: Micros | None) -> Version:
    valid_to = next_point
    if winner.expires_at is not None and (valid_to is None or winner.expires_at < valid_to):
        valid_to = winner.expires_at
    corrected_by = (winner.by or winner.source) if seen > 1 else None
    return Version(winner, valid_to, corrected_by)
