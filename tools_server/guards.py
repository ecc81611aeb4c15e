"""Argument limits the server enforces before calling Tools, where keel.tools does not (yet).

Each one is a candidate to move into keel.tools; until then it keeps a hostile client from writing
megabytes into the log through `annotate`.
"""
from __future__ import annotations

import json
from typing import Any

from keel.errors import UsageError
from keel.tools import MAX_TEXT


def check_note_value(value: Any) -> None:
    """A note's value: any JSON, at most MAX_TEXT characters once serialized."""
    try:
        size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
    except (TypeError, ValueError, RecursionError):
        raise UsageError("value: give text, a number or a JSON object") from None
    if size > MAX_TEXT:
        raise UsageError(f"value: at most {MAX_TEXT} characters of JSON (got {size}); keep notes short")
