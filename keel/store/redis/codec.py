"""How assertions, points and provenance entries are written as Redis strings, and read back.

A member of an entity's sorted set is `<P><point><#b><b><#w><w><#k><k><body>` (see keys.py for P and the
layout); this module encodes the point and the body, decodes whole members, and turns the answers of the
READ and VIEW scripts back into timelines and entity views with keel.timeline's rules.
"""
from __future__ import annotations

import json
import math
from binascii import b2a_base64
from collections.abc import Callable
from typing import Any

from ...decoding import json_value
from ...errors import StoreUnavailable, UsageError
from ...timeline import Assertion, Timeline, Version, covering, version_at
from ...times import Micros
from ..base import EntityView, Freshness, Key, entity_view
from .keys import index_key, key_of

OFFSET = 2 ** 53                  # points are kept as point + 2**53 in 54 bits (exact as doubles too)
_OFFSET = OFFSET
_ALPHABET = "-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz"   # ASCII order
_DIGIT = {c: i for i, c in enumerate(_ALPHABET)}
_TO_ALPHABET = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", _ALPHABET)
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
STR = json.encoder.encode_basestring      # JSON string literal, non-ASCII kept (like ensure_ascii=False)
_STR = STR


def encode_point(point: int) -> str:
    """A point as 9 characters of _ALPHABET (6 bits each, most significant first: their order is the points'),
    by base64's C code: a shift puts the 54 bits of point + OFFSET first in 9 bytes, whose first 9 base64
    characters are those bits; a translation maps base64's alphabet onto _ALPHABET."""
    v = int(point) + _OFFSET
    if not 0 < v < 2 * _OFFSET:
        raise UsageError(f"time {point} (micros) is outside the range the Redis store keeps (±2**53)")
    return b2a_base64((v << 18).to_bytes(9, "big"), newline=False).decode("ascii")[:9].translate(_TO_ALPHABET)


def decode_point(text: str) -> Micros:
    v = 0
    for c in text:
        v = v * 64 + _DIGIT[c]
    return v - _OFFSET


def clamped_point(t: int) -> str:
    return encode_point(min(max(int(t), 1 - _OFFSET), _OFFSET - 1))


def json_text(value: Any) -> str:
    """Compact JSON of a value, with fast paths for the scalars most writes carry."""
    t = type(value)
    if t is str:
        return _STR(value)
    if t is int:
        return int.__repr__(value)
    if value is None:
        return "null"
    if t is bool:
        return "true" if value else "false"
    if t is float and math.isfinite(value):
        return float.__repr__(value)
    return _JSON.encode(value)


def encode_body(a: Assertion) -> str:
    if not a.closed:
        body = "=" + json_text(a.value)
    elif a.value is None:
        body = "-"
    else:
        body = "!" + json_text(a.value)
    if a.expires_at is not None:
        body = f"~{int(a.expires_at) - int(a.point)};{body}"
    return body


def encode_provenance(source: Any, evidence: Any, recorded_at: int, by: Any) -> str:
    """`[source, evidence, recorded_at]` or `[source, evidence, recorded_at, by]`."""
    if by is None:
        return f"[{json_text(source)},{json_text(evidence)},{recorded_at}]"
    return f"[{json_text(source)},{json_text(evidence)},{recorded_at},{json_text(by)}]"


def decode_member(rest: str) -> tuple[Micros, int, Any, bool, Micros | None]:
    """(point, provenance index, value, closed, expires_at) from a member with P removed."""
    point = decode_point(rest[:9])
    i = 9
    lb = ord(rest[i]) - 48
    b = int(rest[i + 1:i + 1 + lb])
    i += 1 + lb
    i += 1 + ord(rest[i]) - 48
    lk = ord(rest[i]) - 48
    k = int(rest[i + 1:i + 1 + lk])
    i += 1 + lk
    expires = None
    if rest[i] == "~":
        j = rest.index(";", i)
        expires = point + int(rest[i + 1:j])
        i = j + 1
    head = rest[i]
    if head == "=":
        return point, b + k, json_value(rest[i + 1:]), False, expires
    if head == "-":
        return point, b + k, None, True, expires
    return point, b + k, json_value(rest[i + 1:]), True, expires


def decode_provenance(text: str) -> tuple[Any, Any, Micros, Any]:
    """(source, evidence, recorded_at, by) of a provenance entry."""
    p = json_value(text)
    return p[0], p[1], int(p[2]), p[3] if len(p) > 3 else None


class ProvenanceCache:
    """Decoded provenance entries, by index; `fetch` reads one that is missing (written since loading)."""
    __slots__ = ("entries", "fetch")

    def __init__(self, fetch: Callable[[int], str | None] | None = None) -> None:
        self.entries: dict[int, tuple[Any, Any, Micros, Any]] = {}
        self.fetch = fetch

    def add(self, index: int, text: str | None) -> None:
        if text is None:
            raise StoreUnavailable(f"provenance entry {index} is missing (a generation dropped while read?)")
        self.entries[int(index)] = decode_provenance(text)

    def assertion(self, rest: str) -> Assertion:
        point, n, value, closed, expires = decode_member(rest)
        if n not in self.entries and self.fetch is not None:
            self.add(n, self.fetch(n))
        source, evidence, recorded_at, by = self.entries[n]
        return Assertion(point, value, closed, source, evidence, recorded_at, by, expires)



def timeline_of(members: list[str], prov: ProvenanceCache) -> Timeline:
    tl = Timeline()
    for m in members:
        tl.add(prov.assertion(m))
    return tl


def decode_view(entity: str, result: list[Any], at: Micros, known_at: Micros | None) -> EntityView | None:
    """An EntityView from the VIEW script's answer (None for an entity unknown at `known_at`)."""
    if len(result) == 1 or (known_at is not None and int(result[1]) > known_at):
        return None
    _, _, winners, timelines, pairs, fresh = result
    prov = ProvenanceCache()
    for i in range(0, len(pairs), 2):
        prov.add(pairs[i], pairs[i + 1])
    points: list[tuple[Key, Version | None]] = []
    relations: list[tuple[Key, Version | None]] = []
    for i in range(0, len(winners), 4):      # winner_at's answer: the member, 2 for a correction, next point9
        nxt = winners[i + 3]
        points.append((key_of(entity, winners[i])[0],
                       version_at(prov.assertion(winners[i + 1]), int(winners[i + 2]),
                                  decode_point(nxt) if nxt else None, at)))
    for i in range(0, len(timelines), 2):
        key, tl = index_key(entity, timelines[i]), timeline_of(timelines[i + 1], prov)
        if key[0] == "r":
            relations.append((key, covering(tl.runs(known_at), at)))
        else:
            points.append((key, tl.as_of(at, known_at)))
    return entity_view(entity, points, relations)._replace(freshness=freshness_of(fresh))


def freshness_of(values: list[Any]) -> Freshness:
    """Freshness from the meta hash's `kt` and `lag` (nil or false when absent)."""
    kt, lag = values
    return Freshness(int(kt) if kt else None, int(lag) if lag else None)
