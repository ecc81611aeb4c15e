"""The Redis store as a package: one module per job, each importing only the ones listed before it.

    keys.py            the key layout (names, timeline prefixes, escaping), defined once
    transport.py       redis errors -> StoreUnavailable, pipelined commands, script calls, round-trip chunks
    retries.py         the generation retry: an attempt run again over what a switch interrupted
    connection.py      Redis clients from Keel's URLs (a node, a Cluster, Sentinel)
    layout.py          the namespace's layout stamp, checked when a process opens its store
    codec.py           points and JSON values as strings, and back
    lua.py             the Lua every script shares (generation check, commit checks, generation switches)
    changelog.py       a tenant's change log (Store.changes), written by the APPLY script
    batch.py           a commit step between tries, and what every writer's arguments share
    loader.py          BulkLoader, what a replay uses of a loader
    generations.py     generations: hand out, switch, drop (a part of RedisBase)
    starts.py, walks.py  what a worker's mirror reads first; the tenants and entities of a namespace
    store.py           RedisBase: connection, tenants, offsets, meta reads, generations (no entity data)
    segments.py, segment_scripts.py  an entity's segments, in Python and in Lua
    text_cache.py      what is derived from a segment's text (folds, decoded blocks), kept by that text
    segment_views.py, segment_past.py  views now, at past times and as known then, read from segments
    segment_loader.py  bulk loads of a replay's shadow generation (a BulkLoader)
    segment_store.py   RedisStore: RedisBase plus the entities' segments (the one Redis store)

`from keel.store.redis import RedisStore` (and the other names below) is the public import.
"""
from __future__ import annotations

from .codec import decode_point, encode_point
from .keys import TenantKeys, dead_letter_keys, key_of, prefix_of
from .loader import BulkLoader
from .segment_store import RedisStore
from .store import GenerationChanged, RedisBase
from .transport import guard

__all__ = ["BulkLoader", "GenerationChanged", "RedisBase", "RedisStore", "TenantKeys", "dead_letter_keys",
           "decode_point", "encode_point", "guard", "key_of", "prefix_of"]
