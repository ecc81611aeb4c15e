"""The commands of one bulk-load step (keel.store.redis.loader): each entity's ZADD and index RPUSH.

A replay's step touches about as many new timelines as writes (most entities of a large tenant are written by
a few events). Giving each timeline a run of members of its own and grouping the runs by entity afterwards
(as APPLY's arguments are built) cost as much as encoding the members, so here the encoder
(batch.encode_writes) appends each member straight to its owner's list, and a timeline's index elements are
noted at its first write. The members, elements and order of each list are those APPLY leaves (keys.py).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..base import EventWrites, Key
from .batch import Entry, encode_writes
from .keys import escape

LOAD_ITEMS = 1000                 # members or elements per command of a bulk load


class Entities:
    """What a load knows of each entity it wrote: its first recorded_at (element 0 of its index list), its two
    key names, and the timelines that have members (their index elements are written)."""
    __slots__ = ("d", "first", "known", "names")

    def __init__(self, d: str) -> None:
        self.d = d
        self.first: dict[str, int] = {}           # entity -> min recorded_at written
        self.known: set[Key] = set()             # timelines with members
        self.names: dict[str, tuple[str, str]] = {}     # entity -> (sorted set key, index list key)

    def keys(self, entity: str) -> tuple[str, str]:
        names = self.names.get(entity)
        if names is None:
            e = escape(entity)
            names = self.names[entity] = (f"{self.d}z:{e}", f"{self.d}x:{e}")
        return names


def push(commands: list[tuple[str, ...]], name: str, key: str, items: list[str]) -> None:
    """`name key items...` in commands of at most LOAD_ITEMS items."""
    if len(items) <= LOAD_ITEMS:
        if items:
            commands.append((name, key, *items))
        return
    for i in range(0, len(items), LOAD_ITEMS):
        commands.append((name, key, *items[i:i + LOAD_ITEMS]))


def encode_step(events: Sequence[EventWrites], base: int, known: Entities,
                commands: list[tuple[str, ...]]) -> tuple[list[str], list[str], bool]:
    """Append to `commands` the SADD (`ents`), ZADD, LSET and RPUSH of one step's writes, `base` being the
    provenance list's length before it; returns its provenance entries, its relation timelines with an end or
    an expiry (members of the RELATION_ENDS set) and whether it has writes."""
    seen = known.known
    owners: dict[str, list[Any]] = {}     # entity -> [members, min recorded_at, new index elements or None]

    def timeline(key: Key, p: str, rec: int) -> Entry:
        """A timeline's first write in the step: its owner's entry and (a relation) its object's; a timeline new
        to the load also gets its index elements (P in its owner's list, `>owner|P` in its object's)."""
        owner = key[1]
        o = owners.get(owner)
        if o is None:
            o = owners[owner] = [[], rec, None]
        ob = None
        if key[0] == "r":
            ob = owners.get(key[3])
            if ob is None:
                ob = owners[key[3]] = [[], rec, None]
        if key not in seen:
            seen.add(key)
            if o[2] is None:
                o[2] = [p]
            else:
                o[2].append(p)
            if ob is not None and ob is not o:
                element = f">{escape(owner)}|{p}"
                if ob[2] is None:
                    ob[2] = [element]
                else:
                    ob[2].append(element)
        return p, o, ob

    provs, ends, wrote = encode_writes(events, base, timeline)
    first, keys_of = known.first, known.keys
    push(commands, "SADD", known.d + "ents", [e for e in owners if e not in first])   # before the keys it indexes
    last, text = None, ""                       # the last recorded_at written as text (most repeat)
    for e, (z, rec, elements) in owners.items():
        keys = keys_of(e)
        for i in range(0, len(z), LOAD_ITEMS):
            chunk = z[i:i + LOAD_ITEMS] if len(z) > LOAD_ITEMS else z     # no copy at the common size
            pairs = ["0"] * (2 * len(chunk))
            pairs[1::2] = chunk
            commands.append(("ZADD", keys[0], *pairs))
        f = first.get(e)
        if f is None or rec < f:
            first[e] = rec
            if rec != last:
                last, text = rec, str(rec)
            if f is None:
                elements = [text] if elements is None else [text, *elements]
            else:
                commands.append(("LSET", keys[1], "0", text))
        if elements is not None:
            push(commands, "RPUSH", keys[1], elements)
    return provs, ends, wrote
