"""Layout 2's entity segments: how a step's writes become one block per entity, and blocks become timelines.

An entity's assertions (of the timelines it owns) live in strings of newline-terminated JSON blocks:

    [0, provenance, {P: rows}]             a delta: what one commit step wrote to the entity
    [1, provenance, {P: rows}, {P: anchor}]  a restatement, at the head of every segment after the first

`provenance` lists `[source, evidence, recorded_at]` or `[source, evidence, recorded_at, by]`; P is the
timeline prefix of keys.py; a row is `[point, k, value]` (a value from point on) or
`[point, k, value, closed, expires_at]` (an end, or an expiring value), k indexing `provenance`. Rows keep log
order: blocks in commit order, rows of one timeline in write order. JSON never holds a raw newline, so a
segment splits into blocks on it.

The open segment `s:<entity>` is appended to by every step that touches the entity. Once it grows past a
size, the writer closes it (renamed `s:<entity>:<n>`) and opens a new one that starts with a restatement:
every timeline of the entity, each either whole or cut to the assertions a read at any time >= its anchor
needs (`restate`). So a read at `t` >= the anchors, as believed now, decodes the open segment only (bounded),
and any other read (known_at, an earlier t) decodes the deltas of every segment, skipping restatements.
A restatement stays exact for later deltas except those that could reach below an anchor (`Fold.dirty`):
a void at an anchor, or any row of a relation at or before its anchor; a read then decodes every segment.
"""
from __future__ import annotations

import json
from bisect import bisect_left
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from operator import itemgetter
from typing import Any

import msgspec

from ...errors import UsageError
from ...timeline import Assertion, Timeline, covering, insert, is_void_value, new_assertion
from ...times import Micros
from ..base import EventWrites, Key
from .codec import json_text
from .keys import escape, key_of, prefix_of

DELTA, RESTATEMENT = 0, 1
ROLL_BYTES = 12_000          # an open segment larger than this is closed and restated by the writer (a read now
#                              decodes it: about 0.2 ms at this size)
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_encode = _JSON.encode


def _plain(obj: Any) -> Any:
    """msgspec's hook for subclasses of JSON's types (keel.times.Instant is an int): their plain value."""
    for kind in (int, float, str):
        if isinstance(obj, kind):
            return kind(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON")


_fast_encode = msgspec.json.Encoder(enc_hook=_plain).encode   # blocks: 10x json's per-call cost
_loads = msgspec.json.Decoder().decode
_point = itemgetter(0)     # Assertion.point, as a key for bisect
_PREFIXES: dict[Any, str] = {}     # a key without its owner -> P (encode_step reads it inline: key[:1] + key[2:],
#                                    or key[0] for a key of two, an entity's own timeline: "e")
_PREFIXES_KEPT = 100_000


def _new_prefix(part: Any, key: Key) -> str:
    """P of a key (keys.prefix_of) that _PREFIXES lacks under `part`, kept there."""
    if len(_PREFIXES) > _PREFIXES_KEPT:
        _PREFIXES.clear()
    p = _PREFIXES[part] = prefix_of(key)
    return p


_LIMIT = 2 ** 53             # the points the store keeps: within ±2**53, which a double (JSON, Lua) holds exactly

__all__ = ["DELTA", "RESTATEMENT", "ROLL_BYTES", "Fold", "StepBlocks", "decode", "encode_step", "recorded_range",
           "restate"]


class StepBlocks:
    """One commit step encoded per entity: its delta block (None when the step only names it as a relation's
    object), the least recorded_at of the writes involving it, and the index elements `>owner|P` of relations
    naming it as object."""
    __slots__ = ("blocks", "entities", "incoming", "latest", "min_recorded")

    def __init__(self) -> None:
        self.entities: dict[str, int] = {}       # entity -> its index, in order of first appearance
        self.blocks: list[str | None] = []
        self.min_recorded: list[int] = []
        self.incoming: list[dict[str, None] | None] = []   # per entity: index elements, in order
        self.latest: int | None = None           # the greatest recorded_at of the step's writes

    def note(self, entity: str, recorded_at: int) -> int:
        """An entity met at a write recorded at `recorded_at` (its least so far kept); returns its index."""
        i = self.entities.get(entity)
        if i is None:
            i = self.entities[entity] = len(self.min_recorded)
            self.min_recorded.append(recorded_at)
            self.incoming.append(None)
        elif recorded_at < self.min_recorded[i]:
            self.min_recorded[i] = recorded_at
        return i


def encode_step(events: Sequence[EventWrites]) -> StepBlocks:
    """The blocks of one step: per entity one delta with the provenance entries its rows use. (The worker's hot
    path: the owner met last, its delta and its provenance index are kept across writes, most of which share
    them.)"""
    out = StepBlocks()
    ents = out.entities
    mins = out.min_recorded
    note = out.note
    incoming = out.incoming
    parts: dict[str, tuple[list[Any], dict[Any, int], dict[str, list[Any]]]] = {}   # owner -> (provs, index, tls)
    prefixes = _PREFIXES
    latest = None
    owner: Any = None           # the owner met last: its index `i`, its delta `part`, `k` of the provenance `prov`
    i = k = 0
    part: Any = None
    prov: Any = None
    for writes, _ in events:
        for key, a in writes:
            point, value, closed, source, evidence, rec, by, expires = a
            if rec.__class__ is not int:
                rec = int(rec)
            if not -_LIMIT < point < _LIMIT:
                raise UsageError(f"time {point} (micros) is outside the range the Redis store keeps (±2**53)")
            if key[1] != owner:
                owner = key[1]
                i = note(owner, rec)
                part = parts.get(owner)
                if part is None:
                    part = parts[owner] = ([], {}, {})
                k = -1
            elif rec < mins[i]:
                mins[i] = rec
            if latest is None or rec > latest:
                latest = rec
            if k < 0 or not (source is prov[0] and evidence is prov[1] and rec == prov[2] and by is prov[3]):
                prov = (source, evidence, rec, by)
                k = part[1].get(prov, -1)
                if k < 0:
                    k = part[1][prov] = len(part[0])
                    part[0].append([source, evidence, rec] if by is None else [source, evidence, rec, by])
            pk = key[:1] + key[2:] if len(key) != 2 else key[0]
            p = prefixes.get(pk)
            if p is None:
                p = _new_prefix(pk, key)
            tv = value.__class__
            if tv is not str and tv is not int and value is not None and tv is not bool:
                _check_json(value)
            row = [point, k, value] if not closed and expires is None else [point, k, value, closed, expires]
            rows = part[2].get(p)
            if rows is None:
                part[2][p] = [row]
            else:
                rows.append(row)
            if key[0] == "r" and key[3] != owner:
                j = note(key[3], rec)
                got = incoming[j]
                if got is None:
                    got = incoming[j] = {}
                got[f">{escape(owner)}|{p}"] = None          # a dict: thousands of subjects may name one object
    out.latest = latest
    out.blocks = [None] * len(out.min_recorded)
    for name, (provs, _, tls) in parts.items():
        out.blocks[ents[name]] = _fast_encode([DELTA, provs, tls]).decode() + "\n"
    return out


def _check_json(value: Any) -> None:
    """msgspec writes NaN and infinities as null: refuse them (and anything not JSON) as layout 1's encoder does,
    with its ValueError or TypeError (the projector refuses such values before any store sees them)."""
    json_text(value)


def _assertions(provs: list[list[Any]], rows: list[list[Any]]) -> Iterator[Assertion]:
    for row in rows:
        pv = provs[row[1]]
        if len(row) == 3:
            yield new_assertion(row[0], row[2], False, pv[0], pv[1], pv[2], pv[3] if len(pv) > 3 else None, None)
        else:
            yield new_assertion(row[0], row[2], bool(row[3]), pv[0], pv[1], pv[2], pv[3] if len(pv) > 3 else None,
                                row[4])


def decode(segment: str) -> list[list[Any]]:
    """The blocks of a segment (or of several segments concatenated), by msgspec's JSON decoder (about 2.8x
    json.loads on a segment: a read now decodes one)."""
    if not segment:
        return []
    return _loads("[" + segment[:-1].replace("\n", ",") + "]")


class Fold:
    """Timelines of one entity from its blocks, by P, in log order.

    `whole`: the deltas of every segment (restatements skipped): exact for every read. Otherwise the open
    segment alone: its restatement, then its deltas; `anchors` are the restated cuts and `dirty` says a later
    delta may reach below one (then only a whole fold is exact). `deltas=False` leaves the deltas' rows out
    (their timelines are there, empty) until `fill`: whether the fold `serves` a read needs none of them, and a
    read it does not serve reads other segments."""
    __slots__ = ("anchors", "dirty", "fallbacks", "starts", "timelines", "voided")

    def __init__(self, blocks: Iterable[list[Any]], whole: bool, deltas: bool = True) -> None:
        self.timelines: dict[str, Timeline] = {}
        self.anchors: dict[str, Micros] = {}
        self.starts: dict[str, Micros] = {}     # relations restated with the start of the run covering the anchor
        self.fallbacks: set[str] = set()        # other timelines restated with the point deciding before the anchor
        self.voided: dict[str, tuple[bool, bool]] = {}     # P -> (a void at its anchor, a void below it) since
        self.dirty = False
        tls = self.timelines
        anchors = self.anchors
        for block in blocks:
            if block[0] == RESTATEMENT:
                if whole:
                    continue
                anchors.update(block[3])
                self._starts(block[2])
            elif anchors and not self.dirty:
                self._check(block[2])
            if not deltas and block[0] == DELTA:
                for p in block[2]:
                    if p not in tls:
                        tls[p] = Timeline()
                continue
            provs = block[1]
            for p, rows in block[2].items():
                add_rows(tls, p, provs, rows)
            if block[0] == RESTATEMENT:
                self._void_anchors(block[3])

    def fill(self, blocks: Iterable[list[Any]]) -> None:
        """Add the deltas' rows a fold made with `deltas=False` left out (`blocks`: the same ones)."""
        for block in blocks:
            if block[0] == DELTA:
                provs = block[1]
                for p, rows in block[2].items():
                    add_rows(self.timelines, p, provs, rows)

    def _starts(self, tls: dict[str, list[Any]]) -> None:
        """The relations a restatement kept with the start of the run covering their anchor (`restate`): rows
        below the anchor, none an end or expiring. Between that start and the anchor every point was inside the
        run, so a later link or void strictly between them leaves the run, and every read at or after the
        anchor, as it was."""
        for p, rows in tls.items():
            anchor = self.anchors.get(p)
            if anchor is None:
                continue
            below = [row for row in rows if row[0] < anchor]
            if p[0] != "r":
                if below:
                    self.fallbacks.add(p)
            elif below and all(len(row) == 3 for row in below):
                self.starts[p] = min(row[0] for row in below)

    def _void_anchors(self, anchors: dict[str, Micros]) -> None:
        """Timelines other than relations whose anchor, as restated, is no point deciding reads at it: a later
        cut keeps the earlier cut as its anchor (`restate`), whose winner may be a void by then. A read at or
        after the anchor then already falls below it, as after a void at the anchor (`_check`): any void below
        the anchor may reach past the rows kept, and without rows below the anchor nothing answers it."""
        for p, anchor in anchors.items():
            tl = self.timelines.get(p)
            if p[0] != "r" and (tl is None or tl.deciding_point(anchor) != anchor):
                self.voided[p] = (True, False)
                if p not in self.fallbacks:
                    self.dirty = True

    def _check(self, tls: dict[str, list[Any]]) -> None:
        """Whether rows of a delta after the restatement could make a restated cut inexact.

        A relation's row at or below its anchor: restated away, or may revive the run before; unless the
        restatement kept the start of the run covering the anchor and the row is a link or void after that
        start (inside the run: it stays one run from the same start). Another timeline's void at its anchor:
        a read may look below it; exact while the restatement kept the point deciding before the anchor and no
        void has landed below the anchor (which could be at that point)."""
        for p, rows in tls.items():
            anchor = self.anchors.get(p)
            if anchor is None:
                continue
            start = self.starts.get(p)
            for row in rows:
                if row[0] > anchor:
                    continue
                if p[0] == "r":
                    if not (start is not None and start < row[0]
                            and (len(row) == 3 or (is_void_value(row[3], row[2]) and row[4] is None))):
                        self.dirty = True
                elif len(row) > 3 and is_void_value(row[3], row[2]):
                    at, below = self.voided.get(p, (False, False))
                    at, below = at or row[0] == anchor, below or row[0] < anchor
                    self.voided[p] = (at, below)
                    if at and (below or p not in self.fallbacks):
                        self.dirty = True
                if self.dirty:
                    return

    def serves(self, t: Micros) -> bool:
        """Whether reads at `t`, believed now, are exact from this fold."""
        if self.dirty:
            return False
        return all(t >= a for a in self.anchors.values())

    def keys(self, owner: str) -> list[Key]:
        return [key_of(owner, p)[0] for p in self.timelines]


def restate(timelines: dict[str, Timeline], now: Micros, cuts: dict[str, Micros] | None = None) -> str:
    """A restatement block of an entity's timelines: a whole fold's, or a segment fold's that `serves` reads at
    `now` (`cuts`: its anchors, the timelines already cut). Each timeline is cut to what reads at times >= its
    anchor need, when it has one.

    The anchor is the greatest point <= now whose winner is no void: a read at t >= anchor stops at it or
    later, and the next points and corrections it looks at are all kept. Other than a relation, a timeline
    also keeps the points from the one deciding before the anchor (a void at the anchor falls to it:
    `Fold._check`). A relation also keeps the group of
    points where the run covering its anchor starts (the coalesced version's valid_from); a relation with an
    expiry is not cut (an expiry can break a run between the points dropped), or not further when it was."""
    cuts = cuts or {}
    provs: list[list[Any]] = []
    index: dict[tuple[Any, ...], int] = {}
    tls: dict[str, list[list[Any]]] = {}
    anchors: dict[str, Micros] = {}
    for p, tl in timelines.items():
        entries = tl.entries
        keep: Sequence[Assertion] = entries
        before = cuts.get(p)
        anchor = tl.deciding_point(now)
        if anchor is not None and not (p[0] == "r" and any(a.expires_at is not None for a in entries)):
            cut = bisect_left(entries, anchor, key=_point)
            keep = entries[cut:]
            if p[0] != "r":         # and the point deciding before the anchor: a void at the anchor falls to it
                before_anchor = tl.deciding_point(anchor - 1)     # (a cut timeline knows it at or above its cut)
                if before_anchor is not None and (before is None or before_anchor >= before):
                    keep = entries[bisect_left(entries, before_anchor, key=_point):]
            if p[0] == "r":
                run = covering(tl.runs(), anchor)
                if run is not None and run.assertion.point < anchor:
                    start = bisect_left(entries, run.assertion.point, key=_point)
                    end = start
                    while entries[end].point == run.assertion.point:
                        end += 1
                    keep = entries[start:end] + entries[cut:]
            if cut > 0 or before is not None:
                anchors[p] = anchor if before is None else max(anchor, before)
        elif before is not None:
            anchors[p] = before
        rows = []
        for a in keep:
            prov = (a.source, a.evidence, a.recorded_at, a.by)
            k = index.get(prov)
            if k is None:
                k = index[prov] = len(provs)
                provs.append([a.source, a.evidence, a.recorded_at] if a.by is None else list(prov))
            rows.append([a.point, k, a.value] if not a.closed and a.expires_at is None
                        else [a.point, k, a.value, a.closed, a.expires_at])
        tls[p] = rows
    return _encode([RESTATEMENT, provs, tls, anchors]) + "\n"


def delta_ranges(blocks: Iterable[list[Any]]) -> dict[str, tuple[Micros, Micros, bool]]:
    """Per timeline of a segment's deltas (restatements skipped): its least and greatest point and whether a
    row is an end or expires (a void is neither: it never breaks a relation's run); what the valid-time index
    keeps of a closed segment."""
    out: dict[str, tuple[Micros, Micros, bool]] = {}
    for block in blocks:
        if block[0] != DELTA:
            continue
        for p, rows in block[2].items():
            lo = min(row[0] for row in rows)
            hi = max(row[0] for row in rows)
            ends = any(map(breaks_runs, rows))
            got = out.get(p)
            out[p] = (lo, hi, ends) if got is None else (min(lo, got[0]), max(hi, got[1]), ends or got[2])
    return out


def breaks_runs(row: list[Any]) -> bool:
    """Whether a row is an end or expires (a void is neither: it never breaks a relation's run)."""
    return len(row) > 3 and ((row[3] and not is_void_value(row[3], row[2])) or row[4] is not None)


def recorded_range(blocks: Iterable[list[Any]]) -> tuple[Micros, Micros] | None:
    """The least and greatest recorded_at of a segment's deltas (restatements skipped), None without deltas: what
    the recorded-time index keeps of a closed segment, so that a read with known_at finds the segment standing
    for what was known then."""
    times = [prov[2] for block in blocks if block[0] == DELTA for prov in block[1]]
    return (min(times), max(times)) if times else None


def wanted_timelines(blocks: Iterable[list[Any]], wanted: Iterable[str],
                     stop: Callable[[str, list[Any]], bool] | None = None) -> dict[str, Timeline] | None:
    """The wanted timelines (those with rows) from the deltas among `blocks` (restatements skipped), in log
    order; None as soon as `stop(P, row)` holds for a row of one of them."""
    tls: dict[str, Timeline] = {}
    for provs, p, rows in wanted_rows(blocks, set(wanted)):
        if stop is not None and any(stop(p, row) for row in rows):
            return None
        add_rows(tls, p, provs, rows)
    return tls


def wanted_rows(blocks: Iterable[list[Any]], keep: Container[str]) -> Iterator[tuple[list[Any], str, list[Any]]]:
    """(the block's provenance entries, P, its rows) of each timeline in `keep`, in each delta among `blocks`
    (restatements skipped), in log order."""
    for block in blocks:
        if block[0] == DELTA:
            provs = block[1]
            for p, rows in block[2].items():
                if p in keep:
                    yield provs, p, rows


def add_rows(tls: dict[str, Timeline], p: str, provs: list[Any], rows: list[Any]) -> None:
    """Fold a block's rows of timeline P (with the block's provenance entries) into `tls`."""
    tl = tls.get(p)
    if tl is None:
        tl = tls[p] = Timeline()
    entries = tl.entries
    for a in _assertions(provs, rows):
        insert(entries, a)


def _looks_past(p: str, row: list[Any]) -> bool:
    """Whether a row can make a past read look beyond the segments the valid-time index chose: a void, or a
    relation's end or expiry."""
    return len(row) > 3 and ((p[0] == "r" and (row[3] or row[4] is not None)) or is_void_value(row[3], row[2]))


def past_timelines(segments: Iterable[list[list[Any]]], wanted: Iterable[str], at: Micros,
                   known_at: Micros | None) -> dict[str, Timeline] | None:
    """The wanted timelines from the deltas of some decoded segments (in log order: closed ones by number, then
    the open one), for a read at a past time `at` (believed at `known_at`) the valid-time index chose them for; None when a
    row among them is a void or a relation's end or expiry (such a read can look past the segments chosen: read
    every segment).

    Without voids, a read at `at` of a timeline other than a relation (`Timeline.as_of`) looks at two points
    only: the greatest point <= `at` with an assertion visible at `known_at` (whose winner decides) and the least
    one above it (the version's end); without ends, expiries and voids, a relation's links make one run, from
    its least point with a link visible at `known_at` on (`Timeline.runs`). Only those points' rows are folded:
    the others' assertions are never built."""
    found = list(wanted_rows((block for segment in segments for block in segment), set(wanted)))
    low: dict[str, Micros] = {}
    high: dict[str, Micros] = {}
    for provs, p, rows in found:
        relation = p[0] == "r"
        lo, hi = low.get(p), high.get(p)
        for row in rows:
            if len(row) > 3 and _looks_past(p, row):
                return None
            if known_at is not None and provs[row[1]][2] > known_at:
                continue
            point = row[0]
            if relation:
                if lo is None or point < lo:
                    lo = point
            elif point <= at:
                if lo is None or point > lo:
                    lo = point
            elif hi is None or point < hi:
                hi = point
        if lo is not None:
            low[p] = lo
        if hi is not None:
            high[p] = hi
    tls: dict[str, Timeline] = {}
    for provs, p, rows in found:
        lo, hi = low.get(p), high.get(p)
        kept = [row for row in rows if row[0] == lo or row[0] == hi]
        if kept:        # a timeline without rows reads as none (`entity_view` leaves out None versions)
            add_rows(tls, p, provs, kept)
    return tls
