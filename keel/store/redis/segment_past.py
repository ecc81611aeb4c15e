"""Layout 2's past reads the valid-time index cannot bound by itself: read around t until the answer is exact.

The PAST script (segment_scripts.py) serves a read at a past t from the closed segments holding the point that
decides it and the next one, exact while the timeline's segments hold disjoint ranges, no void and no end. Late
data (ranges that overlap), a void (a retraction or correction: the version before runs on) or a relation's end
(its run starts after the last end) can make the answer depend on points further away. Rather than decoding the
entity's whole history, this reads the index entries of each such timeline around t (INDEX: a window of them;
when ranges overlap, a window and the widest range, which bounds how far below the window an entry meeting the
held range can start (`Span.sound`), or all of them for a timeline whose first segment was closed before ROLL
kept that width), holds the closed segments whose ranges meet [B, U], folds them with the open
segment (which holds every point) and asks `Timeline.reach` which points the answer depends on. Inside [B, U]:
exact. Otherwise [B, U] widens by the next entries below or above, twice as many each round, and the missing
segments are fetched (SEGMENTS), until the reach fits, every entry is held on that side, or the rounds run out
(then the caller decodes the whole history, as before).

Why holding the segments that meet [B, U] is enough: every assertion of the timeline at a point in [B, U] is a
row of a closed segment whose range contains that point, or of the open segment.
"""
from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Container, Sequence
from itertools import pairwise
from operator import itemgetter
from typing import Any, NamedTuple

from ...timeline import Timeline, covering
from ...times import Micros
from .codec import clamped_point, decode_point
from .segments import add_rows, breaks_runs, wanted_rows
from .text_cache import CLOSED

WINDOWS = (8, 256, 4000)  # index entries read each side of t for a timeline whose ranges do not overlap, in turn
SCAN = 4000               # index entries read at most for one whose ranges overlap, width unknown (more: whole)
ROUNDS = 12               # widenings within one window before giving up

Entry = tuple[str, str, int]      # (least point, greatest point, segment number) of one index entry; points as
#                                 point9 text (codec.encode_point), whose order is the points': compared undecoded
_least = itemgetter(0)            # an entry's least point, as a key for bisect
Reach = tuple[str | None, str | None]    # Timeline.reach's (low, high) as point9 text
Cut = tuple[Micros | None, Micros | None, Micros | None]    # (below, lo, hi), micros: the points <= below (None:
#                                                            none) and those in [lo, hi] (None: unbounded there)


class Width(NamedTuple):
    """What bounds a window of a timeline whose ranges overlap (INDEX's "o" answer): `micros`, at least its widest
    range; `least`/`greatest`: the least and greatest least point of the window read; `bottom`/`top`: the window
    reaches its first/last entry; `lowest`: the timeline's entries with the least least points, in order (some
    left out for a read with known_at); `beyond`: None when those are all its entries, else the least point
    every other entry starts at or above."""
    micros: int
    least: str
    greatest: str
    bottom: bool
    top: bool
    lowest: list[Entry]
    beyond: str | None


class Span:
    """One timeline's index entries (by least point) and the held range [B, U] of entries low..high.
    `bottom`/`top`: the entries reach the timeline's first/last closed segment; then B/U are unbounded when
    the first/last entry is held.

    `first`: for a relation none of whose closed rows is an end or expires (voids never break a run), its first
    entry, always held: the run covering t then starts at its first visible link, whatever lies between that
    and the entries around t (links and voids only), so the run's start needs only the first segment.

    `before`: only segments numbered below it count (a read with known_at whose closed segment `before` stands
    in for the open one). The others' entries still bound [B, U] (an entry of the index is one, whatever its
    segment), but are never held: they hold no row of the timeline read."""
    __slots__ = ("before", "bottom", "cap", "complete", "entries", "first", "firsts", "high", "low", "step_down",
                 "step_up", "top", "width")

    def __init__(self, entries: list[Entry], bottom: bool, top: bool, t9: str, first: Entry | None = None,
                 complete: bool = False, width: Width | None = None, before: int | None = None) -> None:
        self.entries = entries if all(a < b for a, b in pairwise(entries)) else sorted(set(entries))
        self.bottom, self.top, self.complete = bottom, top, complete
        self.before = before
        self.first = first
        self.width = width
        self.firsts: list[Entry] = []
        if width is not None and first is not None:     # every entry starting within the first one's range
            self.firsts = [e for e in width.lowest if e[0] <= first[1]]
        below = bisect_right(self.entries, t9, key=_least)
        self.low = below - 1 if below else 0
        self.high = min(self.low + 1, len(self.entries) - 1) if below else 0
        self.step_down = self.step_up = 1
        # U starts at the least point known above t (an entry's greatest point above t, or the least point of
        # the entry after `low`): a fact's next point is usually there, and fewer segments meet [B, U]
        above = [e[1] for e in self.entries[:self.low + 1] if e[1] > t9]
        if below and self.low + 1 < len(self.entries):
            above.append(self.entries[self.low + 1][0])
        self.cap: str | None = min(above) if below and above else None

    @property
    def floor(self) -> str | None:
        """B: None when everything below is held."""
        if not self.entries or (self.low == 0 and self.bottom):
            return None
        return self.entries[self.low][0]

    @property
    def ceiling(self) -> str | None:
        """U: None when everything above is held."""
        if not self.entries or (self.high == len(self.entries) - 1 and self.top):
            return None
        u = self.entries[self.high][1]
        return u if self.cap is None or self.cap > u else self.cap

    def held(self) -> set[int]:
        """The segments whose ranges meet [B, U], and the first one when kept."""
        b, u, before = self.floor, self.ceiling, self.before
        out = {n for lo, hi, n in self.entries
               if (b is None or hi >= b) and (u is None or lo <= u) and (before is None or n < before)}
        if self.first is not None:
            out.add(self.first[2])
            out.update(n for _, _, n in self.firsts)
        return out

    def sound(self) -> bool:
        """Whether the entries read hold every entry whose range meets [B, U]. Always, but for a window of a
        timeline whose ranges overlap (`width`): an entry below the window starts below its least least point
        L and ends before L + the widest range, so B must be at least that; one above starts above the
        window's greatest least point, so U must be below that."""
        w = self.width
        if w is None or not self.entries:
            return True
        b, u = self.floor, self.ceiling
        low_ok = w.bottom or (b is not None and decode_point(b) >= decode_point(w.least) + w.micros)
        return low_ok and (w.top or (u is not None and u < w.greatest))

    def _covered_from_first(self, point9: str) -> bool:
        """Whether every row at or below a point is held, the first entry being held."""
        assert self.first is not None
        if self.width is not None:     # overlapping ranges: every entry starting at or below it is held
            w = self.width
            return point9 <= self.first[1] and (w.beyond is None or w.beyond > point9)
        if not self.complete:
            return point9 <= self.first[1]      # disjoint ranges: later entries start above the first one's end
        held, before = self.held(), self.before
        return all(point9 < lo for lo, _, n in self.entries if n not in held and (before is None or n < before))

    def reach(self, tl: Timeline | None, at: Micros, known_at: Micros | None, relation: bool) -> Reach:
        """The held timeline's reach at `at`; [B, U] itself when the kept first entry settles the read: a run
        covering `at` that starts where every row is held, with no end or expiry among the closed rows not
        held (links and voids neither move its start nor end it; the open segment's rows are all held)."""
        if tl is None:
            return None, clamped_point(at)
        if self.first is not None:
            run = covering(tl.runs(known_at), at)
            if run is not None and self._covered_from_first(clamped_point(run.assertion.point)):
                return self.floor, self.ceiling
        low, high = tl.reach(at, known_at, relation)
        return (None if low is None else clamped_point(low)), (None if high is None else clamped_point(high))

    def least(self) -> tuple[Cut, set[int]] | None:
        """For a relation whose first entry is kept: the cut to the closed rows at its least point (the open
        segment's all) and the segments holding those rows, which settle most reads (`settles`); None
        otherwise."""
        if self.first is None:
            return None
        p0, before = self.first[0], self.before
        point = decode_point(p0)
        return (point, point, point), {n for lo, _, n in (self.first, *self.firsts, *self.entries)
                                       if lo == p0 and (before is None or n < before)}

    def settles(self, tl: Timeline | None, at: Micros, known_at: Micros | None) -> bool:
        """Whether a relation folded from the rows `least` keeps answers at `at` exactly: the run covering `at`
        starts at or below the least point P0 of the closed rows, and every closed row at P0 is held (`least`
        holds every entry starting at P0 it read; a window of the lowest entries may leave out more of them).
        Then no closed row left out (links and voids only, above the run's start) moves its start or ends it,
        as in `reach`; nor does a row of the open segment above P0 when none of its rows is an end or expires
        (`fold`'s `cut_last`: else they are all folded)."""
        if tl is None or self.first is None:
            return False
        run = covering(tl.runs(known_at), at)
        if run is None:
            return False
        start, p0 = clamped_point(run.assertion.point), self.first[0]
        return start < p0 or (start == p0 and (self.width is None or self.width.beyond is None
                                                or self.width.beyond > p0))

    def bounds(self) -> Cut | None:
        """The rows of held closed segments a read looks at: those in [B, U], and with a kept first entry those
        at or below its greatest point too (`_covered_from_first` vouches for no more); None: every row (a
        complete scan's first entry may vouch for rows above it)."""
        if self.first is not None and self.complete:
            return None
        b, u = self.floor, self.ceiling
        return (None if self.first is None else decode_point(self.first[1]),
                None if b is None else decode_point(b), None if u is None else decode_point(u))

    def fits(self, reach: Reach) -> bool:
        low, high = reach
        b, u = self.floor, self.ceiling
        return (b is None or (low is not None and low >= b)) and (u is None or (high is not None and high <= u))

    def widen(self, reach: Reach) -> bool:
        """Hold more entries on the side(s) the reach leaves; False when there is nothing more to hold."""
        low, high = reach
        b, u = self.floor, self.ceiling
        grew = False
        if b is not None and (low is None or low < b) and self.low > 0:
            self.low = max(0, self.low - self.step_down)
            self.step_down *= 2
            grew = True
        if u is not None and (high is None or high > u) and self.cap is not None:
            self.cap = None         # first up to the greatest point of entry `high`, then by entries
            grew = True
        elif u is not None and (high is None or high > u) and self.high < len(self.entries) - 1:
            self.high = min(len(self.entries) - 1, self.high + self.step_up)
            self.step_up *= 2
            grew = True
        return grew


def parse_entries(members: Sequence[str], prefix: str, memo: dict[tuple[str, ...], list[Entry]] | None = None
                  ) -> list[Entry]:
    """Index members `<P><least point9><greatest point9><n>` of one timeline as entries; `memo`: the entries
    parsed already, by the members without their P (an entity's timelines written together have the same)."""
    k = len(prefix)
    if memo is None:
        return [(m[k:k + 9], m[k + 9:k + 18], int(m[k + 18:])) for m in members]
    key = tuple([m[k:] for m in members])
    got = memo.get(key)
    if got is None:
        got = memo[key] = [(m[:9], m[9:18], int(m[18:])) for m in key]
    return got


def spans_of(answer: Any, prefix: str, t9: str, before: int | None, window: int,
             memo: dict[tuple[str, ...], list[Entry]] | None = None) -> Span | None:
    """A Span from INDEX's answer for one timeline, asked for `window` entries each side (None: too many
    entries); `before`: only segments numbered below it count (a read with known_at whose closed segment
    `before` stands in for the open one); `memo`: `parse_entries`'s, shared by the timelines of one entity."""
    if answer == "*":
        return None
    kind, below, above, first, ends = answer[:5]
    entries = parse_entries([*below, *above] if kind == "a" else [*below[::-1], *above], prefix, memo)  # in order
    unbroken = prefix[0] == "r" and not ends        # only then are the first entries kept (`Span.first`)
    lowest = parse_entries(first, prefix) if unbroken else []
    counted = entries if before is None else [e for e in entries if e[2] < before]
    firsts = lowest if before is None else [e for e in lowest if e[2] < before]
    if kind == "a":
        return Span(entries, True, True, t9, min(counted) if unbroken and counted else None, complete=True,
                    before=before)
    if kind == "o":
        width = Width(int(answer[5]), entries[0][0], entries[-1][0], len(below) < window, len(above) < window,
                      firsts, lowest[-1][0] if lowest and len(first) >= window else None) if entries else None
        if width is None:
            return Span(entries, True, True, t9, before=before)
        keep = width.lowest[0] if unbroken and width.lowest else None
        return Span(entries, width.bottom, width.top, t9, keep, width=width, before=before)
    bottom = len(below) < window
    keep = (min(counted) if bottom and counted else firsts[0] if firsts else None) if unbroken else None
    return Span(entries, bottom, len(above) < window, t9, keep, before=before)


def fold(segments: dict[int, list[list[Any]]], last: list[list[Any]], cuts: dict[str, Cut | None],
         held: dict[str, set[int]], cut_last: Container[str] = ()) -> dict[str, Timeline]:
    """The timelines of `cuts` (by P) from the deltas of the closed segments (by number) each holds (`held`) and
    then of `last` (the open segment, or the closed one standing in for it), restatements skipped; each cut to
    the rows at the points its Cut keeps (None: every row), `last`'s rows whole for a Cut that keeps rows below
    (a relation's run: an end or expiry among the open segment's rows may break it), but for the P in
    `cut_last` (relations without either there: `settles`). The reach is read from those only (`Timeline.reach`: exact from every assertion in a range whose segments are all held, whatever
    else is held), so other rows are never built."""
    tls: dict[str, Timeline] = {}
    for n in sorted(segments):
        keep = {p: cut for p, cut in cuts.items() if n in held[p]}
        if keep:
            _fold_rows(tls, segments[n], keep, False)
    _fold_rows(tls, last, cuts, True, cut_last)
    return tls


def _fold_rows(tls: dict[str, Timeline], blocks: list[list[Any]], cuts: dict[str, Cut | None], last: bool,
               cut_last: Container[str] = ()) -> None:
    """`fold`'s rows of one segment's deltas (`last`: the open segment's)."""
    for provs, p, rows in wanted_rows(blocks, cuts):
        cut = cuts[p]
        if cut is not None and not (cut[0] is not None and last and p not in cut_last):
            below, lo, hi = cut
            rows = [row for row in rows if (below is not None and row[0] <= below) or (
                (lo is None or row[0] >= lo) and (hi is None or row[0] <= hi))]
        if rows:        # a timeline without rows reads as none (`Span.reach`, `entity_view`)
            add_rows(tls, p, provs, rows)


def nearest(segments: dict[int, list[list[Any]]], last: list[list[Any]], bounds: dict[str, Cut | None],
            held: dict[str, set[int]], at: Micros, known_at: Micros | None
            ) -> tuple[dict[str, Cut], dict[str, Timeline]]:
    """For each timeline other than a relation cut to its [B, U] (`bounds`): the range from its greatest point
    <= `at` to its least point above, among the rows in [B, U] visible at `known_at` (B or U where there is
    none) of the segments it holds (`held`) and `last`, and the timeline of its visible rows at those two
    points, in log order (the others between them are not visible then). Every segment meeting the range is
    held (it lies in [B, U]), so a read whose reach lies in it is exact from those rows alone: a fact's read
    usually looks at those two points only (`Timeline.reach`; voids aside)."""
    asked = {p: cut for p, cut in bounds.items() if cut is not None and cut[0] is None and p[0] != "r"}
    found: dict[str, list[Any]] = {p: [None, None, [], []] for p in asked}     # lo, hi, their rows
    for n in [*sorted(segments), None]:
        blocks = last if n is None else segments[n]
        keep = asked if n is None else {p for p in asked if n in held[p]}
        for provs, p, rows in wanted_rows(blocks, keep):
            _, b, u = asked[p]
            near = found[p]
            lo, hi = near[0], near[1]
            for row in rows:
                point = row[0]
                if (b is not None and point < b) or (u is not None and point > u) or (
                        known_at is not None and provs[row[1]][2] > known_at):
                    continue
                if point <= at:
                    if lo is None or point > lo:
                        lo, near[2] = point, [(provs, row)]
                    elif point == lo:
                        near[2].append((provs, row))
                elif hi is None or point < hi:
                    hi, near[3] = point, [(provs, row)]
                elif point == hi:
                    near[3].append((provs, row))
            near[0], near[1] = lo, hi
    tls: dict[str, Timeline] = {}
    for p, (_, _, low_rows, high_rows) in found.items():
        for provs, row in [*low_rows, *high_rows]:
            add_rows(tls, p, provs, [row])
    return {p: (None, cut[1] if found[p][0] is None else found[p][0], cut[2] if found[p][1] is None
                else found[p][1]) for p, cut in asked.items()}, tls


def _within(reach: Reach, cut: Cut) -> bool:
    """Whether a reach (point9 text) lies in a range of micros (None: unbounded)."""
    low, high = reach
    _, lo, hi = cut
    return (lo is None or (low is not None and decode_point(low) >= lo)) and (
        hi is None or (high is not None and decode_point(high) <= hi))


def widened(spans: dict[str, Span], tail: list[list[Any]], at: Micros, known_at: Micros | None,
            fetch: Callable[[list[int]], dict[int, str] | None]) -> dict[str, Timeline] | None:
    """One entity's wanted timelines (P -> its Span) at `at` as believed at `known_at`, exactly, from the closed
    segments `fetch` returns by number (None: they could not be read as one generation) and `tail` (the blocks
    of the open segment, or of the closed one standing in for it); None when
    the rounds run out or a fetch fails (the caller reads the whole history). Each round first folds the
    timelines other than relations from the rows around `at` only (`nearest`), and folds them from their whole
    [B, U] when a reach leaves that."""
    decoded: dict[int, list[list[Any]]] = {}
    ended = {p for _, p, rows in wanted_rows(tail, spans) if p[0] == "r" and any(map(breaks_runs, rows))}
    for round_ in range(ROUNDS + 1):
        quick = round_ == 0     # a relation's first entry: only the segments holding its least point
        least = {p: got for p, s in spans.items() if p[0] == "r" and (got := s.least()) is not None}
        held = {p: s.held() if p not in least else least[p][1] if quick else s.held() | least[p][1]
                for p, s in spans.items()}
        need = sorted(set().union(*held.values()) - set(decoded))
        if need:
            got = fetch(need)
            if got is None:
                return None
            decoded.update((n, CLOSED.get(body)) for n, body in got.items())
        bounds = {p: s.bounds() for p, s in spans.items()}
        near, tls = nearest(decoded, tail, bounds, held, at, known_at)
        tls.update(fold(decoded, tail, {**{p: cut for p, cut in bounds.items() if p not in near},
                                        **{p: cut for p, (cut, _) in least.items()}}, held, least.keys() - ended))
        reached = {p: spans[p].reach(tls.get(p), at, known_at, False) for p in near}
        if not (all(_within(reached[p], cut) for p, cut in near.items())
                and all(spans[p].settles(tls.get(p), at, known_at) for p in least)):
            if quick and least:
                continue            # the relations' whole [B, U] and first entries first
            tls, reached = fold(decoded, tail, bounds, held), {}
        short = {p: reach for p, s in spans.items()
                 if not s.fits(reach := reached.get(p) or s.reach(tls.get(p), at, known_at, p[0] == "r"))}
        if not short:
            return tls if all(s.sound() for s in spans.values()) else None     # a wider window may be
        if not all(spans[p].widen(reach) for p, reach in short.items()):
            return None
    return None
