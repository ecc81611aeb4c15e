"""The Lua every Redis script shares: the generation check, the held-offset check, the applied-ids check, the
change log's append and the meta hash's update of a commit step, and the scripts that move offsets and switch
generations. Each script runs atomically on the node owning the tenant's hash slot, and takes, as ARGV[1], the
generation the caller computed its key names for: when that is not empty and the tenant's current generation
(KEYS[1], absent = "1") differs, it changes nothing and answers `{0, <current generation>}`; the caller recomputes
its keys and retries. An empty ARGV[1] means "this generation, current or not" (a view pinned with
`for_generation`)."""
from __future__ import annotations

GEN_CHECK = """
local gen = ARGV[1]
if gen ~= '' then
  local cur = redis.call('GET', KEYS[1]) or '1'
  if cur ~= gen then return {0, cur} end
end
"""

# ARGV[4] is the step's offset, or `<offset> <held>`: held is the tenant's offset on the partition (field ARGV[3])
# as the writer last saw it stored. Stored absent or below it means Redis lost writes the writer saw land (a
# failover to a lagging replica, an old backup): nothing is written, the answer is {4, stored or ''} and the
# writer resumes the partition from what Redis holds (keel.store.base.went_back is this rule in Python).
# Leaves `offset` for STEP_META.
STEP_HELD = """
local offset, held = string.match(ARGV[4], '^(%d+) ?(%d*)$')
if held ~= '' and ARGV[3] ~= '' then
  local stored = redis.call('HGET', KEYS[3], ARGV[3])
  if not stored or tonumber(stored) < tonumber(held) then return {4, stored or ''} end
end
"""

# Refuses a step whose event ids (nI of them, ARGV[I] on; both locals set before) were applied already: answers
# {3, id, ...} with those ids (KEYS[2] is the applied-ids set), so nothing is written.
APPLIED_IDS = """
if nI > 0 then
  local dup = {3}
  local i = 0
  while i < nI do
    local j = math.min(i + 1999, nI - 1)
    local found = redis.call('SMISMEMBER', KEYS[2], unpack(ARGV, I + i, I + j))
    for x = 1, #found do
      if found[x] == 1 then dup[#dup + 1] = ARGV[I + i + x - 1] end
    end
    i = j + 1
  end
  if #dup > 1 then return dup end
end
"""

# `multi(cmd, key, items, from, to)`: cmd key items[from..to], in calls of at most 2000 items (Lua's unpack
# stops at a few thousand values; a worker's step can carry tens of thousands of ids).
MULTI = """
local function multi(cmd, key, items, from, to)
  local i = from or 1
  to = to or #items
  while i <= to do
    local j = math.min(i + 1999, to)
    redis.call(cmd, key, unpack(items, i, j))
    i = j + 1
  end
end
"""

# The change log's part of both APPLY scripts (changelog.py): `log_chunks(key, from)` appends the step's chunks
# (ARGV[from] to the last, each `|<writes>|...`) to the list `key`, each prefixed with `c<position>` (the log's
# length in writes, from its last chunk).
LOG_CHUNKS = """
local function log_chunks(key, from)
  if from > #ARGV then return end
  local last, pos = redis.call('LINDEX', key, -1), 0
  if last then
    local p, c = string.match(last, '^c(%d+)|(%d+)|')
    if p then pos = tonumber(p) + tonumber(c) else pos = redis.call('LLEN', key) end
  end
  local els = {}
  for i = from, #ARGV do
    els[#els + 1] = 'c' .. string.format('%d', pos) .. ARGV[i]
    pos = pos + tonumber(string.match(ARGV[i], '^|(%d+)|'))
  end
  multi('RPUSH', key, els)
end
"""

# A commit step's event ids and marks (layouts 1 and 2 share this part of their ARGV): ARGV[8] nI, the ids from
# ARGV[I], then nM and nM pairs (id, mark) from ARGV[Mk]; refused (APPLIED_IDS) when an id was applied. Leaves
# `a` at the argument after the marks.
STEP_IDS = """
local nI = tonumber(ARGV[8])
local I = 9
""" + APPLIED_IDS + """
local a = I + nI
local nM = tonumber(ARGV[a])
local Mk = a + 1
a = Mk + 2 * nM
"""

# The meta hash (KEYS[3]) after a commit step: `rl` (ARGV[7], the latest recorded_at of the
# ids), `kt` (ARGV[5], of the writes) and the offset (field ARGV[3], value `offset` of STEP_HELD) only move forward; `lag`
# (ARGV[6]) is set with the offset.
STEP_META = """
local field, rl, kt, lag = ARGV[3], ARGV[7], ARGV[5], ARGV[6]
local cur = redis.call('HMGET', KEYS[3], 'rl', 'kt', field ~= '' and field or 'rl')
local set = {}
if rl ~= '' and (not cur[1] or tonumber(rl) > tonumber(cur[1])) then
  set[#set + 1] = 'rl'
  set[#set + 1] = rl
end
if kt ~= '' and (not cur[2] or tonumber(kt) > tonumber(cur[2])) then
  set[#set + 1] = 'kt'
  set[#set + 1] = kt
end
if field ~= '' and (not cur[3] or tonumber(offset) > tonumber(cur[3])) then
  set[#set + 1] = field
  set[#set + 1] = offset
  if lag ~= '' then
    set[#set + 1] = 'lag'
    set[#set + 1] = lag
  end
end
if #set > 0 then redis.call('HSET', KEYS[3], unpack(set)) end
"""

# The partitions' applied watermarks (KEYS[1], keys.applied_key): ARGV in triples (field, offset, held or "").
# When a stored watermark is absent or below its held value, nothing is written and the answer is
# {4, field, stored or '', ...} for each such field (Redis lost writes the writer saw land); else each
# watermark moves forward to its offset and the answer is {1}.
ADVANCE = """
local behind = {4}
for i = 1, #ARGV, 3 do
  if ARGV[i + 2] ~= '' then
    local stored = redis.call('HGET', KEYS[1], ARGV[i])
    if not stored or tonumber(stored) < tonumber(ARGV[i + 2]) then
      behind[#behind + 1] = ARGV[i]
      behind[#behind + 1] = stored or ''
    end
  end
end
if #behind > 1 then return behind end
for i = 1, #ARGV, 3 do
  local stored = redis.call('HGET', KEYS[1], ARGV[i])
  if not stored or tonumber(ARGV[i + 1]) > tonumber(stored) then redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
end
return {1}
"""

# KEYS: 1 gen, 2 gen sequence. ARGV: 1 the generation to make current.
SWITCH = """
redis.call('SET', KEYS[1], ARGV[1])
local s = tonumber(redis.call('GET', KEYS[2]) or '1')
if tonumber(ARGV[1]) > s then redis.call('SET', KEYS[2], ARGV[1]) end
return 1
"""

# KEYS: 1 gen, 2 gen sequence, 3 meta hash of the current generation, 4 meta hash of the new one.
# ARGV: 1 expected current generation, 2 new generation, 3.. offset fields that must have caught up.
# Switches only when the current generation is still ARGV[1] and, for every field, the new generation's
# offset is at least the current one's: {1} switched, {0, current} moved meanwhile, {-1, field} behind.
SWITCH_IF_CAUGHT_UP = """
local cur = redis.call('GET', KEYS[1]) or '1'
if cur ~= ARGV[1] then return {0, cur} end
for i = 3, #ARGV do
  local live = tonumber(redis.call('HGET', KEYS[3], ARGV[i]) or '-1')
  local new = tonumber(redis.call('HGET', KEYS[4], ARGV[i]) or '-1')
  if new < live then return {-1, ARGV[i]} end
end
redis.call('SET', KEYS[1], ARGV[2])
local s = tonumber(redis.call('GET', KEYS[2]) or '1')
if tonumber(ARGV[2]) > s then redis.call('SET', KEYS[2], ARGV[2]) end
return {1}
"""

# KEYS: 1 gen, 2 gen sequence. Hands out a generation number never used before.
NEW_GENERATION = """
local cur = tonumber(redis.call('GET', KEYS[1]) or '1')
local s = tonumber(redis.call('GET', KEYS[2]) or '1')
if cur > s then s = cur end
s = s + 1
redis.call('SET', KEYS[2], tostring(s))
return s
"""
