"""How points and JSON values are written as Redis strings (9 sortable characters per point, the order of
the index members and of the Lua scripts' comparisons), and the meta hash's freshness read back."""
from __future__ import annotations

import json
import math
from binascii import b2a_base64
from typing import Any

from ...errors import UsageError
from ...times import Micros
from ..base import Freshness

OFFSET = 2 ** 53                  # points are kept as point + 2**53 in 54 bits (exact as doubles too)
_OFFSET = OFFSET
_ALPHABET = "-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz"   # ASCII order
_DIGIT = {c: i for i, c in enumerate(_ALPHABET)}
_TO_ALPHABET = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", _ALPHABET)
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_STR = json.encoder.encode_basestring     # JSON string literal, non-ASCII kept (like ensure_ascii=False)


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


def freshness_of(values: list[Any]) -> Freshness:
    """Freshness from the meta hash's `kt` and `lag` (nil or false when absent)."""
    kt, lag = values
    return Freshness(int(kt) if kt else None, int(lag) if lag else None)
