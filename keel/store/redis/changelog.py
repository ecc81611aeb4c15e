"""A tenant's change log in Redis (Store.changes), the same in both key layouts.

Per generation `d` (keys.py's data prefix):

    d ch      list: one element per write applied, in apply order, `<recorded_at>|<JSON>` with the JSON
              `[key, point, value, closed, source, evidence, by, expires_at]`

The writer encodes the elements of a step (`encode_changes`) and each layout's APPLY script appends them to
the list in the same atomic step as the writes (layout 1: scripts.APPLY; layout 2: segment_scripts.APPLY; a
layout-1 bulk load: loader.py). The list belongs to the generation, so a replay rebuilds it with the graph, and
dropping the generation drops it. Positions in the list are the log's order; a tenant's recorded_at never goes
backwards in its log (keel.envelope clamps it), so the first position recorded after a time is found by
bisection. A page (the CHANGES script) reads at most its own entries: LRANGE of a run, never a scan of entities.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, cast

from ...timeline import Assertion
from ...times import Micros
from ..base import ChangeEntry, ChangePage, EventWrites, Key, Store, Window
from .codec import ProvenanceCache, decode_point, encode_point, json_text
from .keys import escape, prefix_of
from .scripts import _GEN_CHECK, _NOTES, _PROV_OF, _WINNER

CHANGES = "ch"              # the change log's key, after the generation's data prefix
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_encode = _JSON.encode
_digits = int.__repr__      # a time's digits, whatever int subclass carries it (keel.envelope.Instant prints RFC 3339)
_KEYS: dict[Any, str] = {}  # timeline key -> its JSON (encode_changes)
_CACHE = 100_000

# KEYS: 1 gen, 2 the change log (list), 3 the meta hash.
# ARGV: 1 expected gen, 2 the position to start from ("" = from `since`), 3 since, recorded_at in micros ("" =
#       from the first entry), 4 how many entries at most.
# Answers {1, start, length of the log, entries from start, the tenant's known_through `kt` or ""}: the page,
# the log's length and known_through are read in one atomic step.
READ = _GEN_CHECK + """
local n = redis.call('LLEN', KEYS[2])
local start = 0
if ARGV[2] ~= '' then
  start = tonumber(ARGV[2])
elseif ARGV[3] ~= '' then
  local since, lo, hi = tonumber(ARGV[3]), 0, n
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if tonumber(string.match(redis.call('LINDEX', KEYS[2], mid), '^(-?%d+)')) > since then hi = mid else lo = mid + 1 end
  end
  start = lo
end
local page = {}
if start < n then page = redis.call('LRANGE', KEYS[2], start, start + tonumber(ARGV[4]) - 1) end
return {1, start, n, page, redis.call('HGET', KEYS[3], 'kt') or ''}
"""

# Layout 1: a window of each asked timeline around a point (Store.windows_many): every member at the point, the
# last ARGV[2] members (by log order) of the point before it, whether anything below those was left out, and the
# first point after the point whose winner now is no void (`winner_at`'s next point), with the provenance
# entries of the members returned.
# KEYS: 1 gen, 2 provenance. ARGV: 1 expected gen, 2 how many members of the point before, 3 the prefix of
# sorted-set names ("<data prefix>z:"), then per timeline: its owner (escaped), P, the point (point9).
# Answers {1, {members before (ascending), members at, "1" when some below were left out else "0", next point9
# or "", ...}, {index, entry, ...}}, members without P.
WINDOW = _GEN_CHECK + _PROV_OF + _WINNER + _NOTES + """
local M, zs, out = tonumber(ARGV[2]), ARGV[3], {}
local function strip(ms, P)
  for x, m in ipairs(ms) do note(m, #P + 10); ms[x] = string.sub(m, #P + 1) end
  return ms
end
for i = 4, #ARGV, 3 do
  local z, P, pt = zs .. ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local below, more = {}, '0'
  local prev = redis.call('ZREVRANGEBYLEX', z, '(' .. P .. pt, '[' .. P, 'LIMIT', 0, 1)[1]
  if prev then
    local p1 = string.sub(prev, #P + 1, #P + 9)
    local last = redis.call('ZREVRANGEBYLEX', z, '(' .. P .. p1 .. '~', '[' .. P, 'LIMIT', 0, M + 1)
    if #last > M or string.sub(last[#last], #P + 1, #P + 9) ~= p1 then
      more = '1'
      last[#last] = nil
      while last[#last] and string.sub(last[#last], #P + 1, #P + 9) ~= p1 do last[#last] = nil end
    end
    for x = #last, 1, -1 do below[#below + 1] = last[x] end
  end
  local lo, nx = '(' .. P .. pt .. '~', ''
  while true do
    local f = redis.call('ZRANGEBYLEX', z, lo, '(' .. P .. '~', 'LIMIT', 0, 1)
    if not f[1] then break end
    local p2 = string.sub(f[1], #P + 1, #P + 9)
    lo = '(' .. P .. p2 .. '~'
    if not void_at(redis.call('ZREVRANGEBYLEX', z, lo, '[' .. P .. p2, 'LIMIT', 0, 1)[1], P) then
      nx = p2
      break
    end
  end
  out[#out + 1] = strip(below, P)
  out[#out + 1] = strip(redis.call('ZRANGEBYLEX', z, '[' .. P .. pt, '(' .. P .. pt .. '~'), P)
  out[#out + 1] = more
  out[#out + 1] = nx
end
return {1, out, provs}
"""


def encode_changes(events: Sequence[EventWrites]) -> list[str]:
    """The change-log elements of a step's writes, in write order (the writer's hot path: a key's JSON is cached
    process-wide, an event's provenance is encoded once)."""
    out: list[str] = []
    keys = _KEYS
    if len(keys) > _CACHE:
        keys.clear()
    for writes, _ in events:
        last: tuple[Any, ...] | None = None
        head = tail = ""        # `<recorded_at>|`, and the provenance fields of the JSON
        for key, a in writes:
            point, value, closed, source, evidence, rec, by, expires = a
            kt = keys.get(key)
            if kt is None:
                kt = keys[key] = _encode(list(key))
            prov = (source, evidence, rec, by)
            if prov != last:
                last = prov
                head = f"{_digits(rec)}|["
                tail = f",{json_text(source)},{json_text(evidence)},{json_text(by)},"
            out.append(f"{head}{kt},{_digits(point)},{json_text(value)},{1 if closed else 0}{tail}"
                       f"{'null' if expires is None else _digits(expires)}]")
    return out


def decode_change(position: int, element: str) -> ChangeEntry:
    """An element back as (position, key, assertion)."""
    rec, _, body = element.partition("|")
    key, point, value, closed, source, evidence, by, expires = json.loads(body)
    return ChangeEntry(position, tuple(key), Assertion(point, value, bool(closed), source, evidence, int(rec), by,
                                                       expires))


Build = Callable[[str], tuple[list[str], list[Any]]]


class ChangeLogReads:
    """`Store.changes` for both Redis layouts (a mixin of RedisStore: its script runner and generations)."""

    _changes_script: Any = None
    _window_script: Any = None
    layout: int
    client: Any                 # RedisStore's
    _script_many: Callable[[Any, Sequence[tuple[str, Build]]], list[list[Any]]]     # RedisStore's

    def changes(self, tenant: str, *, start: int | None = None, since: Micros | None = None,
                generation: int | None = None, count: int) -> ChangePage:
        if self._changes_script is None:
            self._changes_script = self.client.register_script(READ)
        read: dict[str, int] = {}

        def build(d: str) -> tuple[list[str], list[Any]]:
            gen = read["gen"] = int(d.rstrip(":").rpartition(":g")[2])
            from_start = start is not None and generation == gen
            return ([d + CHANGES, d + "m"],
                    ["" if not from_start else str(start), "" if from_start or since is None else str(since),
                     str(int(count))])

        [result] = self._script_many(self._changes_script, [(tenant, build)])
        first, length, elements, kt = int(result[1]), int(result[2]), result[3], result[4]
        entries = [decode_change(first + i, e) for i, e in enumerate(elements)]
        return ChangePage(read["gen"], first, entries, length, int(kt) if kt else None)

    def windows_many(self, tenant: str, items: list[tuple[Key, Micros]], size: int) -> list[Window]:
        """Layout 1 reads, for each (key, point), the members at the point, the last `size` of the point before
        it, and the next point (the WINDOW script); layout 2, whose timelines live in segments, reads whole
        timelines (Store's default)."""
        if self.layout != 1 or not items:
            return Store.windows_many(cast(Store, self), tenant, items, size)
        if self._window_script is None:
            self._window_script = self.client.register_script(WINDOW)
        unique = list(dict.fromkeys(items))
        triples = [x for key, point in unique for x in (escape(key[1]), prefix_of(key), encode_point(point))]
        [result] = self._script_many(self._window_script,
                                     [(tenant, lambda d: ([d + "pv"], [str(size), d + "z:", *triples]))])
        prov = ProvenanceCache()
        pairs = result[2]
        for i in range(0, len(pairs), 2):
            prov.add(pairs[i], pairs[i + 1])
        found: dict[tuple[Key, Micros], Window] = {}
        lists = result[1]
        for i, item in enumerate(unique):
            below, at, more, nx = lists[4 * i:4 * i + 4]
            assertions = [prov.assertion(m) for m in [*below, *at]]
            found[item] = Window(assertions, assertions[0].point if more == "1" else None,
                                 decode_point(nx) if nx else None, False)
        return [found[item] for item in items]
