"""The Redis key layout, defined once: key names, timeline prefixes and their escaping.

Every Python module that names a Redis key of Keel (the store, the bulk loader, the replay state, the cold tier)
builds it here; the Lua scripts build the per-entity names below from a prefix they are given, spelled as here
(segment_scripts.py).

Key layout (version 3, layout.py). Every key of a tenant carries the hash tag `{<namespace>/<tenant>}`, so a
tenant lives in one hash slot and its scripts and MULTI/EXEC blocks are legal on Cluster:

    keel:{<ns>}:tenants                    set: tenants ever written in the namespace (a registry)
    keel:{<ns>}:layout                     string: the layout version (layout.py), checked at start
    keel:{<ns>}:applied                    hash: `o["<topic>",<partition>]` -> the offset through which every
                                           record of the partition is applied (where a worker resumes)
    keel:{<ns>}:watermarked                string "1": set before the namespace's first write, so every write
                                           is under a watermark (a partition without one holds nothing)
    keel:{<ns>}:cold                       hash: the cold tier's policy override and the mover's last pass (cold.py)
    keel:{<ns>}:dlq:seen, keel:{<ns>}:dlq:count   dead letters counted once per source record (workers/dlq.py)
    keel:{<ns>/<t>}:gen                    string: the current generation (absent = 1)
    keel:{<ns>/<t>}:gseq                   string: the highest generation handed out
    keel:{<ns>/<t>}:replay                 string: the marker of a replay in progress (workers/replay_state.py)

and per generation N, after its data prefix `d` = `keel:{<ns>/<t>}:g<N>:` (GenerationKeys):

    d e:<b>       hash: bucket b of the applied event ids, id -> its packed mark (event_ids.py: `<content hash>
                  <where first seen>` in about 15 bytes, exact; "" for an id without one); buckets 0 to `eb` - 1,
                  by linear hashing of the id (lua.STEP_IDS), about 64 ids each: small enough for Redis to keep each
                  one as a listpack (about 33 bytes per id and mark, bench/cold_tier.py)
    d m           hash: `sv` (write counter, the search version), applied offsets, `rl` (the latest recorded_at
                  of an applied event), `kt` (latest recorded_at of a write applied), `lag` (at the last commit),
                  `ne` (event ids applied) and `eb` (their buckets; absent: one)
    d fr          hash: entity -> the least recorded_at of the writes involving it (its first); its fields
                  are the generation's entities (its explicit index)
    d ch          list: every write applied, in apply order, in compressed chunks (changelog.py)
    d sg          hash: escaped entity -> how many of its segments are closed
    d s:<e>       string: the entity's open segment (segments.py); `d s:<e>|<n>` its closed segment n
    d v:<e>       sorted set: the valid-time index of its closed segments (segment_scripts.py)
    d k:<e>       sorted set: the recorded-time index of its closed segments (segment_scripts.py)
    d i:<e>       set: `>` + escaped subject + `|` + P of each relation naming the entity as object
    d cz          hash: `<e>|<n>` -> SHA-1 of each closed segment moved to the cold tier (cold.py)

`<e>` is the escaped entity name. A timeline is owned by the entity in its key's second place (the subject of a
relation); P, the timeline prefix, is the key's kind, then each key part after the owner, each followed by `|`
(`f|balance|` + scope + `|`, `l|ref|`, `r|owed_by|household:h1|`, `e|`); parts are escaped (`%` → `%25`, `|` →
`%7C`), so prefixes are prefix-free. A point is valid time in micros + 2**53, as 9 base-64 characters of an
alphabet in ASCII order (codec.py). Namespace and tenant match the tenant pattern (no braces), so the hash tag is
always ours; entity names are escaped like key parts, so no user string can forge a key.
"""
from __future__ import annotations

import json
import re

from ...errors import UsageError
from ...identifiers import TENANT
from ..base import GLOBAL_TENANT, Key

ARITY = {"e": 0, "l": 1, "f": 2, "r": 2}      # key parts after the owner, by timeline kind
# The fixed keys of a generation, after its data prefix: present exactly when it holds data (segment_scripts.py).
DATA_KEYS = ("m", "fr")
# The names only a generation written in the removed layout 1 has: fixed keys, then per-entity prefixes. Kept so
# that the replay converting such a namespace drops its old generations whole (generations.droppable_keys).
LAYOUT1_KEYS = ("pv", "re")
LAYOUT1_ENTITY_KEYS = ("z:", "x:")
# Likewise for layout 2: its applied-ids set and its marks hash, replaced by layout 3's buckets (`e:<b>`), and its
# entity set (layout 1's too), which repeated the fields of `fr`.
OLD_ENTITY_SET = "ents"
LAYOUT2_KEYS = ("ev", "eh", OLD_ENTITY_SET)
IDS = "ne"               # field of `m`: how many event ids the generation applied
BUCKETS = "eb"           # field of `m`: how many buckets hold them (absent: one)
CHANGES = "ch"           # the generation's change log (changelog.py)
COLD = "cz"              # the generation's closed segments moved to the cold tier (cold.py)
LATEST = "rl"            # field of `m`: the latest recorded_at of an applied event
_ESCAPED = re.compile(r"%(25|7C)")
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def escape(part: str) -> str:
    return part.replace("%", "%25").replace("|", "%7C") if ("%" in part or "|" in part) else part


def unescape(part: str) -> str:
    return _ESCAPED.sub(lambda m: "%" if m.group(1) == "25" else "|", part) if "%" in part else part


def prefix_of(key: Key) -> str:
    """The timeline prefix P of a key inside its owner's sorted set."""
    kind = key[0]
    if kind == "f" and len(key) == 4:
        return f"f|{escape(key[2])}|{escape(key[3])}|"
    if kind == "l" and len(key) == 3:
        return f"l|{escape(key[2])}|"
    if kind == "r" and len(key) == 4:
        return f"r|{escape(key[2])}|{escape(key[3])}|"
    if kind == "e" and len(key) == 2:
        return "e|"
    raise UsageError(f"bad timeline key {key!r}")


def key_of(owner: str, text: str) -> tuple[Key, int]:
    """(key, length of P) from an owner and a string starting with P."""
    kind = text[0]
    parts: list[str] = [kind, owner]
    i = 2
    for _ in range(ARITY[kind]):
        j = text.index("|", i)
        parts.append(unescape(text[i:j]))
        i = j + 1
    return tuple(parts), i



def check_name(what: str, name: str, allow_global: bool = False) -> str:
    if not isinstance(name, str) or not (TENANT.match(name) or (allow_global and name == GLOBAL_TENANT)):
        raise UsageError(f"bad {what} {name!r}: use [A-Za-z0-9][A-Za-z0-9._-]{{0,63}}")
    return name


def generation_of(stored: str | None) -> int:
    """The generation a tenant's `gen` key holds: absent is 1 (as lua.GEN_CHECK reads it)."""
    return int(stored or 1)


class TenantKeys:
    """Key names of one tenant: `gen`, `gseq`, the replay marker and the data prefix of each generation."""
    __slots__ = ("base", "gen", "gseq", "replay")

    def __init__(self, namespace: str, tenant: str) -> None:
        self.base = f"keel:{{{namespace}/{tenant}}}:"
        self.gen = self.base + "gen"
        self.gseq = self.base + "gseq"
        self.replay = self.base + "replay"

    def data(self, gen: int) -> str:
        return f"{self.base}g{gen}:"

    def data_keys(self, gen: int) -> list[str]:
        """The fixed keys of a generation: present exactly when it holds data."""
        return GenerationKeys(self.data(gen)).fixed


class GenerationKeys:
    """Key names of one generation of a tenant, from its data prefix `d` (TenantKeys.data): the fixed keys as
    attributes, the per-entity ones by method (each taking the escaped entity name)."""
    __slots__ = ("changes", "closed", "cold", "d", "first", "id_buckets", "known_indexes", "meta",
                 "segments", "valid_indexes")

    def __init__(self, d: str) -> None:
        self.d = d
        self.id_buckets = d + "e:"         # the prefix of the event ids' buckets (lua.STEP_IDS appends b)
        self.meta = d + "m"
        self.first = d + "fr"
        self.changes = d + CHANGES
        self.closed = d + "sg"
        self.cold = d + COLD
        self.segments = d + "s:"          # the prefix of segment names (the scripts append the entity)
        self.valid_indexes = d + "v:"     # the prefix of valid-time index names (likewise)
        self.known_indexes = d + "k:"     # the prefix of recorded-time index names (likewise)

    @property
    def fixed(self) -> list[str]:
        """The fixed keys (DATA_KEYS): present exactly when the generation holds data."""
        return [self.d + x for x in DATA_KEYS]

    def id_bucket(self, b: int) -> str:
        return f"{self.id_buckets}{b}"

    def open_segment(self, e: str) -> str:
        return self.segments + e

    def closed_segment(self, e: str, n: int | str) -> str:
        return f"{self.segments}{e}|{n}"

    def valid_index(self, e: str) -> str:
        return self.valid_indexes + e

    def known_index(self, e: str) -> str:
        return self.known_indexes + e

    def incoming(self, e: str) -> str:
        return self.d + "i:" + e   # the scripts build no incoming names: no prefix attribute


_GENERATIONS: dict[str, GenerationKeys] = {}


def gen_keys(d: str) -> GenerationKeys:
    """The GenerationKeys of data prefix `d`, from a process-wide cache (a commit step asks for them)."""
    keys = _GENERATIONS.get(d)
    if keys is None:
        if len(_GENERATIONS) > 10_000:
            _GENERATIONS.clear()
        keys = _GENERATIONS[d] = GenerationKeys(d)
    return keys


def offset_field(topic: str, partition: int) -> str:
    return "o" + _JSON.encode([topic, int(partition)])



def index_key(entity: str, element: str) -> Key:
    """The timeline key of an index list element of `entity`."""
    if element[0] == ">":
        j = element.index("|")
        return key_of(unescape(element[1:j]), element[j + 1:])[0]
    return key_of(entity, element)[0]


def registry_key(namespace: str) -> str:
    """The set of tenants ever written in a namespace."""
    return f"keel:{{{namespace}}}:tenants"


def layout_key(namespace: str) -> str:
    """The layout version the namespace was written with (layout.py)."""
    return f"keel:{{{namespace}}}:layout"


def applied_key(namespace: str) -> str:
    """The partitions' applied watermarks of a namespace (Store.advance_partitions), fields offset_field."""
    return f"keel:{{{namespace}}}:applied"


def watermarked_key(namespace: str) -> str:
    """Present when the namespace was begun by a Keel that keeps applied watermarks (layout.py stamps it)."""
    return f"keel:{{{namespace}}}:watermarked"


def dead_letter_keys(namespace: str) -> tuple[str, str]:
    """(source records counted, counts by tenant) of a namespace's dead letters."""
    return f"keel:{{{namespace}}}:dlq:seen", f"keel:{{{namespace}}}:dlq:count"
