"""Values quoted back to people (reasons, terminal output): short, and with control characters escaped.

A bad line may carry a 10,000-character value or an ANSI escape sequence; quoting it whole floods the
terminal or lets the data drive it. Every message that quotes input goes through `quote`, every plain-text
rendering of stored text through `printable`.
"""
from __future__ import annotations

import re
from typing import Any

LIMIT = 200
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")     # and lone surrogates


def printable(text: str) -> str:
    """`text` with control characters (ANSI escapes, NUL, ...) and lone surrogates shown as \\x.. / \\u....
    escapes."""
    if not _CONTROL.search(text):
        return text
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 256 else f"\\u{ord(m.group()):04x}",
                        text)


def cut(text: str, limit: int = LIMIT) -> str:
    """At most about `limit` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters)"


def quote(value: Any, limit: int = LIMIT) -> str:
    """`repr(value)` for a message: control characters escaped (repr does that) and cut to `limit`."""
    return cut(repr(value), limit)
