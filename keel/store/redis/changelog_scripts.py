"""The Lua scripts that read a tenant's change log in Redis (changelog.py's ChangeLogReads sends them): a page of
the log with the tenant's known_through in one atomic step (READ), and the timelines around each change, layout 1
by its member references (AROUND) and layout 2 from segments (WINDOW). The log's format is changelog.py's."""
from __future__ import annotations

from .lua import GEN_CHECK
from .scripts import _NOTES, _PROV_OF, _WINNER

# KEYS: 1 gen, 2 the change log (list), 3 the meta hash.
# ARGV: 1 expected gen, 2 the position to start from ("" = from `since`), 3 since, recorded_at in micros ("" =
#       from the first entry), 4 how many entries at most.
# Answers {1, position of the first chunk's first write, the log's length in writes, the chunks holding the
# entries from the start on (at least `count` of them, or to the log's end), the tenant's known_through `kt` or
# ""}: the page, the log's length and known_through read in one atomic step. From `since`, the first chunk is
# the last one whose first write was recorded at or before it: the reader skips the writes recorded at or before
# `since`, so the chunks after it hold `count` more. {5} when a chunk read is not in this format (an earlier
# build's log). Layout 2's mover (keel/store/redis/cold.py) trims the oldest chunks to the cold tier, so the
# list may start at a position h0 > 0: when the page starts below it (`start` < h0; from `since` when the first
# chunk held was recorded after it; from the log's start), {7, h0, the log's length, the chunks from the list's
# head holding the page's writes that follow h0 (up to `count` of them), kt}: the reader puts the cold tier's
# chunks before them.
READ = GEN_CHECK + """
local n = redis.call('LLEN', KEYS[2])
local kt = redis.call('HGET', KEYS[3], 'kt') or ''
if n == 0 then return {1, 0, 0, {}, kt} end
local function head(i)
  local e = redis.call('LINDEX', KEYS[2], i)
  local p, c, r = string.match(e, '^c(%d+)|(%d+)|(-?%d+)|')
  if not p then return nil end
  return tonumber(p), tonumber(c), tonumber(r), e
end
if not head(0) then return {5} end
local lp, lc = head(n - 1)
if not lp then return {5} end
local total = lp + lc
local first, start, since = 0, tonumber(ARGV[2]), tonumber(ARGV[3])
local covered, counts = 0, true     -- counts: every write of the first chunk is an entry
local h0, _, r0 = head(0)
if h0 > 0 and ((start and start < h0) or (not start and (not since or r0 > since))) then
  local need, chunks, i = tonumber(ARGV[4]), {}, 0      -- the page starts in the cold tier (layout 2)
  if start then need = need - (h0 - start) end
  while i < n and covered < need do
    local p, c, r, e = head(i)
    if not p then return {5} end
    chunks[#chunks + 1] = e
    covered = covered + c
    i = i + 1
  end
  return {7, h0, total, chunks, kt}
end
if start then
  if start >= total then return {1, start, total, {}, kt} end
  local lo, hi = 0, n - 1           -- the last chunk whose first position is <= start
  while lo < hi do
    local mid = math.floor((lo + hi + 1) / 2)
    local p = head(mid)
    if not p then return {5} end
    if p <= start then lo = mid else hi = mid - 1 end
  end
  first = lo
elseif since then
  local lo, hi = 0, n               -- the first chunk whose first write was recorded after since, less one
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local p, c, r = head(mid)
    if not p then return {5} end
    if r > since then hi = mid else lo = mid + 1 end
  end
  if lo > 0 then first, counts = lo - 1, false end
end
local chunks, want, p0 = {}, tonumber(ARGV[4]), nil
local i = first
while i < n do
  local p, c, r, e = head(i)
  if not p then return {5} end
  chunks[#chunks + 1] = e
  if not p0 then
    p0 = p
    if start then covered = p + c - start elseif counts then covered = c end
  else
    covered = covered + c
  end
  if covered >= want then break end
  i = i + 1
end
return {1, p0, total, chunks, kt}
"""

# Layout 1: each change's own member, and for those asked, its window (Store.Window): the last member before it
# at its point (log order); when that does not decide what held before (there is none, or it is a void) or the
# change is a void, the last members of the point before, from the last one (log order) back to the first one
# recorded before the change (at most ARGV[2]: keel.changes looks at those only), and whether anything at or
# below them was left out; and the first point after its point whose winner now is no void (`winner_at`'s next
# point). With the provenance entries of every member returned.
# KEYS: 1 gen, 2 provenance. ARGV: 1 expected gen, 2 how many members of the point before at most, 3 the prefix
# of sorted-set names ("<data prefix>z:"), then per change: its owner (escaped), P, its point (point9),
# `<#b><b><#w><w>` of its member, "1" for its window.
# Answers {1, {member, [last before or "", {members before (ascending)}, "1" when some at or below them were
# left out else "0", next point9 or ""], ...}, {index, entry, ...}}: the change's member without `<P><point9><#b>
# <b><#w><w>` (what the caller sent), the last one before it without `<P><point9>`, those before without P; {6,
# owner} when a member or provenance entry is missing (a generation dropped while read).
AROUND = GEN_CHECK + _PROV_OF + _WINNER + """
local M, zs, out = tonumber(ARGV[2]), ARGV[3], {}
local provs, got = {}, {}
local function entry(m, P)          -- the provenance entry of a member, added to the answer once
  local n = prov_of(m, #P + 10)
  local e = got[n]
  if not e then
    e = redis.call('LINDEX', KEYS[2], n)
    if not e then return nil end
    got[n] = e
    provs[#provs + 1] = n
    provs[#provs + 1] = e
  end
  return e
end
for i = 4, #ARGV, 5 do
  local z, P, at, bw = zs .. ARGV[i], ARGV[i + 1], ARGV[i + 1] .. ARGV[i + 2], ARGV[i + 3]
  local two = redis.call('ZREVRANGEBYLEX', z, '(' .. at .. bw .. '~', '[' .. at, 'LIMIT', 0, 2)
  local me, last = two[1], two[2]
  if not me or string.sub(me, 1, #at + #bw) ~= at .. bw then return {6, ARGV[i]} end
  local e = entry(me, P)
  if not e then return {6, ARGV[i]} end
  out[#out + 1] = string.sub(me, #at + #bw + 1)
  if ARGV[i + 4] == '1' then
    local below, more = {}, '0'
    if last and not entry(last, P) then return {6, ARGV[i]} end
    if not last or void_at(last, P) or void_at(me, P) then
      local rec = cjson.decode(e)[3]
      local l = redis.call('ZREVRANGEBYLEX', z, '(' .. at, '[' .. P, 'LIMIT', 0, M + 1)
      local p1, kept = l[1] and string.sub(l[1], #P + 1, #P + 9), 0
      for x = 1, #l do
        if x > M or string.sub(l[x], #P + 1, #P + 9) ~= p1 then more = '1'; break end
        local pe = entry(l[x], P)
        if not pe then return {6, ARGV[i]} end
        kept = x
        if cjson.decode(pe)[3] < rec then
          if x < #l then more = '1' end
          break
        end
      end
      for x = kept, 1, -1 do below[#below + 1] = string.sub(l[x], #P + 1) end
    end
    local lo, nx = '(' .. at .. '~', ''
    while true do                   -- a point's winner is its last member: the first one when it is alone
      local f = redis.call('ZRANGEBYLEX', z, lo, '(' .. P .. '~', 'LIMIT', 0, 2)
      if not f[1] then break end
      local p2, w2 = string.sub(f[1], #P + 1, #P + 9), f[1]
      lo = '(' .. P .. p2 .. '~'
      if f[2] and string.sub(f[2], #P + 1, #P + 9) == p2 then
        w2 = redis.call('ZREVRANGEBYLEX', z, lo, '[' .. P .. p2, 'LIMIT', 0, 1)[1]
      end
      if not void_at(w2, P) then
        nx = p2
        break
      end
    end
    out[#out + 1] = last and string.sub(last, #at + 1) or ''
    out[#out + 1] = below
    out[#out + 1] = more
    out[#out + 1] = nx
  end
end
return {1, out, provs}
"""

# Layout 1, for callers that name a change by (key, point) only (Store.windows_many): every member at the point,
# the last ARGV[2] members (by log order) of the point before it, whether anything below those was left out, and
# the first point after the point whose winner now is no void, with the provenance entries of the members.
# KEYS: 1 gen, 2 provenance. ARGV: 1 expected gen, 2 how many members of the point before, 3 the prefix of
# sorted-set names ("<data prefix>z:"), then per timeline: its owner (escaped), P, the point (point9).
# Answers {1, {members before (ascending), members at, "1" when some below were left out else "0", next point9
# or "", ...}, {index, entry, ...}}, members without P.
WINDOW = GEN_CHECK + _PROV_OF + _WINNER + _NOTES + """
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
