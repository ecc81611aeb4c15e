"""The Redis side of the cold tier (keel/cold_pg.py): which closed segments of layout 2 are cold, moving one,
and filling the pieces a read finds missing.

A closed segment `<d>s:<entity>|<n>` (segment_scripts.py) never changes. Moving it is two steps, each safe to
repeat: the mover copies it to PostgreSQL (an upsert keyed by namespace, tenant, generation, entity and n, with
its SHA-1), then MOVE deletes it from Redis only if the generation is still current and its content still has
that hash, and records it in the generation's hash `<d>cz` (field `<escaped entity>|<n>` -> SHA-1). A mover
killed between the steps leaves the segment in Redis and a row in PostgreSQL: the next run copies it again
(same row) and deletes it. Nothing else changes: the open segment, the valid-time index `v:`, the counts `sg`
stay in Redis, so every read names the same pieces as before; a closed piece it finds missing in Redis is read
from PostgreSQL (`fill`), by primary key: exactly the pieces the index named.

The change log `<d>ch` (changelog.py: a list of chunks `c<position>|<writes>|<recorded_at>|<body>`, appended at
its tail) moves from its head: the mover copies its oldest chunks, all but the newest KEEP_CHUNKS, to
PostgreSQL, then TRIM_CHANGES trims them from the list in one step that checks the list still starts with them and advances the cold hash's field `ch` (`<chunks>|<writes>` moved).
Positions never change (each chunk carries its own), the list keeps at least one chunk, so its head's position
is where Redis's part of the log starts: a page below it (the READ script answers 7) reads the chunks it needs
from PostgreSQL (`cold_changes`), then Redis's.

Per namespace, the hash `keel:{<ns>}:cold` holds the policy overrides (`after`: a duration or `never`, over
the cartridge's `history.cold_after`) and what the mover saw at its last pass (`keel status` shows it).
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, NamedTuple, Protocol

from ...errors import ColdTierNotConfigured, ColdTierUnavailable
from .codec import decode_point
from .keys import COLD, gen_keys
from .transport import chunks, eval_many, pipelined

# keys.COLD, per generation: hash `<escaped entity>|<n>` -> SHA-1 of each cold closed segment
CHANGES_MOVED = "ch"           # ... and its field `ch` -> `<chunks>|<writes>`: the change log's chunks moved
KEEP_CHUNKS = 256              # the change log's newest chunks that always stay in Redis (recent pages, appends)
Piece = tuple[str, int]        # (escaped entity, segment number)
OLDEST = -(2 ** 53)            # the newest point of a segment without delta rows (only a restatement): any age

# KEYS: 1 the tenant's gen key, 2 the closed segment, 3 the generation's cold hash.
# ARGV: 1 the generation the copy was made from, 2 field `<escaped entity>|<n>`, 3 SHA-1 of the copy.
# Answers 1 (deleted and recorded cold), 2 (already cold), 0 (the generation is no longer current: nothing
# done, the copy is to be forgotten), 3 (neither in Redis nor cold: nothing done), 4 (content differs from
# the copy: nothing done).
MOVE = """
if (redis.call('GET', KEYS[1]) or '1') ~= ARGV[1] then return 0 end
local body = redis.call('GET', KEYS[2])
if not body then
  if redis.call('HEXISTS', KEYS[3], ARGV[2]) == 1 then return 2 end
  return 3
end
if redis.sha1hex(body) ~= ARGV[3] then return 4 end
redis.call('UNLINK', KEYS[2])
redis.call('HSET', KEYS[3], ARGV[2], ARGV[3])
return 1
"""

# KEYS: 1 the tenant's gen key, 2 the change log (list), 3 the generation's cold hash.
# ARGV: 1 the generation the copy was made from, 2 how many chunks were copied (k, from the list's head), 3 the
# position of the first, 4 the position after the last (of chunk k + 1).
# Answers 1 (the k chunks trimmed and `ch` advanced, in one step), 2 (already trimmed: the list starts at or
# after ARGV[4]), 0 (the generation is no longer current), 4 (the list's head is not what was copied: nothing
# done). The list always keeps its chunk k + 1 (the mover never copies the last one), so it is never emptied:
# its head's position says where Redis's part of the log starts.
TRIM_CHANGES = """
if (redis.call('GET', KEYS[1]) or '1') ~= ARGV[1] then return 0 end
local k = tonumber(ARGV[2])
local function pos(i)
  local e = redis.call('LINDEX', KEYS[2], i)
  return e and tonumber(string.match(e, '^c(%d+)|'))
end
local head = pos(0)
if head and head >= tonumber(ARGV[4]) then return 2 end
if head ~= tonumber(ARGV[3]) or pos(k) ~= tonumber(ARGV[4]) then return 4 end
redis.call('LTRIM', KEYS[2], k, -1)
local c = string.match(redis.call('HGET', KEYS[3], 'ch') or '0|0', '^(%d+)|')
redis.call('HSET', KEYS[3], 'ch', string.format('%d', tonumber(c) + k) .. '|' .. ARGV[4])
return 1
"""


class ColdTier(Protocol):
    """What the store needs of the cold tier (keel.cold_pg.ColdStore implements it)."""

    def put(self, namespace: str, tenant: str, gen: int, pieces: Sequence[tuple[str, int, str, str]]) -> None: ...
    def fetch(self, namespace: str, tenant: str, gen: int, pieces: Sequence[Piece]) -> dict[Piece, str]: ...
    def forget(self, namespace: str, tenant: str, gen: int, pieces: Sequence[Piece]) -> int: ...
    def drop_generation(self, namespace: str, tenant: str, gen: int) -> int: ...
    def drop_tenant(self, namespace: str, tenant: str) -> int: ...
    def drop_namespace(self, namespace: str) -> int: ...
    def generations(self, namespace: str) -> list[tuple[str, int]]: ...
    def sizes(self, namespace: str) -> tuple[int, int, int]: ...
    def put_changes(self, namespace: str, tenant: str, gen: int, chunks: Sequence[tuple[int, int, int, str]]
                    ) -> None: ...
    def changes(self, namespace: str, tenant: str, gen: int, below: int, count: int, *, start: int | None = None,
                since: int | None = None) -> list[str]: ...
    def change_sizes(self, namespace: str) -> tuple[int, int, int]: ...
    def close(self) -> None: ...


class ColdTierHost(Protocol):
    """What this module uses of segment_store.RedisStore (named here, not imported: that module imports this
    one, through the store's generations)."""
    namespace: str
    cold: ColdTier | None
    _cold_move: Any

    @property
    def client(self) -> Any: ...
    def data_prefix(self, tenant: str, gen: int) -> str: ...
    def tenant_keys(self, tenant: str) -> Any: ...
    def current_generation(self, tenant: str) -> int: ...
    def _guard(self, what: str, tenant: str | None = None) -> AbstractContextManager[None]: ...


class Candidate(NamedTuple):
    """A closed segment still in Redis: where it is, the greatest valid time of its delta rows, its size."""
    entity: str        # escaped
    n: int
    newest: int
    size: int


def content_hash(body: str) -> str:
    """SHA-1 of a segment's UTF-8 bytes, hex: what MOVE's `redis.sha1hex` computes of the same string (and
    keel.cold_pg checks on every read)."""
    return hashlib.sha1(body.encode()).hexdigest()


def settings_key(namespace: str) -> str:
    """The namespace's cold-tier hash: policy overrides and the mover's last report."""
    return f"keel:{{{namespace}}}:cold"


def generation_of(prefix: str) -> int:
    """The generation of a data prefix `keel:{…}:g<N>:`."""
    return int(prefix[prefix.rindex(":g") + 2:-1])


def fill(store: ColdTierHost, tenant: str, gen: int, missing: Sequence[Piece]) -> dict[Piece, str]:
    """The bodies of closed segments a read found missing in Redis, from the cold tier; ColdTierNotConfigured
    when this process has none, ColdTierUnavailable when it is down or lacks one of them."""
    if not missing:
        return {}
    cold: ColdTier | None = store.cold
    if cold is None:
        raise ColdTierNotConfigured(store.namespace, tenant)
    return cold.fetch(store.namespace, tenant, gen, missing)


def fill_current(store: ColdTierHost, tenant: str, gen: int, missing: Sequence[Piece]) -> dict[Piece, str] | None:
    """`fill` for a read that follows the tenant's current generation: None when the pieces are missing because
    a cut-over happened meanwhile (it drops the old generation's rows first): read the new generation."""
    try:
        return fill(store, tenant, gen, missing)
    except ColdTierUnavailable:
        if store.current_generation(tenant) != gen:
            return None
        raise


def candidates(store: ColdTierHost, tenant: str, gen: int) -> list[Candidate]:
    """The closed segments of a tenant's generation still in Redis, with their newest valid time (from the
    valid-time index `v:`, no segment read) and size."""
    d = store.data_prefix(tenant, gen)
    client = store.client
    with store._guard("cold candidates", tenant):
        k = gen_keys(d)
        counts, cold = pipelined(client, [("HGETALL", k.closed), ("HKEYS", k.cold)])
    if isinstance(counts, list):          # the raw reply of HGETALL through `pipelined` is a flat list
        counts = dict(zip(counts[::2], counts[1::2]))
    cold_set = set(cold or [])
    wanted = {e: [n for n in range(int(c)) if f"{e}|{n}" not in cold_set] for e, c in (counts or {}).items()}
    wanted = {e: ns for e, ns in wanted.items() if ns}
    out: list[Candidate] = []
    for chunk in chunks(list(wanted), 500):
        calls: list[tuple[str, ...]] = [("ZRANGE", k.valid_index(e), "0", "-1") for e in chunk]
        calls += (("STRLEN", k.closed_segment(e, n)) for e in chunk for n in wanted[e])
        with store._guard("cold candidates", tenant):
            got = pipelined(client, calls)
        sizes = iter(got[len(chunk):])
        for e, members in zip(chunk, got[:len(chunk)]):
            newest = _newest(members or [])
            for n in wanted[e]:
                size = int(next(sizes))
                if size:
                    out.append(Candidate(e, n, newest.get(n, OLDEST), size))
    return out


def _newest(members: Iterable[str]) -> dict[int, int]:
    """Per closed segment n, the greatest point of its delta rows, from index members `<P><lo9><hi9><n>` (P
    ends with `|`, which neither a point nor n holds; flags `<P>!`, `<P>#` have no points)."""
    out: dict[int, int] = {}
    for m in members:
        tail = m[m.rindex("|") + 1:]
        if len(tail) < 19:
            continue
        n, hi = int(tail[18:]), decode_point(tail[9:18])
        if hi > out.get(n, OLDEST):
            out[n] = hi
    return out


def move(store: ColdTierHost, tenant: str, gen: int, pieces: Sequence[Candidate]) -> tuple[int, int]:
    """Move closed segments of one generation to the cold tier: copy (one PostgreSQL transaction), then MOVE
    each (one round trip). Returns (segments moved, their bytes). A segment whose generation stopped being
    current meanwhile is forgotten in PostgreSQL again (its generation is being dropped)."""
    cold = store.cold
    if cold is None:
        raise ColdTierNotConfigured(store.namespace, tenant)
    d = store.data_prefix(tenant, gen)
    client = store.client
    with store._guard("cold move", tenant):
        bodies = pipelined(client, [("GET", gen_keys(d).closed_segment(c.entity, c.n)) for c in pieces])
    rows = [(c.entity, c.n, content_hash(b), b) for c, b in zip(pieces, bodies) if isinstance(b, str) and b]
    if not rows:
        return 0, 0
    cold.put(store.namespace, tenant, gen, rows)
    gen_key = store.tenant_keys(tenant).gen
    k = gen_keys(d)
    calls = [([gen_key, k.closed_segment(e, n), k.cold], [str(gen), f"{e}|{n}", sha]) for e, n, sha, _ in rows]
    with store._guard("cold move", tenant):
        answers = eval_many(client, store._cold_move, calls)
    moved = nbytes = 0
    stale: list[Piece] = []
    for (e, n, _, body), answer in zip(rows, answers):
        code = int(answer)
        if code == 1:
            moved += 1
            nbytes += len(body.encode())
        elif code == 0:
            stale.append((e, n))
        elif code == 4:
            raise ColdTierUnavailable(f"a closed segment of tenant {tenant!r} changed while it was copied "
                                      f"(generation {gen}); not moved", tenant=tenant)
    if stale:
        cold.forget(store.namespace, tenant, gen, stale)
    return moved, nbytes


def cold_count(store: ColdTierHost, tenant: str, gen: int) -> int:
    """How many closed segments of a generation are cold."""
    d = gen_keys(store.data_prefix(tenant, gen)).cold
    with store._guard("cold count", tenant):
        n, marker = pipelined(store.client, [("HLEN", d), ("HEXISTS", d, CHANGES_MOVED)])
    return int(n) - int(marker)


def changes_moved(store: ColdTierHost, tenant: str, gen: int) -> tuple[int, int]:
    """(chunks, writes) of a generation's change log moved to the cold tier."""
    with store._guard("cold count", tenant):
        marker = store.client.hget(gen_keys(store.data_prefix(tenant, gen)).cold, CHANGES_MOVED)
    chunks_, writes = (marker or "0|0").split("|")
    return int(chunks_), int(writes)


def _heads(elements: Sequence[str]) -> list[tuple[int, int, int]]:
    """(position, writes, recorded_at) of change-log chunks `c<position>|<writes>|<recorded_at>|...`."""
    out = []
    for e in elements:
        p, w, r = e.split("|", 3)[:3]
        out.append((int(p[1:]), int(w), int(r)))
    return out


def move_changes(store: ColdTierHost, tenant: str, gen: int, *, keep: int = KEEP_CHUNKS, batch: int = 200,
                 stop: Any = None) -> tuple[int, int]:
    """Move a generation's oldest change-log chunks to the cold tier: all but the newest `keep` (at least 1),
    `batch` at a time, each batch copied (one PostgreSQL transaction) then trimmed from the list's head by
    TRIM_CHANGES (one atomic step, with the `ch` marker). A kill at any point leaves each chunk in Redis, in PostgreSQL or both, and positions unchanged.
    Returns (chunks moved, their bytes). `stop`: an Event checked between batches."""
    cold = store.cold
    if cold is None:
        raise ColdTierNotConfigured(store.namespace, tenant)
    d = store.data_prefix(tenant, gen)
    key, gen_key = gen_keys(d).changes, store.tenant_keys(tenant).gen
    client = store.client
    trim = client.register_script(TRIM_CHANGES)        # a local object (SHA-1 of the text): EVALSHA, once loaded
    moved = nbytes = 0
    while stop is None or not stop.is_set():
        with store._guard("cold move of the change log", tenant):
            n = int(client.llen(key))
            room = n - max(1, keep)
            if room <= 0:
                break
            elements = list(client.lrange(key, 0, min(room, batch) - 1))
        heads = _heads(elements)
        cold.put_changes(store.namespace, tenant, gen, [(*h, e) for h, e in zip(heads, elements)])
        end = heads[-1][0] + heads[-1][1]
        with store._guard("cold move of the change log", tenant):
            code = int(trim(keys=[gen_key, key, gen_keys(d).cold], args=[str(gen), str(len(heads)), str(heads[0][0]),
                                                                 str(end)]))
        if code == 1:
            moved += len(heads)
            nbytes += sum(len(e) for e in elements)
        elif code == 0:
            break                       # the generation is being dropped (archive's sweep deletes such rows)
        elif code == 4:
            raise ColdTierUnavailable(f"the change log of tenant {tenant!r} changed while its chunks were copied "
                                      f"(generation {gen}); not moved", tenant=tenant)
    return moved, nbytes


def cold_changes(store: ColdTierHost, tenant: str, gen: int, below: int, count: int, start: int | None,
                 since: int | None) -> list[str] | None:
    """The cold chunks a page of the change log needs (ColdTier.changes), for a read that follows the tenant's
    current generation: None when they are missing because a cut-over happened meanwhile (read the new one);
    ColdTierNotConfigured when this process has no cold tier, ColdTierUnavailable when it is down or lacks
    them."""
    cold: ColdTier | None = store.cold
    if cold is None:
        raise ColdTierNotConfigured(store.namespace, tenant)
    try:
        return cold.changes(store.namespace, tenant, gen, below, count, start=start, since=since)
    except ColdTierUnavailable:
        if store.current_generation(tenant) != gen:
            return None
        raise


__all__ = [
    "CHANGES_MOVED",
    "COLD",
    "KEEP_CHUNKS",
    "MOVE",
    "TRIM_CHANGES",
    "Candidate",
    "ColdTier",
    "Piece",
    "candidates",
    "changes_moved",
    "cold_changes",
    "cold_count",
    "content_hash",
    "fill",
    "fill_current",
    "generation_of",
    "move",
    "move_changes",
    "settings_key",
]
