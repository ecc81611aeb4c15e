"""Layout 1's Lua scripts (the sorted set per entity): commit a step, read timelines, read views. The parts every
Redis script shares (the generation check, the commit step's checks, generation switches) are lua.py's.

Layout reminders (see keel/store/redis/keys.py): an entity's sorted set holds every assertion of the
timelines it owns, all with score 0, ordered by member:
    <P><point: 9 sortable base-64 chars><#b><b><#w><w><#k><k><body>
P is the timeline's prefix (kind and the key parts after the owner, each ending in `|`), b the
length of the provenance list when the event was applied, w the write's index in its batch, k the
offset of its provenance entry within the event (so the entry is at index b + k). `~` sorts after
every point character, so `[P .. (P~` is exactly the timeline.
"""
from __future__ import annotations

from .lua import GEN_CHECK, LOG_CHUNKS, MULTI, STEP_HELD, STEP_IDS, STEP_META

# The position of the provenance index encoded after P and the point; returns b + k.
_PROV_OF = """
local function prov_of(m, i)
  local lb = tonumber(string.sub(m, i, i))
  local b = tonumber(string.sub(m, i + 1, i + lb))
  i = i + 1 + lb
  local lw = tonumber(string.sub(m, i, i))
  i = i + 1 + lw
  local lk = tonumber(string.sub(m, i, i))
  return b + tonumber(string.sub(m, i + 1, i + lk))
end
"""

# KEYS: 1 gen, 2 event ids (set), 3 meta (hash), 4 entities (set), 5 provenance (list),
#       then for entity i (1-based): 4 + 2i its sorted set, 5 + 2i its index list; then event marks (hash)
#       and, last, the relation timelines with ends (set `re`).
# ARGV: 1 expected gen, 2 expected provenance length, 3 offset field ("" = none), 4 offset (or `<offset> <held>`,
#       STEP_HELD), 5 the latest
#       recorded_at of the writes ("" = none), 6 the partition's lag after this step ("" = unknown), 7 the
#       latest recorded_at of the events ("" = none);
#       nI, the event ids; nM, then nM pairs (event id, its mark) of the ids that carry one;
#       nP, provenance entries;
#       nE, per entity: name, min recorded_at of its writes, its number of members, its number of timelines;
#       nR, then per timeline in order of first write: its owner's index and P, or for a relation between
#       two entities minus its owner's index, the other entity's index, P and the element naming it in the
#       other entity's index list (`>` + escaped owner + `|` + P);
#       nX, then the relation timelines this step gives an end or an expiry (members of `re`);
#       then the members of each entity, in entity order (each gets score 0);
#       then the change-log chunks of the step's writes (changelog.py), appended to `<data prefix>ch`.
# The client encodes everything it can (complete members, index elements, runs of ids, marks and entries),
# so that the script parses no string: it checks, reads the index lists and passes runs of ARGV to the
# writing commands (about a tenth less Redis CPU than parsing a header per timeline, docs/performance.md).
# The meta hash keeps `kt` (the greatest recorded_at applied: the tenant's known_through) and `lag`
# (set with an offset that moves forward), so readers learn both from the same atomic step.
# The client builds complete members: it knows the provenance length from its last call. Answers
# {2, length} when that guess is wrong and {3, id, ...} when some event ids are already applied;
# nothing is written then, and the client rebuilds and retries. An index list holds the entity's
# first recorded_at at index 0, then one element per timeline involving it, in creation order.
# A timeline is new when its owner's sorted set has no member starting with P; an owner with several
# of the batch's timelines and a short index list answers that from its index list in one LRANGE
# (the list holds P exactly when the sorted set holds members of P: both change only here).
APPLY = GEN_CHECK + STEP_HELD + MULTI + LOG_CHUNKS + """
local base = redis.call('LLEN', KEYS[5])
if tostring(base) ~= ARGV[2] then return {2, base} end
""" + STEP_IDS + """
local nP = tonumber(ARGV[a])
local Pv = a + 1
a = Pv + nP
local nE = tonumber(ARGV[a])
local E = a + 1
a = E + 4 * nE
local nR = tonumber(ARGV[a])
local T = a + 1
local first, have, push = {}, {}, {}
for e = 1, nE do
  local b = E + 4 * e - 4
  local k = tonumber(ARGV[b + 3])
  local f
  if k < 2 then
    f = redis.call('LINDEX', KEYS[5 + 2 * e], 0)
  else
    local limit = 8 + 4 * k
    local r = redis.call('LRANGE', KEYS[5 + 2 * e], 0, limit)
    f = r[1]
    if #r <= limit then
      local s = {}
      for y = 2, #r do s[r[y]] = true end
      have[e] = s
    end
  end
  first[e] = f
  if not f then push[e] = {ARGV[b + 1]} end
end
local t, other, P, element = T, 0
while t < T + nR do
  local owner = tonumber(ARGV[t])
  if owner > 0 then
    P, other = ARGV[t + 1], 0
    t = t + 2
  else
    owner, other, P, element = -owner, tonumber(ARGV[t + 1]), ARGV[t + 2], ARGV[t + 3]
    t = t + 4
  end
  local new
  if not first[owner] then
    new = true
  elseif have[owner] then
    new = not have[owner][P]
  else
    new = #redis.call('ZRANGEBYLEX', KEYS[4 + 2 * owner], '[' .. P, '(' .. P .. '~', 'LIMIT', 0, 1) == 0
  end
  if new then
    local q = push[owner]
    if not q then q = {}; push[owner] = q end
    q[#q + 1] = P
    if other > 0 then
      q = push[other]
      if not q then q = {}; push[other] = q end
      q[#q + 1] = element
    end
  end
end
local nX = tonumber(ARGV[T + nR])
local X = T + nR + 1
local z = X + nX
local fresh = {}
for e = 1, nE do
  local b = E + 4 * e - 4
  local n = tonumber(ARGV[b + 2])
  if n > 0 then
    local zargs = {}
    for y = 0, n - 1 do
      zargs[2 * y + 1] = '0'
      zargs[2 * y + 2] = ARGV[z + y]
    end
    multi('ZADD', KEYS[4 + 2 * e], zargs)
    z = z + n
  end
  local f = first[e]
  if not f then
    fresh[#fresh + 1] = ARGV[b]
  elseif tonumber(ARGV[b + 1]) < tonumber(f) then
    redis.call('LSET', KEYS[5 + 2 * e], 0, ARGV[b + 1])
  end
  if push[e] then multi('RPUSH', KEYS[5 + 2 * e], push[e]) end
end
if #fresh > 0 then multi('SADD', KEYS[4], fresh) end
log_chunks(string.sub(KEYS[3], 1, -2) .. 'ch', z)     -- the change log (changelog.py)
multi('RPUSH', KEYS[5], ARGV, Pv, Pv + nP - 1)
multi('SADD', KEYS[2], ARGV, I, I + nI - 1)
multi('HSET', KEYS[#KEYS - 1], ARGV, Mk, Mk + 2 * nM - 1)
multi('SADD', KEYS[#KEYS], ARGV, X, X + nX - 1)
""" + STEP_META + """
if (nI > 0 or nR > 0) and redis.call('HINCRBY', KEYS[3], 'sv', 1) == 1 then
  redis.call('HSET', KEYS[3], 're', '1')    -- this generation's first write: `re` is kept from here on
end
return {1, base + nP}
"""

# The winner at or before t of timeline P in sorted set z: nil when nothing is at or before t, else the
# winning member, 2 when another assertion shares its point (a correction) else 1, and the next later
# point9 or "" (the winner's point is the greatest at or before t, so the next point is the first after t).
# A point whose winner is a void (keel.timeline.is_void: an end valued {"keel.void": id}) counts for
# nothing: the search goes on before it, and the next point is the first after t whose winner is no void.
_WINNER = """
local function void_at(m, P)
  return string.find(m, '!{"keel.void":', #P + 10, true) ~= nil
end
local function winner_at(z, P, t)
  local hi, r, m = '(' .. P .. t .. '~'
  while true do
    r = redis.call('ZREVRANGEBYLEX', z, hi, '[' .. P, 'LIMIT', 0, 2)
    if #r == 0 then return nil end
    m = r[1]
    if not void_at(m, P) then break end
    hi = '(' .. string.sub(m, 1, #P + 9)
  end
  local shared = r[2] and string.sub(r[2], #P + 1, #P + 9) == string.sub(m, #P + 1, #P + 9)
  local lo, nx = '(' .. P .. t .. '~', ''
  while true do
    local f = redis.call('ZRANGEBYLEX', z, lo, '(' .. P .. '~', 'LIMIT', 0, 1)
    if not f[1] then break end
    local pt = string.sub(f[1], #P + 1, #P + 9)
    lo = '(' .. P .. pt .. '~'
    local last = redis.call('ZREVRANGEBYLEX', z, lo, '[' .. P .. pt, 'LIMIT', 0, 1)
    if not void_at(last[1], P) then
      nx = pt
      break
    end
  end
  return m, shared and 2 or 1, nx
end
"""

# Provenance entries met while reading (KEYS[2] is the provenance list): `note(member, i)` with i the
# position of its provenance index adds {index, entry} to `provs` once per index.
_NOTES = """
local provs, seen = {}, {}
local function note(m, i)
  local n = prov_of(m, i)
  if not seen[n] then
    seen[n] = true
    provs[#provs + 1] = n
    provs[#provs + 1] = redis.call('LINDEX', KEYS[2], n)
  end
end
"""

# Every member of timeline P in sorted set z, P removed; `resolve` notes their provenance.
_MEMBERS = """
local function members(z, P, resolve)
  local ms = redis.call('ZRANGEBYLEX', z, '[' .. P, '(' .. P .. '~')
  for x, m in ipairs(ms) do
    if resolve then note(m, #P + 10) end
    ms[x] = string.sub(m, #P + 1)
  end
  return ms
end
"""

# KEYS: 1 gen, 2 provenance, then one sorted set per asked timeline.
# ARGV: 1 expected gen, 2 "1" to resolve provenance entries, then the prefix P of each timeline.
# Answers {1, {members without P, per timeline}, {index, entry, index, entry, ...}}.
READ = GEN_CHECK + _PROV_OF + _NOTES + _MEMBERS + """
local resolve = ARGV[2] == '1'
local lists = {}
for i = 3, #KEYS do
  lists[i - 2] = members(KEYS[i], ARGV[i], resolve)
end
return {1, lists, provs}
"""

# What `context` shows of one entity, in one call: its index list, then the labels and facts at t and the
# relation timelines (Store.view).
# KEYS: 1 gen, 2 provenance, 3 the entity's index list, 4 the entity's sorted set, 5 the meta hash, 6 the
#       relation timelines with ends (set `re`).
# ARGV: 1 expected gen, 2 "1" for whole timelines of every kind (a known_at to fold by), else the winners
#       at t of labels and facts, 3 t as point9, 4 the parts to read (letters of "lfr"), 5 the prefix of
#       sorted-set names ("<data prefix>z:"), 6 "1" when ARGV[7..] (escaped scope keys) limit the facts.
# Answers {1} for an unknown entity, else {1, first recorded_at, winners, timelines, provenance, {kt, lag}}
# (the tenant's known_through and lag from the meta hash, false when absent), with
# winners: per label or fact with an assertion at or before t, its index element, the winner without P,
# 2 when another assertion shares its point else 1, and the next point9 or ""; timelines: per relation
# (and per label and fact in whole mode), its index element and its members without P (only the first,
# outside whole mode, of a relation holding links only: its coalesced versions are one run from there,
# keys.py); provenance:
# {index, entry, ...} of every member returned.
# A relation naming the entity as object lives in its subject's sorted set, whose name this script builds
# from the index element: that key is not in KEYS, but it carries the tenant's hash tag (same slot).
VIEW = GEN_CHECK + _PROV_OF + _WINNER + _NOTES + _MEMBERS + """
local index = redis.call('LRANGE', KEYS[3], 0, -1)
if #index == 0 then return {1} end
local whole, t, parts, zs = ARGV[2] == '1', ARGV[3], ARGV[4], ARGV[5]
local function wanted(kind) return string.find(parts, kind, 1, true) ~= nil end
local scopes
if ARGV[6] == '1' then
  scopes = {}
  for i = 7, #ARGV do scopes[ARGV[i]] = true end
end
local winners, timelines = {}, {}
local function timeline(el, z, P)
  timelines[#timelines + 1] = el
  timelines[#timelines + 1] = members(z, P, true)
end
local meta = redis.call('HMGET', KEYS[5], 'kt', 'lag', 're')
local links = not whole and meta[3] == '1'
local function relation(el, owner, z, P)
  if links and redis.call('SISMEMBER', KEYS[6], owner .. '|' .. P) == 0 then
    local m = redis.call('ZRANGEBYLEX', z, '[' .. P, '(' .. P .. '~', 'LIMIT', 0, 1)[1]
    note(m, #P + 10)
    timelines[#timelines + 1] = el
    timelines[#timelines + 1] = {string.sub(m, #P + 1)}
  else
    timeline(el, z, P)
  end
end
local rels, labels, facts = wanted('r'), wanted('l'), wanted('f')
for i = 2, #index do
  local el = index[i]
  local kind = string.sub(el, 1, 1)
  if kind == '>' then
    if rels then
      local j = string.find(el, '|', 2, true)
      local owner = string.sub(el, 2, j - 1)
      relation(el, owner, zs .. owner, string.sub(el, j + 1))
    end
  elseif kind == 'r' then
    if rels then relation(el, string.sub(KEYS[4], #zs + 1), KEYS[4], el) end
  elseif (kind == 'l' and labels) or
         (kind == 'f' and facts and (not scopes or scopes[string.match(el, '^f|[^|]*|(.*)|$')])) then
    if whole then
      timeline(el, KEYS[4], el)
    else
      local m, count, nx = winner_at(KEYS[4], el, t)
      if m then
        note(m, #el + 10)
        local w = #winners
        winners[w + 1], winners[w + 2], winners[w + 3], winners[w + 4] = el, string.sub(m, #el + 1), count, nx
      end
    end
  end
end
return {1, index[1], winners, timelines, provs, {meta[1], meta[2]}}
"""

