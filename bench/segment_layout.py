"""A batch-oriented Redis layout (issue 16), as a benchmark prototype: one segment APPEND per touched entity.

Measured against today's layout by bench/redis_layouts.py (its docstring lists what this prototype does not
do yet). Keys carry the tenant's hash tag `{<ns>/<t>}`, so each step is one script on one hash slot (legal on
Redis Cluster); `g1` stands for the generation prefix of today's layout:

    keel:{ns/t}:g1:ev / :eh / :m / :ents   as today: event ids, marks (content hash + origin), offsets and
                                           sv / rl / kt / lag, the entity index
    keel:{ns/t}:g1:sg            hash: entity -> `<open segment> <assertions in it> <its lowest point|-> <late>
                                 <first recorded_at>` (late = 1 once a segment's lowest point fell below the
                                 previous segment's)
    keel:{ns/t}:g1:h:<entity>    string, the current-state head (only once the entity has closed a segment: a
                                 smaller entity's one segment is read whole instead), msgpack `[provenance
                                 entries, {P: head row}]`: per timeline prefix P (keys.py) its latest assertion
                                 (greatest point, later log order on ties); a row is `[point, value, k]` or
                                 `[point, value, k, closed, expires_at]`, k indexing the provenance entries
                                 `[source, evidence, recorded_at(, by)]`
    keel:{ns/t}:g1:i:<entity>    list: the relations naming the entity as object, `>owner|P` (as today's
                                 index list: an element is pushed once, when the relation first appears)
    keel:{ns/t}:g1:d:<entity>    sorted set, the closed segments: member = number, score = lowest point
    keel:{ns/t}:g1:s:<entity>:<n>  string, segment n: a checkpoint (the head blob when the segment was opened,
                                 nil for segment 0), then one msgpack delta `[provenance entries, {P: [rows]}]`
                                 per step that touched the entity

The writer keeps each entity's head and segment state (a worker's mirror holds that state anyway): it computes
the new head and the delta, and the APPLY_SEGMENTS script only checks that no one moved the entity meanwhile
(the `sg` field equals the writer's guess) and that no event id is applied already, then APPENDs, SETs heads
and moves the ids, marks, offsets and counters, atomically. A wrong guess (another writer, a restart) is
answered with the current states; the writer reads those entities and encodes the step again.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack
import redis

from keel.store.base import BatchStep, EventWrites
from keel.store.redis.keys import escape, offset_field, prefix_of, unescape
from keel.store.redis.scripts import _APPLIED_IDS, _GEN_CHECK
from keel.store.redis.transport import eval_many, pipelined
from keel.times import now_micros

# KEYS: 1 gen, 2 ids (set), 3 marks (hash), 4 meta (hash), 5 entities (set), 6 segment states (hash), then per
#       entity e (1-based): 4e + 3 head, 4e + 4 closed-segment directory, 4e + 5 the segment to append to,
#       4e + 6 the list of relations naming it as object.
# ARGV: 1 expected gen, 2 offset field ("" = none), 3 offset, 4 latest recorded_at of the ids ("" = none),
#       5 latest recorded_at of the writes ("" = none), 6 lag ("" = unknown), 7 nI, ids, marks ("" = none); nE,
#       then per entity: name, expected state ("" = none yet), new state, new head ("" = unchanged), bytes to
#       append ("" = none), the closed segment's lowest point ("" = no roll), "1" when the entity is new, nX,
#       nX relation elements naming it as object, new since the writer's state.
# Answers {1}; {0, gen} when the generation moved; {3, ids...} when ids were applied already; {2, e, state, ...}
# when the writer's state guess was stale for entities e.
# The generation check and the applied-ids check are production's (scripts.py), shared.
APPLY_SEGMENTS = _GEN_CHECK + """
local nI = tonumber(ARGV[7])
local I = 8
""" + _APPLIED_IDS + """
local a = I + 2 * nI
local nE = tonumber(ARGV[a])
local pos, names = {}, {}
a = a + 1
for e = 1, nE do
  pos[e] = a
  names[e] = ARGV[a]
  a = a + 8 + tonumber(ARGV[a + 7])
end
if nE > 0 then
  local cur = redis.call('HMGET', KEYS[6], unpack(names))
  local stale = {2}
  for e = 1, nE do
    if (cur[e] or '') ~= ARGV[pos[e] + 1] then
      stale[#stale + 1] = e; stale[#stale + 1] = cur[e] or ''
    end
  end
  if #stale > 1 then return stale end
end
local heads, states, fresh = {}, {}, {}
for e = 1, nE do
  local b, k = pos[e], 4 * e
  if ARGV[b + 3] ~= '' then heads[#heads + 1] = KEYS[k + 3]; heads[#heads + 1] = ARGV[b + 3] end
  if ARGV[b + 4] ~= '' then redis.call('APPEND', KEYS[k + 5], ARGV[b + 4]) end
  if ARGV[b + 5] ~= '' then
    local n = tonumber(string.match(ARGV[b + 2], '^(%d+)'))
    redis.call('ZADD', KEYS[k + 4], ARGV[b + 5], n - 1)
  end
  if ARGV[b + 6] == '1' then fresh[#fresh + 1] = ARGV[b] end
  local nX = tonumber(ARGV[b + 7])
  if nX > 0 then redis.call('RPUSH', KEYS[k + 6], unpack(ARGV, b + 8, b + 7 + nX)) end
  states[#states + 1] = ARGV[b]; states[#states + 1] = ARGV[b + 2]
end
if #heads > 0 then redis.call('MSET', unpack(heads)) end
if #states > 0 then redis.call('HSET', KEYS[6], unpack(states)) end
if #fresh > 0 then redis.call('SADD', KEYS[5], unpack(fresh)) end
if nI > 0 then
  redis.call('SADD', KEYS[2], unpack(ARGV, I, I + nI - 1))
  local marks = {}
  for x = 0, nI - 1 do
    if ARGV[I + nI + x] ~= '' then
      marks[#marks + 1] = ARGV[I + x]; marks[#marks + 1] = ARGV[I + nI + x]
    end
  end
  if #marks > 0 then redis.call('HSET', KEYS[3], unpack(marks)) end
end
local m = redis.call('HMGET', KEYS[4], 'rl', 'kt', ARGV[2] ~= '' and ARGV[2] or 'sv', 'sv')
local set = {'sv', (tonumber(m[4]) or 0) + ((nI > 0 or nE > 0) and 1 or 0)}
if ARGV[4] ~= '' and (not m[1] or tonumber(ARGV[4]) > tonumber(m[1])) then set[#set + 1] = 'rl'; set[#set + 1] = ARGV[4] end
if ARGV[5] ~= '' and (not m[2] or tonumber(ARGV[5]) > tonumber(m[2])) then set[#set + 1] = 'kt'; set[#set + 1] = ARGV[5] end
if ARGV[2] ~= '' and (not m[3] or tonumber(ARGV[3]) > tonumber(m[3])) then
  set[#set + 1] = ARGV[2]; set[#set + 1] = ARGV[3]
  if ARGV[6] ~= '' then set[#set + 1] = 'lag'; set[#set + 1] = ARGV[6] end
end
redis.call('HSET', KEYS[4], unpack(set))
return {1}
"""

# KEYS: 1 segment states, 2 closed-segment directory. ARGV: 1 entity, 2 t (micros), 3 segment key prefix.
# The segment with the greatest lowest point <= t (the open one when its lowest point is, else from the
# directory) with its bytes and the late flag: {n, segment, late}, or {} when nothing is at or before t.
# (The segment key is built here: it carries the tenant's hash tag, so it is in the script's slot.)
READ_AT = """
local st = redis.call('HGET', KEYS[1], ARGV[1])
if not st then return {} end
local n, lo, late = string.match(st, '^(%d+) %d+ (%S+) (%d) ')
if lo == '-' then return {} end
if tonumber(lo) > tonumber(ARGV[2]) then
  local r = redis.call('ZREVRANGEBYSCORE', KEYS[2], ARGV[2], '-inf', 'LIMIT', 0, 1)
  if #r == 0 then return {} end
  n = r[1]
end
return {n, redis.call('GET', ARGV[3] .. n), late}
"""

END = 2 ** 62            # a time after every point: as_of(END) is the latest of each timeline
ALL = "eflr"             # every timeline kind
Row = tuple[int, Any, bool, Any, tuple[Any, ...]]      # point, value, closed, expires_at, provenance


class _State:
    """What the writer keeps of one entity: its segment state and its head."""
    __slots__ = ("count", "first", "head", "incoming", "late", "lo", "n", "prev_lo")

    def __init__(self) -> None:
        self.n = self.count = 0
        self.lo: int | None = None            # lowest point of the open segment
        self.prev_lo: int | None = None       # ... of the segment closed last
        self.late = 0
        self.first: int | None = None         # first recorded_at
        self.head: dict[str, Row] = {}
        self.incoming: set[str] = set()         # shared by copies: grown once a step is accepted

    def text(self) -> str:
        if self.first is None:
            return ""
        return f"{self.n} {self.count} {'-' if self.lo is None else self.lo} {self.late} {self.first}"

    def copy(self) -> _State:
        s = _State()
        s.n, s.count, s.lo, s.prev_lo, s.late, s.first = self.n, self.count, self.lo, self.prev_lo, self.late, self.first
        s.head, s.incoming = dict(self.head), self.incoming
        return s

    def blob(self) -> bytes:
        """The head as stored: provenance entries once, rows indexing them."""
        provs: list[list[Any]] = []
        pmap: dict[tuple[Any, ...], int] = {}
        rows = {}
        for p, (point, value, closed, expires, prov) in self.head.items():
            k = pmap.get(prov)
            if k is None:
                k = pmap[prov] = len(provs)
                provs.append(list(prov) if prov[3] is not None else list(prov[:3]))
            rows[p] = [point, value, k] if not closed and expires is None else [point, value, k, closed, expires]
        return msgpack.packb([provs, rows])


def _rows(provs: list[list[Any]], tls: dict[str, list[list[Any]]]) -> dict[str, list[tuple[Any, ...]]]:
    """Decoded rows of a delta or head: P -> [(point, value, closed, source, evidence, recorded_at, by, expires)]."""
    out = {}
    for p, rows in tls.items():
        dec = []
        for row in rows:
            pv = provs[row[2]]
            closed, expires = (row[3], row[4]) if len(row) > 3 else (False, None)
            dec.append((row[0], row[1], closed, pv[0], pv[1], pv[2], pv[3] if len(pv) > 3 else None, expires))
        out[p] = dec
    return out


def _unpack_head(blob: bytes) -> dict[str, tuple[Any, ...]]:
    provs, tls = msgpack.unpackb(blob, strict_map_key=False)
    return {p: rows[0] for p, rows in _rows(provs, {p: [r] for p, r in tls.items()}).items()}


class SegmentStore:
    """The prototype: commit_many and reads of the segment layout, bench only."""

    def __init__(self, client: redis.Redis, namespace: str, roll: int) -> None:
        self.client, self.namespace, self.roll = client, namespace, roll
        self._apply = client.register_script(APPLY_SEGMENTS)
        self._read_at = client.register_script(READ_AT)
        self._states: dict[tuple[str, str], _State] = {}
        self._prefixes: dict[Any, str] = {}

    def data(self, tenant: str) -> str:
        return f"keel:{{{self.namespace}/{tenant}}}:g1:"

    # ---- writes ---------------------------------------------------------------------------------

    def commit_many(self, steps: Sequence[BatchStep]) -> None:
        """Each step atomic on its own, all steps in one round trip (each encoded as it is sent). An entity this
        writer has not met is guessed new; when the script finds it is not, the step is refused whole, the
        entities' states are read and the step is encoded again (as today's store guesses provenance lengths)."""
        pending = [(t, _unique(ev), pos) for t, ev, pos in steps]
        for _ in range(8):
            moves: list[dict[tuple[str, str], tuple[_State, list[str]]]] = []
            calls = (self.encode_step(*step, moves=moves) for step in pending)
            results = eval_many(self.client, self._apply, calls if len(pending) > 1 else list(calls))
            left = []
            for step, result, move in zip(pending, results, moves):
                code = int(result[0])
                if code == 1:
                    for k, (state, added) in move.items():
                        state.incoming.update(added)
                        self._states[k] = state
                    continue
                tenant, events, pos = step
                if code == 3:
                    applied = {x.decode() for x in result[1:]}
                    left.append((tenant, [e for e in events if e[1] not in applied], pos))
                elif code == 2:
                    names = list(_entities(events))
                    stale = [(tenant, names[int(result[i]) - 1]) for i in range(1, len(result), 2)]
                    for k in stale:
                        self._states.pop(k, None)
                    self.load(stale)
                    left.append(step)
                else:
                    raise RuntimeError(f"generation moved: {result!r}")
            if not left:
                return
            pending = left
        raise RuntimeError("steps kept conflicting")

    def load(self, pairs: list[tuple[str, str]]) -> None:
        """Read the state and head of (tenant, entity) pairs this writer does not hold, in one round trip."""
        missing = sorted({k for k in pairs if k not in self._states})
        if not missing:
            return
        calls: list[tuple[Any, ...]] = []
        for t, e in missing:
            d = self.data(t)
            calls += (("HGET", d + "sg", e), ("GET", d + "h:" + escape(e)), ("LRANGE", d + "i:" + escape(e), 0, -1))
        got = pipelined(self.client, calls)
        for i, k in enumerate(missing):
            s = self._states[k] = _State()
            text, blob, incoming = got[3 * i:3 * i + 3]
            s.incoming = {x.decode() for x in incoming}
            if not text:
                continue
            n, count, lo, late, first = text.decode().split()
            s.n, s.count, s.lo, s.late, s.first = int(n), int(count), None if lo == "-" else int(lo), int(late), \
                int(first)
            if s.n > 0:
                prev = self.client.zscore(self.data(k[0]) + "d:" + escape(k[1]), s.n - 1)
                s.prev_lo = None if prev is None else int(prev)
            heads = _unpack_head(blob) if blob else \
                self.as_of(k[0], k[1], END, ALL) if s.lo is not None else {}    # small: its one segment
            for p, (point, value, closed, src, evid, rec, by, exp) in heads.items():
                s.head[p] = (point, value, closed, exp, (src, evid, rec, by))

    def encode_step(self, tenant: str, events: Sequence[EventWrites], position: Any,
                    moves: list[dict[tuple[str, str], tuple[_State, list[str]]]] | None = None
                    ) -> tuple[list[str], list[Any]]:
        """The APPLY_SEGMENTS keys and arguments of one tenant step; the states the entities will have once it
        is applied go to `moves` (kept by the caller when the script accepted the step)."""
        d = self.data(tenant)
        # entity -> its share of the step (_entry)
        ents: dict[str, list[Any]] = {}
        states = self._states
        prefixes = self._prefixes
        latest = None
        ps = pe = pr = pb = prov = None     # the last provenance met: an event's writes mostly share one
        for writes, _ in events:
            for key, a in writes:
                owner = key[1]
                point, value, closed, source, evidence, rec, by, expires = a
                e = ents.get(owner)
                if e is None:
                    e = ents[owner] = _entry(states.get((tenant, owner)), point)
                s = e[0]
                if s.first is None or rec < s.first:
                    s.first = rec
                if not (source is ps and evidence is pe and rec == pr and by is pb):
                    ps, pe, pr, pb = source, evidence, rec, by
                    prov = (source, evidence, rec, by)
                    if latest is None or rec > latest:
                        latest = rec
                tls = e[3]
                if tls is None:             # the entity's first write of the step (not only a relation object)
                    tls = e[3] = {}
                    e[1], e[2], e[4] = [], {}, point
                k = e[2].get(prov)
                if k is None:
                    k = e[2][prov] = len(e[1])
                    e[1].append([source, evidence, rec] if by is None else [source, evidence, rec, by])
                p = prefixes.get(key)
                if p is None:
                    p = prefixes[key] = prefix_of(key)
                row = [point, value, k] if not closed and expires is None else [point, value, k, closed, expires]
                rows = tls.get(p)
                if rows is None:
                    tls[p] = [row]
                else:
                    rows.append(row)
                e[5] += 1
                if point < e[4]:  # noqa: PLR1730 - the common case is a comparison only
                    e[4] = point
                head = s.head
                h = head.get(p)
                if h is None or point >= h[0]:
                    head[p] = (point, value, closed, expires, prov)
                if key[0] == "r" and key[3] != owner:
                    obj = key[3]
                    o = ents.get(obj)
                    if o is None:
                        o = ents[obj] = _entry(states.get((tenant, obj)), point)
                    so = o[0]
                    if so.first is None or rec < so.first:
                        so.first = rec
                    el = f">{escape(owner)}|{p}"
                    if el not in so.incoming:
                        if o[6] is None:
                            o[6] = [el]
                        elif el not in o[6]:
                            o[6].append(el)
        ids = [eid for _, eid in events if eid]
        field, offset, lag = ("", "0", "") if position is None else \
            (offset_field(position[0], position[1]), str(int(position[2])),
             "" if len(position) < 4 or position[3] is None else str(max(0, position[3] - position[2] - 1)))
        recs = [r for r in (getattr(i, "recorded_at", None) for i in ids) if r is not None]
        keys = [f"keel:{{{self.namespace}/{tenant}}}:gen", d + "ev", d + "eh", d + "m", d + "ents", d + "sg"]
        args: list[Any] = ["1", field, offset, str(max(recs)) if recs else "", "" if latest is None else str(latest),
                           lag, len(ids), *ids, *(getattr(i, "mark", None) or "" for i in ids), len(ents)]
        move: dict[tuple[str, str], tuple[_State, list[str]]] = {}
        if moves is not None:
            moves.append(move)
        packb = msgpack.packb
        for name, (s, provs, _, tls, lo, size, more) in ents.items():
            old = states.get((tenant, name))
            expected = "" if old is None else old.text()
            en = escape(name)
            append, closed_lo, head = b"", "", b""
            if tls is not None:
                blob = packb([provs, tls])
                if s.lo is None:                          # the entity's first segment
                    append, s.lo, s.count = b"\xc0" + blob, lo, size
                elif s.count >= self.roll:                # close the open segment: the new one starts with the head
                    closed_lo, s.prev_lo = str(s.lo), s.lo
                    append = (old.blob() if old is not None else b"\xc0") + blob
                    s.n, s.lo, s.count = s.n + 1, lo, size
                else:
                    append = blob
                    s.lo = min(s.lo, lo)
                    s.count += size
                if s.prev_lo is not None and s.lo < s.prev_lo:
                    s.late = 1
                if s.n > 0:                               # a single segment is its own head (read whole)
                    head = s.blob()
            more = more or []
            keys += (d + "h:" + en, d + "d:" + en, f"{d}s:{en}:{s.n}", d + "i:" + en)
            args += (name, expected, s.text(), head, append, closed_lo, "1" if old is None or old.first is None else "",
                     len(more), *more)
            move[(tenant, name)] = (s, more)
        return keys, args

    # ---- reads ----------------------------------------------------------------------------------

    def current(self, tenant: str, entity: str, parts: str = "lfr") -> dict[str, tuple[Any, ...]]:
        """The head: per timeline P (of the kinds in `parts`, relations naming the entity included) its latest
        assertion as (point, value, closed, source, evidence, recorded_at, by, expires_at); `as_of(now)` when a
        head lies in the future (a later valid time) or is an end carrying a value (a void)."""
        d = self.data(tenant)
        en = escape(entity)
        blob, incoming = pipelined(self.client, [("GET", d + "h:" + en), ("LRANGE", d + "i:" + en, 0, -1)])
        now = now_micros()
        out = {p: a for p, a in _unpack_head(blob).items() if p[0] in parts} if blob is not None else None
        if out is None or any(a[0] > now or (a[2] and a[1] is not None) for a in out.values()):
            out = self.as_of(tenant, entity, now, parts)
        if incoming and "r" in parts:
            elements = [x.decode() for x in incoming]
            owners = [el[1:el.index("|")] for el in elements]
            for el, owner, ob in zip(elements, owners, self.client.mget([d + "h:" + o for o in owners])):
                p = el[el.index("|") + 1:]
                a = (_unpack_head(ob) if ob is not None else self.as_of(tenant, unescape(owner), now, "r")).get(p)
                if a is not None:
                    out[el] = a
        return out

    def as_of(self, tenant: str, entity: str, t: int, parts: str = "lf") -> dict[str, tuple[Any, ...]]:
        """The winner at t of each timeline of the entity (of the kinds in `parts`), as in `current`. Reads the
        segment with the greatest lowest point <= t, and the ones before it only for timelines whose checkpoint
        entry lies after t."""
        d = self.data(tenant)
        en = escape(entity)
        found = self._read_at(keys=[d + "sg", d + "d:" + en], args=[entity, t, f"{d}s:{en}:"])
        if not found:
            return {}
        if found[2] == b"1":
            raise NotImplementedError("late data in this entity: the bounded as-of path does not hold (docstring)")
        n, blob = int(found[0]), found[1]
        best: dict[str, tuple[Any, ...]] = {}
        rank: dict[str, tuple[int, int, int]] = {}       # P -> (point, segment, position): the greatest wins
        todo: set[str] | None = None
        while True:
            unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
            unpacker.feed(blob)
            checkpoint = next(unpacker)
            unresolved = set()
            if checkpoint is not None:
                provs, tls = checkpoint
                for p, (a,) in _rows(provs, {p: [r] for p, r in tls.items()
                                             if p[0] in parts and (todo is None or p in todo)}).items():
                    r = (a[0], n, 0)
                    if a[0] > t:
                        unresolved.add(p)     # the segments before hold a later point: look there too
                    elif p not in rank or r > rank[p]:
                        rank[p], best[p] = r, a
            i = 0
            for provs, tls in unpacker:
                wanted = {p: rows for p, rows in tls.items() if p[0] in parts and (todo is None or p in todo)}
                for p, rows in _rows(provs, wanted).items():
                    for a in rows:
                        i += 1
                        r = (a[0], n, i)
                        if a[0] <= t and (p not in rank or r > rank[p]):
                            rank[p], best[p] = r, a
            if not unresolved or n == 0:
                return best
            todo, n = unresolved, n - 1
            blob = self.client.get(f"{d}s:{en}:{n}")


def _entry(old: _State | None, point: int) -> list[Any]:
    """An entity's share of a step being encoded: [its new state (a copy of what the writer holds), provenance
    entries, {prov: k}, {P: rows} (None while it is only a relation's object), lowest point, rows, relation
    elements added]."""
    return [old.copy() if old is not None else _State(), None, None, None, point, 0, None]


def _unique(events: Sequence[EventWrites]) -> list[EventWrites]:
    """A step's events, an id repeated within the step dropped (as today's PendingStep does)."""
    seen: set[str] = set()
    out = []
    for writes, eid in events:
        if eid:
            if eid in seen:
                continue
            seen.add(eid)
        out.append((writes, eid))
    return out


def _entities(events: Sequence[EventWrites]) -> dict[str, None]:
    """Entities of a step in the order encode_step lists them (owners and relation objects as met)."""
    names: dict[str, None] = {}
    for writes, _ in events:
        for key, _a in writes:
            names[key[1]] = None
            if key[0] == "r" and key[3] != key[1]:
                names[key[3]] = None
    return names
