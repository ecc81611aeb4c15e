"""The Lua script that reads a tenant's change log in Redis (changelog.py's ChangeLogReads sends it): a page of
the log with the tenant's known_through in one atomic step (READ). The log's format is changelog.py's; the
timelines around each change are read from segments (segment_scripts.AROUND)."""
from __future__ import annotations

from .lua import GEN_CHECK

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
