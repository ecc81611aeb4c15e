"""The APPLY script's arguments for one commit step, and the members a bulk load writes.

Encoding is the worker's hot path (a thousand events a batch): one loop over the writes builds complete
sorted-set members and provenance entries, with process-wide caches of prefixes and points. The server
checks the guessed provenance length (`base`); when it was wrong, the step is encoded again.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any

from ...errors import StateBehind
from ..base import EventWrites, Key, Position
from .changelog import encode_references
from .codec import STR as _STR
from .codec import encode_body, encode_point, encode_provenance, json_text
from .keys import MARKS, RELATION_ENDS, ended_member, escape, offset_field, prefix_of


class PendingStep:
    """One tenant's apply step between tries: its events (repeated ids dropped), offset, the latest
    recorded_at of its writes, the partition's lag after it (the position's log end, when given) and the offset the
    writer saw the tenant hold (`held`, checked by the APPLY scripts: lua.STEP_HELD)."""
    __slots__ = ("batch", "events", "field", "held", "lag", "latest", "offset", "tenant")

    def __init__(self, tenant: str, events: Sequence[EventWrites], position: Position | None) -> None:
        self.tenant = tenant
        seen: set[str] = set()
        self.events: list[EventWrites] = []
        for writes, event_id in events:
            if event_id:
                if event_id in seen:
                    continue
                seen.add(event_id)
            self.events.append((writes, event_id))
        self.field, self.offset = ("", "0") if position is None else \
            (_offset_field(position[0], position[1]), str(int(position[2])))
        self.lag = "" if position is None or len(position) < 4 or position[3] is None else \
            str(max(0, int(position[3]) - int(position[2]) - 1))
        self.held: int | None = None if position is None or len(position) < 5 else position[4]   # type: ignore[misc]
        latest = max((max(map(_RECORDED, map(_ASSERTION, writes))) for writes, _ in self.events if writes),
                     default=None)
        self.latest = "" if latest is None else int.__repr__(int(latest))   # digits, whatever int subclass
        self.batch: ApplyBatch | None = None

    @property
    def offset_arg(self) -> str:
        """ARGV[4] of the APPLY scripts: the offset, and the held one when given (lua.STEP_HELD)."""
        return self.offset if self.held is None else f"{self.offset} {int(self.held)}"


def state_behind(p: PendingStep, stored: str) -> StateBehind:
    """The error of an APPLY answer {4, stored}: the tenant holds less of the partition than `p.held`."""
    topic, partition = json.loads(p.field[1:])
    return StateBehind(f"tenant {p.tenant!r} holds {topic} partition {partition} up to {stored or 'nothing'}, "
                       f"less than the {p.held} the writer saw: Redis lost acknowledged writes",
                       topic=topic, partition=int(partition), held=int(p.held or 0),
                       stored=int(stored) if stored else None, tenant=p.tenant)


class ApplyBatch:
    """One apply step encoded as the APPLY script's keys and arguments, for a guessed provenance length.

    Members are complete strings (`encode_events`): the provenance base `b` of each event is `base` plus the
    entries of the events before it. When the server answers that the guess was wrong, the batch is
    encoded again. What the script would otherwise work out per member or per timeline is done here, once:
    each entity's members come as one run, each timeline as its owner's index and P (a relation also with
    the element naming it in its object's index list), and marks as (id, mark) pairs.
    """
    __slots__ = ("args", "entities", "events")

    def __init__(self, events: list[EventWrites], base: int, field: str, offset: str, latest: str = "",
                 lag: str = "") -> None:
        self.events = events
        tls, provs, ends = encode_events(events, base)
        ents, min_recorded = step_entities(tls)
        self.entities = list(ents)
        members: dict[str, list[str]] = {}
        owned = dict.fromkeys(ents, 0)
        rows: list[Any] = []
        for key, t in tls.items():
            owner = key[1]
            owned[owner] += 1
            ms = members.get(owner)
            if ms is None:
                members[owner] = t[0]
            else:
                ms += t[0]
            if key[0] == "r" and key[3] != owner:
                rows += (-1 - ents[owner], ents[key[3]] + 1, t[2], f">{escape(owner)}|{t[2]}")
            else:
                rows += (ents[owner] + 1, t[2])
        ids = [event_id for _, event_id in events if event_id]
        marks = [x for event_id in ids if getattr(event_id, "mark", None) for x in (event_id, event_id.mark)]
        args: list[Any] = [str(base), field, offset, latest, lag, latest_of(ids), len(ids), *ids,
                           len(marks) // 2, *marks, len(provs), *provs, len(ents)]
        zadd: list[str] = []
        for name, rec in zip(ents, min_recorded):
            ms = members.get(name)
            if ms:
                zadd += ms
            args += (name, rec, len(ms) if ms else 0, owned[name])
        args.append(len(rows))
        args += rows
        args.append(len(ends))
        args += ends
        args += zadd
        args += encode_references(events, base)     # the change log's chunks (changelog.py), after the members
        self.args = args

    def keys(self, d: str) -> list[str]:
        keys = [d + "ev", d + "m", d + "ents", d + "pv"]
        for e in self.entities:
            e = escape(e)
            keys += (d + "z:" + e, d + "x:" + e)
        keys += (d + MARKS, d + RELATION_ENDS)
        return keys


def latest_of(ids: Sequence[Any]) -> str:
    """The latest recorded_at the ids carry (keel.store.base.EventId), as text; "" when none does."""
    times = [t for t in (getattr(event_id, "recorded_at", None) for event_id in ids) if t is not None]
    return str(max(times)) if times else ""


def encode_events(events: Sequence[EventWrites], base: int
                  ) -> tuple[dict[Key, list[Any]], list[str], list[str]]:
    """The members and provenance entries of one step, `base` being the provenance list's length before it:
    ({key: [members, min recorded_at, P]} in order of first write, entries, the relation timelines that
    get an end or an expiry, as members of the RELATION_ENDS set)."""
    tls: dict[Key, list[Any]] = {}      # key -> [members, min recorded_at, P]

    def timeline(key: Key, p: str, rec: int) -> Entry:
        t = tls[key] = [[], rec, p]
        return p, t, None

    provs, ends, _ = encode_writes(events, base, timeline)
    return tls, provs, ends


Entry = tuple[str, list[Any], "list[Any] | None"]     # P, then the [members, min recorded_at, ...] it feeds


def encode_writes(events: Sequence[EventWrites], base: int, timeline: Callable[[Key, str, int], Entry]
                  ) -> tuple[list[str], list[str], bool]:
    """Every member of one step, `base` being the provenance list's length before it, each appended where its
    timeline says: `timeline(key, P, recorded_at)`, called at the timeline's first write in the step, gives
    (P, a list `[members, min recorded_at, ...]` its members go to, a second list whose min recorded_at they
    also lower, or None). APPLY gives each timeline a list of its own (encode_events); a bulk load gives each
    entity one list (keel/store/redis/bulk.py). Returns the step's provenance entries, the relation timelines
    that get an end or an expiry (as members of the RELATION_ENDS set), and whether it has writes.

    Encoding is the worker's hot path: one loop over the writes, with process-wide caches of prefixes and
    points, and a shortcut for writes sharing their event's single provenance entry.
    """
    tls: dict[Key, Entry] = {}
    provs: list[str] = []
    points = _POINTS
    if len(points) > _CACHE:
        points.clear()
    wtext = _W
    n = sum(len(writes) for writes, _ in events)
    if len(wtext) <= n:
        _grow_w(n)
    w = 0
    ended: dict[Key, None] = {}      # relation timelines given an end or an expiry, in order
    for writes, _ in events:
        text = str(base + len(provs))
        bb = f"{len(text)}{text}"
        seen: dict[tuple[Any, ...], str] = {}
        ps = pe = pr = pb = pks = None      # the last provenance met: most events have a single one
        for key, a in writes:
            point, value, closed, source, evidence, rec, by, expires = a
            if source is ps and evidence is pe and rec == pr and by is pb:
                ks = pks
                rec = pr
            else:
                rec = int(rec)
                prov = (source, evidence, rec, by)
                ks = seen.get(prov)
                if ks is None:
                    n = len(seen)
                    ks = seen[prov] = f"1{n}" if n < 10 else f"{len(str(n))}{n}"
                    provs.append(encode_provenance(source, evidence, rec, by))
                ps, pe, pr, pb, pks = source, evidence, rec, by, ks
            pt = points.get(point)
            if pt is None:
                pt = points[point] = encode_point(point)
            if closed or expires is not None:
                body = encode_body(a)
                if key[0] == "r":
                    ended[key] = None
            else:
                tv = value.__class__
                if tv is str:
                    body = "=" + _STR(value)
                elif tv is int:
                    body = "=" + int.__repr__(value)
                elif value is True:
                    body = "=true"
                else:
                    body = "=" + json_text(value)
            w += 1
            t = tls.get(key)
            if t is None:
                # P does not name the owner; a key without parts after it is told apart by its length
                part = key[:1] + key[2:] if len(key) > 2 else f"{key[0]}{len(key)}"
                p = _PARTS.get(part)
                if p is None:
                    p = _prefix(part, key)
                t = tls[key] = timeline(key, p, rec)
            o = t[1]
            o[0].append(f"{t[0]}{pt}{bb}{wtext[w]}{ks}{body}")
            if rec < o[1]:   # noqa: PLR1730 - the common case is a comparison only
                o[1] = rec
            o = t[2]
            if o is not None and rec < o[1]:
                o[1] = rec
    return provs, [ended_member(key[1], tls[key][0]) for key in ended] if ended else [], bool(tls)


def step_entities(tls: dict[Key, list[Any]]) -> tuple[dict[str, int], list[int]]:
    """The entities of a step's timelines, owners and relation objects, in order of first appearance (their
    0-based indexes), with the minimum recorded_at of the writes involving each."""
    ents: dict[str, int] = {}
    min_recorded: list[int] = []
    for key, t in tls.items():
        rec = t[1]
        for name in (key[1], key[3]) if key[0] == "r" else (key[1],):
            i = ents.get(name)
            if i is None:
                ents[name] = len(ents)
                min_recorded.append(rec)
            elif rec < min_recorded[i]:
                min_recorded[i] = rec
    return ents, min_recorded


_CACHE = 100_000                  # entries of the process-wide encoding caches before they are cleared
_ASSERTION, _RECORDED = itemgetter(1), itemgetter(5)     # a write's assertion, an assertion's recorded_at
_FIELDS: dict[tuple[str, int], str] = {}     # (topic, partition) -> offset field of the meta hash
_POINTS: dict[Any, str] = {}      # point -> its 9 characters
_PARTS: dict[Any, str] = {}     # key without its owner ("e2" for an entity's own timeline) -> P
_W: list[str] = ["10"]            # w -> `<#w><w>`


def _grow_w(n: int) -> None:
    while len(_W) <= n:
        ws = str(len(_W))
        _W.append(f"{len(ws)}{ws}")


def _offset_field(topic: str, partition: int) -> str:
    field = _FIELDS.get((topic, partition))
    if field is None:
        if len(_FIELDS) > _CACHE:
            _FIELDS.clear()
        field = _FIELDS[(topic, partition)] = offset_field(topic, partition)
    return field


def _prefix(part: Any, key: Key) -> str:
    if len(_PARTS) > _CACHE:
        _PARTS.clear()
    p = _PARTS[part] = prefix_of(key)
    return p


def cached_prefix(key: Key) -> str:
    """P of a key, from the process-wide cache encode_writes fills inline (layout 2's writer uses it too)."""
    part = key[:1] + key[2:] if len(key) > 2 else f"{key[0]}{len(key)}"
    p = _PARTS.get(part)
    return _prefix(part, key) if p is None else p

