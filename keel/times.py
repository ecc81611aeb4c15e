"""World and record times: parsed once into integer microseconds since the epoch (UTC).

Integers compare fast, sort exactly and serialize canonically; `format_time` turns them back into
RFC 3339 with a `Z`.
"""
from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache

from .errors import BadTime

Micros = int
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_NAIVE = datetime(1970, 1, 1)
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_CACHE: dict[str, Micros] = {}
_CACHE_MAX = 65536


def parse_time(value: object) -> Micros:
    """RFC 3339 string, date string, datetime, date or micros → micros. Raises BadTime."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        hit = _CACHE.get(value)
        if hit is not None:
            return hit
        micros = _parse_text(value)
        if len(_CACHE) < _CACHE_MAX:
            _CACHE[value] = micros
        return micros
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise BadTime(value)
        return _to_micros(value)
    if isinstance(value, date):
        return _to_micros(datetime(value.year, value.month, value.day, tzinfo=UTC))
    raise BadTime(value)


def _parse_text(text: str) -> Micros:
    try:
        if _DATE.match(text):
            d = date.fromisoformat(text)
            return _to_micros(datetime(d.year, d.month, d.day, tzinfo=UTC))
        if "T" not in text and "t" not in text:
            raise ValueError("no time part")
        dt = datetime.fromisoformat(text.replace("z", "Z"))
    except ValueError as e:
        raise BadTime(text) from e
    if dt.tzinfo is None:
        raise BadTime(text)
    return _to_micros(dt)


def _to_micros(dt: datetime) -> Micros:
    delta = dt - _EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def format_time(micros: Micros | None) -> str | None:
    """micros → `2026-10-01T00:00:00Z` (fractional seconds only when present)."""
    if micros is None:
        return None
    return _format(int(micros))


@lru_cache(maxsize=1 << 16)
def _format(micros: int) -> str:
    return (_EPOCH_NAIVE + timedelta(microseconds=micros)).isoformat() + "Z"


def format_day(micros: Micros | None) -> str:
    """micros → `2026-10-01` when at midnight, else the full RFC 3339 form; `None` → `open`."""
    if micros is None:
        return "open"
    text = format_time(micros)
    return text[:10] if text.endswith("T00:00:00Z") else text


def now_micros() -> Micros:
    """The wall clock, for callers outside the projection (tools, publishers) only."""
    return _to_micros(datetime.now(UTC))


_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: object) -> Micros | None:
    """`never` → None, `<n>s|m|h|d` → micros. Raises ValueError on anything else."""
    if text == "never":
        return None
    m = _DURATION.match(str(text))
    if not m:
        raise ValueError(f"bad duration {text!r}: use never or <n>s|m|h|d, e.g. 30d")
    return int(m.group(1)) * _UNIT[m.group(2)] * 1_000_000
