"""The Redis store as a package: one module per job, each importing only the ones listed before it.

    keys.py            the key layout (names, timeline prefixes, escaping), defined once
    transport.py       redis errors -> StoreUnavailable, pipelined commands, script calls, round-trip chunks
    retries.py         the generation retry: an attempt run again over what a switch interrupted
    connection.py      Redis clients from Keel's URLs (a node, a Cluster, Sentinel)
    layout.py          the namespace's layout stamp, checked when a process opens its store
    codec.py           points, assertion bodies and provenance entries as strings, and back
    lua.py             the Lua every script shares (generation check, commit checks, generation switches)
    scripts.py         layout 1's Lua scripts (each atomic on the tenant's hash slot)
    changelog.py       a tenant's change log (Store.changes), written by both layouts' APPLY scripts
    batch.py           a commit step encoded as the APPLY script's arguments
    bulk.py            a bulk-load step's commands (loader.py)
    loader.py          BulkLoader, what a replay uses of a loader; GenerationLoader: bulk loads of a
                       generation nobody reads yet (layout 1)
    generations.py     generations: hand out, switch, drop (a part of RedisStore)
    starts.py, walks.py  what a worker's mirror reads first; whole-tenant walks (parts of RedisStore)
    store.py           RedisStore: the Store contract in layout 1; which class serves a layout
    segments.py, segment_scripts.py  layout 2's segments, in Python and in Lua
    segment_loader.py  bulk loads in layout 2 (a BulkLoader)
    segment_store.py   SegmentStore: layout 2, built on RedisStore (it registers itself as layout 2's class
                       when this package imports it, so store.py never names it)

`from keel.store.redis import RedisStore` (and the other names below) is the public import.
"""
from __future__ import annotations

from .codec import decode_member, decode_point, encode_body, encode_point, encode_provenance
from .keys import TenantKeys, dead_letter_keys, key_of, prefix_of
from .loader import BulkLoader, GenerationLoader
from .segment_store import SegmentStore
from .store import GenerationChanged, RedisStore
from .transport import guard

__all__ = ["BulkLoader", "GenerationChanged", "GenerationLoader", "RedisStore", "SegmentStore", "TenantKeys",
           "dead_letter_keys", "decode_member", "decode_point", "encode_body", "encode_point", "encode_provenance",
           "guard", "key_of", "prefix_of"]
