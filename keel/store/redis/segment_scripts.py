"""Lua scripts of the Redis store (segments.py): commit a step, close a segment, read an entity now or whole.

Each takes, as ARGV[1], the generation its key names were computed for, and answers `{0, <current generation>}`
without doing anything when the tenant switched meanwhile (lua.GEN_CHECK). Keys not
in KEYS (closed segments, the segments of a relation's subject) are built from the data prefix: they carry the
tenant's hash tag, so they are in the script's hash slot.

Per generation `d` (keys.py's prefix, where keys.GenerationKeys builds these names in Python) the store keeps
`m`, `ch`, the event ids' buckets `e:<b>` (lua.STEP_IDS) and the keys below (the fixed keys, present
exactly when it holds data, are keys.DATA_KEYS):
    d fr               hash: entity -> the least recorded_at of the writes involving it (its first); its fields
                       are the generation's entities (its explicit index)
    d sg               hash: escaped entity -> how many of its segments are closed
    d s:<e>            string: the entity's open segment (segments.py)
    d s:<e>|<n>        string: its closed segment n (0-based; `|` never occurs in an escaped name)
    d v:<e>            sorted set (scores 0, by member): the valid-time index of its closed segments' deltas,
                       `<P><least point9><greatest point9><n>` per timeline and segment, the flags `<P>!`
                       (ranges overlap) and `<P>#` (an end or an expiry), and `<P>%<micros>`, an upper bound
                       of its widest range (ROLL): what a read at a past time looks up
    d k:<e>            sorted set: the recorded-time index of its closed segments, member n (9 digits) scored by
                       the greatest recorded_at of its deltas, and `!` (score -1) once a segment holds a write
                       recorded before one of an earlier segment: what a read with known_at looks up
    d i:<e>            set: `>` + escaped subject + `|` + P of each relation naming the entity as object
    d cz               hash: `<e>|<n>` -> SHA-1 of each closed segment moved to the cold tier (cold.py; its key
                       `s:<e>|<n>` is gone from Redis, its body is in PostgreSQL)
"""
from __future__ import annotations

from .lua import GEN_CHECK, LOG_CHUNKS, MULTI, STEP_HELD, STEP_IDS, STEP_META

# KEYS: 1 gen, 2 meta (hash), 3 first recorded_at (hash: its fields are the generation's entities), then per
#       entity e (1-based): 2 + 2e its open segment, 3 + 2e its incoming relations (set).
# ARGV (3 to 9 shared with lua.py's STEP_* parts): 1 expected gen, 2 the size past which a segment is reported, 3 offset field
#       ("" = none), 4 offset, 5 the latest recorded_at of the writes ("" = none), 6 the partition's lag after this
#       step ("" = unknown), 7 the latest recorded_at of the ids ("" = none), 8 nI, 9 the writer's bucket count,
#       the nI ids and packed marks grouped by bucket (lua.STEP_IDS), nE, then per entity: name, least
#       recorded_at of the writes involving it, its delta block ("" = none), nX, nX elements to add to its
#       incoming relations; then the change-log chunks of the step's writes (changelog.py), appended to
#       `<data prefix>ch`.
# Answers {1, ne, nb, e...}: the ids applied and their buckets now (the writer's next guess: event_ids.note_counts),
# then the entities (1-based) whose open segment is now larger than ARGV[2] (the writer closes them); {3, id...}
# when ids were applied already (nothing written: the writer drops them and retries); {4, stored} when the
# tenant's state went back (lua.STEP_HELD).
APPLY = GEN_CHECK + STEP_HELD + MULTI + LOG_CHUNKS + STEP_IDS + """
local nE = tonumber(ARGV[a])
a = a + 1
local roll = tonumber(ARGV[2])
local names, mins, big = {}, {}, {1, ne + nI, nb}
for e = 1, nE do
  names[e], mins[e] = ARGV[a], ARGV[a + 1]
  local block = ARGV[a + 2]
  if block ~= '' then
    if redis.call('APPEND', KEYS[2 + 2 * e], block) > roll then big[#big + 1] = e end
  end
  local nX = tonumber(ARGV[a + 3])
  if nX > 0 then multi('SADD', KEYS[3 + 2 * e], ARGV, a + 4, a + 3 + nX) end
  a = a + 4 + nX
end
log_chunks(string.sub(KEYS[2], 1, -2) .. 'ch', a)     -- the change log (changelog.py)
local set = {}
for i = 1, nE, 2000 do
  local j = math.min(i + 1999, nE)
  local cur = redis.call('HMGET', KEYS[3], unpack(names, i, j))
  for e = i, j do
    local c = cur[e - i + 1]
    if not c or tonumber(mins[e]) < tonumber(c) then
      set[#set + 1] = names[e]; set[#set + 1] = mins[e]
    end
  end
end
multi('HSET', KEYS[3], set)
""" + STEP_META + """
return big
"""

# `width(lo, hi)`: an upper bound of hi - lo in micros, for points as point9 text (codec.encode_point: 9 digits of
# 6 bits in the alphabet "-0-9A-Z_a-z", most significant first); from their first 8 digits, which a Lua number
# holds exactly.
_WIDTH = """
local function digits8(s)
  local v = 0
  for i = 1, 8 do
    local c = string.byte(s, i)
    local d
    if c == 45 then d = 0 elseif c <= 57 then d = c - 47 elseif c <= 90 then d = c - 54
    elseif c == 95 then d = 37 else d = c - 59 end
    v = v * 64 + d
  end
  return v
end
local function width(lo, hi)
  return (digits8(hi) - digits8(lo) + 1) * 64
end
"""

# KEYS: 1 gen, 2 closed-segment counts (hash), 3 the entity's open segment, 4 its valid-time index (sorted set),
#       5 its recorded-time index (sorted set).
# ARGV: 1 expected gen, 2 escaped entity, 3 the open segment's length the restatement was computed from,
#       4 the restatement block, 5 and 6 the least and greatest recorded_at of the segment's deltas ("" when
#       none), then per timeline with delta rows in the segment: P, its least and greatest point (point9), "1"
#       when a row is an end or expires.
# Closes the open segment (renamed `<open segment>|<n>`) and opens one holding the restatement: {1}; {2} when
# the segment changed since it was read (another writer appended: the next step reports it again). Indexes the
# closed segment's delta rows: member `<P><least><greatest><n>` per timeline; `<P>!` once a timeline's ranges
# overlap (its past reads then decode every segment), `<P>#` once it has an end or an expiry (a void is
# neither); and in the
# recorded-time index, member n scored by the greatest recorded_at, `!` once a segment's least one is below an
# earlier segment's greatest. `<P>%<width>` keeps an upper bound of the widest range of a timeline's entries
# (micros, in decimal; `_WIDTH`), from its first entry on: a timeline indexed before it has none, and never gets
# one (its past reads with overlapping ranges scan its entries, as they did).
ROLL = GEN_CHECK + _WIDTH + """
if redis.call('STRLEN', KEYS[3]) ~= tonumber(ARGV[3]) then return {2} end
local n = redis.call('HINCRBY', KEYS[2], ARGV[2], 1) - 1
redis.call('RENAME', KEYS[3], KEYS[3] .. '|' .. n)
redis.call('SET', KEYS[3], ARGV[4])
if ARGV[5] ~= '' then
  local top = redis.call('ZREVRANGEBYSCORE', KEYS[5], '+inf', '0', 'WITHSCORES', 'LIMIT', 0, 1)
  if top[2] and tonumber(ARGV[5]) < tonumber(top[2]) then redis.call('ZADD', KEYS[5], -1, '!') end
  redis.call('ZADD', KEYS[5], ARGV[6], string.format('%09d', n))
end
for i = 7, #ARGV, 4 do
  local P, lo, hi = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local last = redis.call('ZREVRANGEBYLEX', KEYS[4], '(' .. P .. '~', '[' .. P .. '-', 'LIMIT', 0, 1)[1]
  if last and lo <= string.sub(last, #P + 10, #P + 18) then redis.call('ZADD', KEYS[4], 0, P .. '!') end
  if ARGV[i + 3] == '1' then redis.call('ZADD', KEYS[4], 0, P .. '#') end
  local wide = redis.call('ZRANGEBYLEX', KEYS[4], '[' .. P .. '%', '(' .. P .. '%~', 'LIMIT', 0, 1)[1]
  if wide or not last then
    local w = width(lo, hi)
    local was = wide and tonumber(string.sub(wide, #P + 2)) or -1
    if w > was then
      if wide then redis.call('ZREM', KEYS[4], wide) end
      redis.call('ZADD', KEYS[4], 0, P .. '%' .. string.format('%.0f', w))
    end
  end
  redis.call('ZADD', KEYS[4], 0, P .. lo .. hi .. n)
end
return {1}
"""

# KEYS: 1 gen, 2 the entity's open segment, 3 its incoming relations, 4 meta, 5 first recorded_at (hash).
# ARGV: 1 expected gen, 2 the prefix of segment keys ("<data prefix>s:"), 3 the entity, 4 "1" to read relations
#       naming it as object.
# Answers {1} for an unknown entity, else {1, first recorded_at, open segment, elements, subjects' open
# segments (one per element, "" when missing), {kt, lag}}.
VIEW = GEN_CHECK + """
local first = redis.call('HGET', KEYS[5], ARGV[3])
if not first then return {1} end
local seg = redis.call('GET', KEYS[2]) or ''
local elements, segs = {}, {}
if ARGV[4] == '1' then
  elements = redis.call('SMEMBERS', KEYS[3])
  local got = {}
  for x, el in ipairs(elements) do
    local owner = string.sub(el, 2, string.find(el, '|', 2, true) - 1)
    if got[owner] == nil then got[owner] = redis.call('GET', ARGV[2] .. owner) or '' end
    segs[x] = got[owner]
  end
end
local meta = redis.call('HMGET', KEYS[4], 'kt', 'lag')
return {1, first, seg, elements, segs, meta}
"""

# KEYS: 1 gen, 2 closed-segment counts (hash).
# ARGV: 1 expected gen, 2 the prefix of segment keys ("<data prefix>s:"), 3 the prefix of recorded-time index keys
#       ("<data prefix>k:"), 4 known_at, 5.. escaped entities.
# For a read with known_at (segment_views.ViewReader._known_segments): per entity, "" when every closed segment was known
# then (the open segment stands for it), {m, closed segment m ("" in the cold tier)} for the first closed segment
# holding a write recorded after known_at, or "*" when the index cannot tell (a segment closed without it, or
# writes whose recorded_at went back).
KNOWN = GEN_CHECK + """
local out = {}
for i = 5, #ARGV do
  local e = ARGV[i]
  local n = tonumber(redis.call('HGET', KEYS[2], e) or '0')
  local k = ARGV[3] .. e
  if n == 0 then
    out[#out + 1] = ''
  elseif redis.call('ZCOUNT', k, '0', '+inf') ~= n then
    out[#out + 1] = '*'
  else
    local m = redis.call('ZRANGEBYSCORE', k, '(' .. ARGV[4], '+inf', 'LIMIT', 0, 1)[1]
    if not m then
      out[#out + 1] = ''
    elseif redis.call('ZSCORE', k, '!') then
      out[#out + 1] = '*'
    else
      local j = tonumber(m)
      out[#out + 1] = {j, redis.call('GET', ARGV[2] .. e .. '|' .. j) or ''}
    end
  end
end
return {1, out}
"""

# KEYS: 1 gen, 2 closed-segment counts (hash).
# ARGV: 1 expected gen, 2 the prefix of segment keys, 3.. escaped entities.
# Answers {1, {every segment of each entity concatenated, closed ones first ("" when none)}}; an entity with a
# closed segment missing (moved to the cold tier, cold.py) gets the list of its segments instead, "" for each
# missing one (a closed segment is never empty), the open one last.
FULL = GEN_CHECK + """
local out = {}
for i = 3, #ARGV do
  local e = ARGV[i]
  local n = tonumber(redis.call('HGET', KEYS[2], e) or '0')
  local parts, gone = {}, false
  for j = 0, n - 1 do
    local s = redis.call('GET', ARGV[2] .. e .. '|' .. j)
    if not s then gone = true; s = '' end
    parts[#parts + 1] = s
  end
  parts[#parts + 1] = redis.call('GET', ARGV[2] .. e) or ''
  if gone then out[i - 2] = parts else out[i - 2] = table.concat(parts) end
end
return {1, out}
"""

# The end of PAST and AROUND: `wanted_segments(wanted, nO)` reads, for each of the nO entities named by
# ARGV[6..5 + nO] (escaped, segment keys prefixed by ARGV[2]), its open segment and the closed ones whose numbers
# are keys of wanted[x]: {per entity: {open segment, n, closed segment n, ... (by n)}}; a closed segment moved to
# the cold tier (cold.py) is "".
_WANTED_SEGMENTS = """
local function wanted_segments(wanted, nO)
  local segs = {}
  for x = 1, nO do
    local e = ARGV[5 + x]
    local got = {redis.call('GET', ARGV[2] .. e) or ''}
    local ns = {}
    for n in pairs(wanted[x]) do ns[#ns + 1] = n end
    table.sort(ns)
    for _, n in ipairs(ns) do
      got[#got + 1] = n
      got[#got + 1] = redis.call('GET', ARGV[2] .. e .. '|' .. n) or ''
    end
    segs[x] = got
  end
  return segs
end
"""

# `index_answer(v, P, t, k, scan)`: the valid-time index entries of timeline P of the index v around t, for
# segment_past.py: {"w", up to k entries with the least point <= t (greatest first), up to k with it > t (least
# first), {its first entry}, ends}; for a timeline whose ranges overlap (`<P>!`) and whose widest range is known
# (`<P>%`, ROLL) the window too, bounded by that width: {"o", below, above, up to k entries with the least least
# points (least first), ends, the width}; for one whose ranges overlap without a known width {"a", all its
# entries, {}, {}, ends}, or "*" when they are more than scan. `ends`: "1" when a row of it is an end or expires
# (`<P>#`). The first or lowest entries are read of a relation without ends only (else {}): only its run's
# start is read from them (segment_past.Span.first). `f`: the timeline's `flags(v, P)`, read when not given: its
# `<P>!`, `<P>#` and `<P>%` members in one call (each redis.call costs a few µs of Redis), the members between
# `<P>!` and `<P>&`, which no entry's point9 reaches (its alphabet starts at '-') and no other P starts with.
_INDEX_ANSWER = """
local function flags(v, P)
  local f = {}
  for _, m in ipairs(redis.call('ZRANGEBYLEX', v, '[' .. P .. '!', '(' .. P .. '&')) do
    local c = string.byte(m, #P + 1)
    if c == 33 then f.overlap = true elseif c == 35 then f.ends = true elseif c == 37 and not f.wide then f.wide = m end
  end
  return f
end
local function index_answer(v, P, t, k, scan, f)
  f = f or flags(v, P)
  local ends = f.ends and '1' or ''
  local wide = f.overlap and f.wide
  local first = ends == '' and string.byte(P, 1) == 114
  if wide then
    return {'o', redis.call('ZREVRANGEBYLEX', v, '(' .. P .. t .. '~', '[' .. P .. '-', 'LIMIT', 0, k),
            redis.call('ZRANGEBYLEX', v, '(' .. P .. t .. '~', '(' .. P .. '~', 'LIMIT', 0, k),
            first and redis.call('ZRANGEBYLEX', v, '[' .. P .. '-', '(' .. P .. '~', 'LIMIT', 0, k) or {}, ends,
            string.sub(wide, #P + 2)}
  elseif f.overlap then
    local all = redis.call('ZRANGEBYLEX', v, '[' .. P .. '-', '(' .. P .. '~', 'LIMIT', 0, scan + 1)
    if #all > scan then return '*' end
    return {'a', all, {}, {}, ends}
  end
  return {'w', redis.call('ZREVRANGEBYLEX', v, '(' .. P .. t .. '~', '[' .. P .. '-', 'LIMIT', 0, k),
          redis.call('ZRANGEBYLEX', v, '(' .. P .. t .. '~', '(' .. P .. '~', 'LIMIT', 0, k),
          first and redis.call('ZRANGEBYLEX', v, '[' .. P .. '-', '(' .. P .. '~', 'LIMIT', 0, 1) or {}, ends}
end
"""

# KEYS: 1 gen. ARGV: 1 expected gen, 2 the prefix of segment keys ("<data prefix>s:"), 3 the prefix of index keys
#       ("<data prefix>v:"), 4 t (point9), 5 nO, nO escaped entities, then triples (the entity's position among
#       them, P, "r" for a relation else ""), then k and scan (`index_answer`'s), then "1" for a read as believed
#       now (no known_at).
# For a read at t of each timeline from its closed segments: the segment with the greatest least point <= t
# (the winner's: the index is in order, else flagged) and the one with the least least point > t (the next
# point's) unless, read as believed now, the winner's segment reaches above t (its ranges being disjoint and in
# order, the least point above t is then in it: every later segment starts above its greatest; with known_at
# that point's rows may not be visible yet), and for a relation the one with its first point (its run starts there: it has no end, else
# flagged). An entity with a flagged timeline is read around t (segment_past.py): each of its timelines gets
# INDEX's answer (`index_answer`, k entries each side) instead, and with it the closed segments its first round
# most likely holds (`guess`: segment_past.Span's first [B, U] and a kept relation's least point; the client
# fetches what else it holds).
# Answers {1, {per triple: "", or the index answer when its entity has a flagged timeline}, {per entity:
# {open segment, n, closed segment n, ... (by n)}}}; a closed segment moved to the cold tier (cold.py) is "".
PAST = GEN_CHECK + _WANTED_SEGMENTS + _INDEX_ANSWER + """
local t, nO = ARGV[4], tonumber(ARGV[5])
local k, scan, now = tonumber(ARGV[#ARGV - 2]), tonumber(ARGV[#ARGV - 1]), ARGV[#ARGV] == '1'
local verdicts, wanted, flagged = {}, {}, {}
for x = 1, nO do wanted[x] = {} end
local function want(x, member, P)
  if member then wanted[x][tonumber(string.sub(member, #P + 19))] = true end
end
local function guess(x, a, P, rel)
  if type(a) ~= 'table' or a[1] == 'a' then return end
  local n = #P
  if rel and a[5] == '' then
    local p0 = a[4][1] and string.sub(a[4][1], n + 1, n + 9)
    for _, m in ipairs(a[4]) do if string.sub(m, n + 1, n + 9) == p0 then want(x, m, P) end end
    return
  end
  local below, above = a[2], a[3]
  if not below[1] then return end
  local b, u = string.sub(below[1], n + 1, n + 9), above[1] and string.sub(above[1], n + 1, n + 9)
  local his = {}
  for i, m in ipairs(below) do
    his[i] = string.sub(m, n + 10, n + 18)
    if his[i] > t and (not u or his[i] < u) then u = his[i] end
  end
  for i, m in ipairs(below) do if his[i] >= b then want(x, m, P) end end
  for _, m in ipairs(above) do
    if string.sub(m, n + 1, n + 9) > u then break end
    want(x, m, P)
  end
end
local fs = {}
for i = 6 + nO, #ARGV - 3, 3 do
  local x, P, rel = tonumber(ARGV[i]), ARGV[i + 1], ARGV[i + 2] == 'r'
  local f = flags(ARGV[3] .. ARGV[5 + x], P)
  fs[i] = f
  if f.overlap or (rel and f.ends) then flagged[x] = true end
end
for i = 6 + nO, #ARGV - 3, 3 do
  local x, P, rel = tonumber(ARGV[i]), ARGV[i + 1], ARGV[i + 2] == 'r'
  local v = ARGV[3] .. ARGV[5 + x]
  if flagged[x] then
    verdicts[#verdicts + 1] = index_answer(v, P, t, k, scan, fs[i])
    guess(x, verdicts[#verdicts], P, rel)
  else
    verdicts[#verdicts + 1] = ''
    local w = redis.call('ZREVRANGEBYLEX', v, '(' .. P .. t .. '~', '[' .. P .. '-', 'LIMIT', 0, 1)[1]
    want(x, w, P)
    if not (now and w and string.sub(w, #P + 10, #P + 18) > t) then
      want(x, redis.call('ZRANGEBYLEX', v, '(' .. P .. t .. '~', '(' .. P .. '~', 'LIMIT', 0, 1)[1], P)
    end
    if rel then want(x, redis.call('ZRANGEBYLEX', v, '[' .. P .. '-', '(' .. P .. '~', 'LIMIT', 0, 1)[1], P) end
  end
end
return {1, verdicts, wanted_segments(wanted, nO)}
"""

# A window of each asked timeline around a change's point (RedisStore.windows_many, keel/changes.py): the
# closed segments the valid-time index names for it, and the open segment. For a timeline and point t: every
# segment whose delta range reaches from L to t or above (L: the greatest point below t that ends a range, so
# the segments holding points in [L, t] are all read), and those with the least first point above t (the next
# point's). The index entries of a timeline whose ranges overlap (`<P>!`) are scanned up to ARGV[4] of them (more:
# "*", read the whole timeline); otherwise the last three up to t decide.
# KEYS: 1 gen. ARGV: 1 expected gen, 2 the prefix of segment keys ("<data prefix>s:"), 3 the prefix of index keys
#       ("<data prefix>v:"), 4 index entries scanned at most, 5 nO, nO escaped entities, then triples (the entity's
#       position among them, P, t as point9).
# Answers {1, {per triple: L (point9) when segments below it were left out else "", {segment numbers} or "*"},
# {per entity: {open segment, n, closed segment n, ... (by n)}}}; a closed segment moved to the cold tier is "".
AROUND = GEN_CHECK + _WANTED_SEGMENTS + """
local scan, nO = tonumber(ARGV[4]), tonumber(ARGV[5])
local out, wanted = {}, {}
for x = 1, nO do wanted[x] = {} end
for i = 6 + nO, #ARGV, 3 do
  local x, P, t = tonumber(ARGV[i]), ARGV[i + 1], ARGV[i + 2]
  local v = ARGV[3] .. ARGV[5 + x]
  local up
  if redis.call('ZSCORE', v, P .. '!') then
    up = redis.call('ZRANGEBYLEX', v, '[' .. P .. '-', '(' .. P .. t .. '~', 'LIMIT', 0, scan + 1)
  else
    up = redis.call('ZREVRANGEBYLEX', v, '(' .. P .. t .. '~', '[' .. P .. '-', 'LIMIT', 0, 3)
  end
  if #up > scan then
    out[#out + 1] = ''
    out[#out + 1] = '*'
  else
    local L
    for _, m in ipairs(up) do
      local hi = string.sub(m, #P + 10, #P + 18)
      if hi < t and (not L or hi > L) then L = hi end
    end
    local ns, below = {}, ''
    for _, m in ipairs(up) do
      if not L or string.sub(m, #P + 10, #P + 18) >= L then ns[#ns + 1] = string.sub(m, #P + 19) else below = L end
    end
    local nx = redis.call('ZRANGEBYLEX', v, '(' .. P .. t .. '~', '(' .. P .. '~', 'LIMIT', 0, 1)[1]
    if nx then
      local lo = string.sub(nx, #P + 1, #P + 9)
      for _, m in ipairs(redis.call('ZRANGEBYLEX', v, '[' .. P .. lo, '(' .. P .. lo .. '~')) do
        ns[#ns + 1] = string.sub(m, #P + 19)
      end
    end
    for _, n in ipairs(ns) do wanted[x][tonumber(n)] = true end
    out[#out + 1] = below
    out[#out + 1] = ns
  end
end
return {1, out, wanted_segments(wanted, nO)}
"""

# KEYS: 1 gen. ARGV: 1 expected gen, 2 the prefix of index keys ("<data prefix>v:"), 3 entries each side at most,
#       4 entries at most of a timeline whose ranges overlap without a known width, then triples (escaped entity,
#       P, t as point9).
# The valid-time index entries of each timeline around t (segment_past.py): {1, {per triple: `index_answer`}}.
INDEX = GEN_CHECK + _INDEX_ANSWER + """
local k, scan = tonumber(ARGV[3]), tonumber(ARGV[4])
local out = {}
for i = 5, #ARGV, 3 do
  out[#out + 1] = index_answer(ARGV[2] .. ARGV[i], ARGV[i + 1], ARGV[i + 2], k, scan)
end
return {1, out}
"""

# KEYS: 1 gen. ARGV: 1 expected gen, 2 the prefix of segment keys ("<data prefix>s:"), 3 an escaped entity,
#       4.. closed segment numbers.
# Answers {1, {each closed segment, "" when it is in the cold tier (cold.py)}}.
SEGMENTS = GEN_CHECK + """
local out = {}
for i = 4, #ARGV do out[#out + 1] = redis.call('GET', ARGV[2] .. ARGV[3] .. '|' .. ARGV[i]) or '' end
return {1, out}
"""
