"""What a handler may write and how big an envelope may be: the one place these rules are checked.

The graph holds pointers, not copies: a label or fact value is a JSON value of a few KiB at most, and a
document belongs behind a pointer in the entity's `ref`. Every write path (file mode, workers, replay) runs
handlers through keel.projector, which checks each value here as the handler writes it, so a value that
is not JSON (a set, a datetime, NaN) or too big refuses its whole event and never reaches a store.
"""
from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .times import Micros, parse_duration

KIB = 1024


class Limits(BaseModel):
    """The `limits:` section of cartridge.yaml; every field has a default."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    envelope_bytes: int = Field(default=256 * KIB, ge=1024)
    value_bytes: int = Field(default=4 * KIB, ge=64)
    future_tolerance: str = "5m"

    @field_validator("future_tolerance")
    @classmethod
    def _duration(cls, text: str) -> str:
        if parse_duration(text) is None:
            raise ValueError("use <n>s|m|h|d, e.g. 5m (never is not allowed here)")
        return text

    @property
    def future_micros(self) -> Micros:
        tolerance = parse_duration(self.future_tolerance)
        assert tolerance is not None
        return tolerance


class ValueRefused(ValueError):
    """A handler wrote a value that is not JSON or is over a limit (the projector names handler and event)."""


_PLAIN = (str, int, bool, type(None))


def check_value(value: Any, limit: int, what: str) -> None:
    """Raise ValueRefused unless `value` is a JSON value (finite numbers, string keys) whose encoding is at
    most `limit` bytes. `what` names the value in the message (`predicate balance`, `label name`)."""
    kind = type(value)
    if kind is str:
        if len(value) * 3 <= limit and value.isascii():     # the common case, without encoding
            return
        size = _utf8_size(value, what)
        if size > limit:
            _too_big(size, limit, what)
        return
    if kind in _PLAIN:
        return
    if kind is float:
        if math.isfinite(value):
            return
        raise ValueRefused(f"{what}: {value!r} is not a finite number; values must be JSON")
    problem = _not_json(value, "")
    if problem is not None:
        raise ValueRefused(f"{what}: {problem}; values must be JSON (string, finite number, boolean, null, "
                           f"list, object with string keys)")
    size = _utf8_size(json.dumps(value, ensure_ascii=False, separators=(",", ":")), what)
    if size > limit:
        _too_big(size, limit, what)


def _utf8_size(text: str, what: str) -> int:
    try:
        return len(text.encode())
    except UnicodeEncodeError:
        raise ValueRefused(f"{what}: the text holds a lone surrogate (half of a UTF-16 pair, like \\ud800), "
                           f"which is not a character; send valid Unicode") from None


def _too_big(size: int, limit: int, what: str) -> None:
    raise ValueRefused(f"{what}: value of {size} bytes is over the {limit}-byte limit (limits.value_bytes); "
                       f"the graph holds pointers: keep the document elsewhere and a pointer to it in `ref`")


def _not_json(value: Any, path: str) -> str | None:
    """Why a value is not plain JSON (with where inside it), or None."""
    kind = type(value)
    if kind in _PLAIN:
        return None
    if kind is float:
        return None if math.isfinite(value) else f"{value!r}{_at(path)} is not a finite number"
    if kind is list:
        for i, item in enumerate(value):
            problem = _not_json(item, f"{path}[{i}]")
            if problem is not None:
                return problem
        return None
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                return f"key {key!r}{_at(path)} is not a string"
            problem = _not_json(item, f"{path}.{key}")
            if problem is not None:
                return problem
        return None
    return f"a {kind.__name__}{_at(path)} is not a JSON value"


def _at(path: str) -> str:
    return f" at {path.lstrip('.')}" if path else ""
