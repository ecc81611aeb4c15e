"""The Redis store as a package: one module per job.

    keys.py         the key layout (names, timeline prefixes, escaping), defined once
    codec.py        points, assertion bodies and provenance entries as strings, and back
    batch.py        a commit step encoded as the APPLY script's arguments
    transport.py    redis errors -> StoreUnavailable, pipelined commands and script calls
    scripts.py      the Lua scripts (each atomic on the tenant's hash slot)
    store.py        RedisStore: the Store contract, reads and writes of the current generation
    generations.py  generations: hand out, switch, drop (a part of RedisStore)
    loader.py       GenerationLoader: bulk loads of a generation nobody reads yet

`from keel.store.redis import RedisStore` (and the other names below) is the public import.
"""
from __future__ import annotations

from .codec import decode_member, decode_point, encode_body, encode_point, encode_provenance
from .keys import TenantKeys, dead_letter_keys, key_of, prefix_of
from .loader import GenerationLoader
from .store import GenerationChanged, RedisStore
from .transport import guard

__all__ = ["GenerationChanged", "GenerationLoader", "RedisStore", "TenantKeys", "dead_letter_keys", "decode_member",
           "decode_point", "encode_body", "encode_point", "encode_provenance", "guard", "key_of", "prefix_of"]
