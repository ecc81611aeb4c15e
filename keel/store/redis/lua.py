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

# The meta hash (KEYS[2]) is read once per commit step, here: `meta` holds the stored offset (field ARGV[3]; `rl`
# when ARGV[3] is ""), then `ne`, `eb`, `rl`, `kt` and `sv` (STEP_IDS and STEP_META use them; one HMGET and one
# HSET a step rather than a call per part). ARGV[4] is the step's offset, or `<offset> <held>`: held is the tenant's
# offset on the partition as the writer last saw it stored. Stored absent or below it means Redis lost writes the
# writer saw land (a failover to a lagging replica, an old backup): nothing is written, the answer is
# {4, stored or ''} and the writer resumes the partition from what Redis holds (keel.store.base.went_back is this
# rule in Python). Leaves `field`, `meta` and `offset` for STEP_IDS and STEP_META.
STEP_HELD = """
local field = ARGV[3]
local meta = redis.call('HMGET', KEYS[2], field ~= '' and field or 'rl', 'ne', 'eb', 'rl', 'kt', 'sv')
local offset, held = string.match(ARGV[4], '^(%d+) ?(%d*)$')
if held ~= '' and field ~= '' then
  local stored = meta[1]
  if not stored or tonumber(stored) < tonumber(held) then return {4, stored or ''} end
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

# A generation's applied event ids and their marks (keys.py: `d e:<b>`), in small hashes id -> packed mark
# (event_ids.py; "" for an id without one) that Redis keeps as listpacks: buckets by linear hashing. The meta hash
# holds `ne`, the ids applied, and `eb`, the buckets (absent: one). Bucket b of n holds the ids whose hash h
# (the first 32 bits of the id's SHA-1) gives `h % top == b`, or `h % (2 * top) == b` when `h % top` is below
# `n - top` (already split), with top the greatest power of 2 <= n: `id_hash` and `id_bucket` here,
# event_ids.id_hash and id_bucket in Python, where the writer groups a commit step's ids by bucket so that Redis
# neither hashes nor groups them (tests/test_event_ids.py compares the two). A step that would take the ids past
# IDS_PER_BUCKET per bucket first splits bucket `n - top` into itself and `n` (its ids with `h % (2 * top) ~= n - top`
# move), one bucket at a time: each id is moved O(1) times on average, a bucket holds about IDS_PER_BUCKET ids (at
# most twice that on average, before its split), well below hash-max-listpack-entries (default 512). This is the
# one place of the rule in Lua: reads of single ids go through ID_LOOKUP, reads of all ids read every bucket by
# name.
# 64, measured on bench/cold_tier.py's 15,600 ids with their packed marks (MEMORY USAGE per id): 16 a bucket 36.7 B,
# 32 34.2 B, 64 32.6 B (fullest bucket 139), 128 31.8 B, 192 31.4 B; a set plus a hash took 129 B. Past 64 a byte
# or less is saved while every lookup scans a listpack twice as long.
IDS_PER_BUCKET = 64
ID_BUCKETS = """
local function id_hash(id)
  return tonumber(string.sub(redis.sha1hex(id), 1, 8), 16)
end
local function id_top(nb)
  local top = 1
  while top * 2 <= nb do top = top * 2 end
  return top
end
local function id_bucket(h, nb, top)
  local b = h % top
  if b < nb - top then b = h % (2 * top) end
  return b
end
"""

# A commit step's event ids and marks: ARGV[8] nI, ARGV[9] the bucket count the writer grouped them for (its
# guess of `eb` after this step's splits: event_ids.id_args), then from ARGV[10] the groups, one per bucket: b,
# n, then n pairs (id, packed mark or ""), so that the group's HSET takes a range of ARGV as it is (its HMGET
# takes the ids copied to a table: cheaper than sending each id twice, measured). First the buckets are split (one at a
# time, as above) until they have room for the step's ids at IDS_PER_BUCKET a bucket, so that no bucket takes a
# whole large step (a replay's step of 5,000 ids) and outgrows a listpack for good; the bucket count is stored at
# once (a split changes no answer). When the count then differs from the writer's (its guess was stale: a new
# writer, another writer meanwhile), the ids are grouped here again, by id_hash (correctness never depends on the
# guess; the answer tells the writer the counts: segment_scripts.APPLY). Each bucket's group is added in one call
# when it is one id (HSETNX) or two when it is more (HMGET finds those applied already, then one HSET): a small
# tenant's step fills a bucket or two with a few calls, a large tenant's spreads over many buckets at one call per
# id. A step's ids are distinct (batch.PendingStep drops repeats). Once an id is found applied, the groups after
# it are only looked up, those written before it are removed again (HDEL) and the answer is {3, id, ...} with
# every id found (nothing else is written: the writer drops them and retries). Each call from Lua, each string of
# ARGV, and each write command in the append-only file and the replication stream, costs more than the look-up
# itself: bench/redis_instructions.py counts them. It runs before the step's other writes. KEYS[2] is the meta
# hash, whose name ends in `m` after the data prefix (`ne` and `eb` come from STEP_HELD's read of it). Leaves `a`
# at the argument after the groups, and `ne` and `nb` (the counts before the step, and the buckets after it) for
# STEP_META and the answer.
STEP_IDS = ID_BUCKETS + """
local nI = tonumber(ARGV[8])
local idkeys = string.sub(KEYS[2], 1, -2) .. 'e:'
local ne, nb = tonumber(meta[2] or '0'), tonumber(meta[3] or '1')
local a = 10
if nI > 0 then
  local top = id_top(nb)
  if ne + nI > nb * """ + str(IDS_PER_BUCKET) + """ then
    repeat
      local s = nb - top
      local from = idkeys .. s
      local all = redis.call('HGETALL', from)
      local moved, gone = {}, {}
      for i = 1, #all, 2 do
        if id_hash(all[i]) % (2 * top) ~= s then
          moved[#moved + 1] = all[i]
          moved[#moved + 1] = all[i + 1]
          gone[#gone + 1] = all[i]
        end
      end
      if #gone > 0 then
        multi('HSET', idkeys .. nb, moved)
        multi('HDEL', from, gone)
      end
      nb = nb + 1
      if nb == 2 * top then top = nb end
    until ne + nI <= nb * """ + str(IDS_PER_BUCKET) + """
    redis.call('HSET', KEYS[2], 'eb', nb)
  end
  local dup, done = {3}, {}
  -- add(key, ids, i, j, sets, p, q): the group ids[i..j] with its pairs sets[p..q] into bucket `key`
  local function add(key, ids, i, j, sets, p, q)
    if i == j and #dup == 1 then
      if redis.call('HSETNX', key, ids[i], sets[p + 1]) == 0 then dup[2] = ids[i] return end
    else
      for s = i, j, 2000 do
        local t = math.min(s + 1999, j)
        local cur = redis.call('HMGET', key, unpack(ids, s, t))
        for k = 1, t - s + 1 do if cur[k] then dup[#dup + 1] = ids[s + k - 1] end end
      end
      if #dup > 1 then return end
      multi('HSET', key, sets, p, q)
    end
    done[#done + 1] = key
    done[#done + 1] = ids
    done[#done + 1] = i
    done[#done + 1] = j
  end
  local by, sets, order = {}, {}, nil
  if ARGV[9] ~= tostring(nb) then order = {} end
  local seen = 0
  while seen < nI do
    local n = tonumber(ARGV[a + 1])
    local p, q = a + 2, a + 1 + 2 * n
    if not order then
      if n == 1 then
        add(idkeys .. ARGV[a], ARGV, p, p, ARGV, p, q)
      else
        local ids = {}
        for x = p, q, 2 do ids[#ids + 1] = ARGV[x] end
        add(idkeys .. ARGV[a], ids, 1, n, ARGV, p, q)
      end
    else
      for x = p, q, 2 do
        local b = id_bucket(id_hash(ARGV[x]), nb, top)
        local names = by[b]
        if not names then
          by[b], sets[b] = {}, {}
          names = by[b]
          order[#order + 1] = b
        end
        local set = sets[b]
        names[#names + 1] = ARGV[x]
        set[#set + 1] = ARGV[x]
        set[#set + 1] = ARGV[x + 1]
      end
    end
    seen = seen + n
    a = q + 1
  end
  if order then
    for _, b in ipairs(order) do add(idkeys .. b, by[b], 1, #by[b], sets[b], 1, #sets[b]) end
  end
  if #dup > 1 then
    for w = 1, #done, 4 do multi('HDEL', done[w], done[w + 1], done[w + 2], done[w + 3]) end
    return dup
  end
end
"""

# KEYS: 1 gen, 2 meta hash. ARGV: 1 expected gen, 2.. event ids. Answers {1, packed mark ("" none) or nil per id
# (not applied)}.
ID_LOOKUP = GEN_CHECK + ID_BUCKETS + """
local idkeys = string.sub(KEYS[2], 1, -2) .. 'e:'
local nb = tonumber(redis.call('HGET', KEYS[2], 'eb') or '1')
local top = id_top(nb)
local out = {1}
for i = 2, #ARGV do
  out[i] = redis.call('HGET', idkeys .. id_bucket(id_hash(ARGV[i]), nb, top), ARGV[i])
end
return out
"""

# The meta hash (KEYS[2]) after a commit step, in one HSET: `ne` counts the ids applied (nI more, STEP_IDS'), `rl`
# (ARGV[7], the latest recorded_at of the ids), `kt` (ARGV[5], of the writes) and the offset (field ARGV[3], value
# `offset` of STEP_HELD) only move forward; `lag` (ARGV[6]) is set with the offset; `sv`, the state's version, goes
# up by one when the step carried ids or entities (nE, the caller's). The values read are STEP_HELD's `meta`.
STEP_META = """
local rl, kt, lag = ARGV[7], ARGV[5], ARGV[6]
local set = {}
if nI > 0 then
  set[1] = 'ne'
  set[2] = ne + nI
end
if rl ~= '' and (not meta[4] or tonumber(rl) > tonumber(meta[4])) then
  set[#set + 1] = 'rl'
  set[#set + 1] = rl
end
if kt ~= '' and (not meta[5] or tonumber(kt) > tonumber(meta[5])) then
  set[#set + 1] = 'kt'
  set[#set + 1] = kt
end
if field ~= '' and (not meta[1] or tonumber(offset) > tonumber(meta[1])) then
  set[#set + 1] = field
  set[#set + 1] = offset
  if lag ~= '' then
    set[#set + 1] = 'lag'
    set[#set + 1] = lag
  end
end
if nI > 0 or nE > 0 then
  set[#set + 1] = 'sv'
  set[#set + 1] = tonumber(meta[6] or '0') + 1
end
if #set > 0 then redis.call('HSET', KEYS[2], unpack(set)) end
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
