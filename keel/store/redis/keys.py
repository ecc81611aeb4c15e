"""The Redis key layout, defined once: key names, timeline prefixes and their escaping.

Every module that names a Redis key of Keel (the store, the bulk loader, the replay state) builds it here.

Key layout. Every key of a tenant carries the hash tag `{<namespace>/<tenant>}`, so a tenant lives in
one hash slot and its scripts and MULTI/EXEC blocks are legal on Cluster:

    keel:{<ns>}:tenants                    set: tenants ever written in the namespace (a registry)
    keel:{<ns>}:layout                     string: the layout version (layout.py), checked at start
    keel:{<ns>}:applied                    hash: `o["<topic>",<partition>]` -> the offset through which every
                                           record of the partition is applied (where a worker resumes)
    keel:{<ns>}:watermarked                string "1": set before the namespace's first write, so every write
                                           is under a watermark (a partition without one holds nothing)
    keel:{<ns>/<t>}:gen                    string: the current generation (absent = 1)
    keel:{<ns>/<t>}:gseq                   string: the highest generation handed out
    keel:{<ns>/<t>}:replay                 string: the marker of a replay in progress (workers/replay_state.py)
    keel:{<ns>}:dlq:seen, keel:{<ns>}:dlq:count   dead letters counted once per source record (workers/dlq.py)
    keel:{<ns>/<t>}:g<N>:ev                set: applied event ids
    keel:{<ns>/<t>}:g<N>:eh                hash: event id -> its mark (`<content hash> <where first seen>`)
    keel:{<ns>/<t>}:g<N>:m                 hash: `sv` (write counter, the search version), applied offsets,
                                           `rl` (the latest recorded_at of an applied event)
                                           `kt` (latest recorded_at of a write applied), `lag` (at the last commit),
                                           `re` = 1 when `re` below was kept since the generation's first write
    keel:{<ns>/<t>}:g<N>:re                set: relation timelines holding an end or an expiry, as
                                           `<escaped owner>|<P>` (absent while there is none)
    keel:{<ns>/<t>}:g<N>:ents              set: the generation's entities (its explicit index)
    keel:{<ns>/<t>}:g<N>:pv                list: provenance entries `[source, evidence, recorded_at, by]`
    keel:{<ns>/<t>}:g<N>:ch                list: every write applied, in apply order, in compressed chunks
                                           (changelog.py; both layouts)
    keel:{<ns>/<t>}:g<N>:z:<entity>        sorted set: every assertion of the timelines the entity owns
    keel:{<ns>/<t>}:g<N>:x:<entity>        list: [first recorded_at, one element per timeline involving it]
    keel:{<ns>/<t>}:g<N>:cz                hash: layout 2's closed segments moved to the cold tier (cold.py)
    keel:{<ns>}:cold                       hash: the cold tier's policy override and the mover's last pass (cold.py)

A timeline is owned by the entity in its key's second place (the subject of a relation). All members
of an entity's sorted set have score 0 and sort by bytes:

    <P><point><#b><b><#w><w><#k><k><body>

* P, the timeline prefix: the key's kind, then each key part after the owner, each followed by `|`
  (`f|balance|` + scope + `|`, `l|ref|`, `r|owed_by|household:h1|`, `e|`); parts are escaped
  (`%` → `%25`, `|` → `%7C`), so prefixes are prefix-free and `[P` .. `(P~` is exactly one timeline.
* point: valid time in micros + 2**53, as 9 base-64 characters of an alphabet in ASCII order.
* b: the provenance list length when the event was applied, w: the write's index in its batch; at one
  point they order assertions by log order. k: the write's provenance entry is at index b + k.
* body: `=<json value>`, `-` (an end), `!<json value>` (an end carrying a value), optionally preceded
  by `~<expires_at - point>;`.
`#x` is the length of x as one digit. Assertions are decoded with keel.timeline rules on the way out.

A relation timeline outside `re` (in a generation whose `m` says `re` is kept) holds links only, so its
coalesced versions are one run from its first point: a view reads its first member, not all of them
(a relation linked again by every event would otherwise cost a read of every link).

An index list element is P for a timeline the entity owns, `>` + owner + `|` + P for a relation
naming it as object. Namespace and tenant match the tenant pattern (no braces), so the hash tag is
always ours; entity names are escaped like key parts, so no user string can forge a key.
"""
from __future__ import annotations

import json
import re

from ...errors import UsageError
from ...identifiers import TENANT
from ..base import GLOBAL_TENANT, Key

ARITY = {"e": 0, "l": 1, "f": 2, "r": 2}      # key parts after the owner, by timeline kind
# The fixed keys of a generation in each layout, after its data prefix: present exactly when it holds data.
# `ev`, `m` and `ents` are both layouts'; layout 1 adds its provenance list, layout 2 (segment_scripts.py)
# the first recorded_at of each entity.
LAYOUT1_DATA_KEYS = ("ev", "m", "ents", "pv")
LAYOUT2_DATA_KEYS = ("ev", "m", "ents", "fr")
MARKS = "eh"             # the generation's event marks (written only with events that carry marks)
RELATION_ENDS = "re"     # set of relation timelines with an end or expiry; also the `m` field saying it is kept
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



def ended_member(owner: str, prefix: str) -> str:
    """A relation timeline's member of the RELATION_ENDS set: its escaped owner, `|`, its P."""
    return f"{escape(owner)}|{prefix}"


def check_name(what: str, name: str, allow_global: bool = False) -> str:
    if not isinstance(name, str) or not (TENANT.match(name) or (allow_global and name == GLOBAL_TENANT)):
        raise UsageError(f"bad {what} {name!r}: use [A-Za-z0-9][A-Za-z0-9._-]{{0,63}}")
    return name


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
        """The fixed keys of a generation in layout 1 (its index: present exactly when the generation holds
        data; a probe of them finds a layout-2 generation too, by the keys both layouts share)."""
        d = self.data(gen)
        return [d + k for k in LAYOUT1_DATA_KEYS]


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


def entity_keys(d: str, entity: str) -> tuple[str, str]:
    """(sorted set, index list) of an entity in the generation whose data prefix is `d`."""
    e = escape(entity)
    return d + "z:" + e, d + "x:" + e
