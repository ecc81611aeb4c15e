"""The arguments of the five tools, checked the same way for every caller (Tools, ToolSet, the MCP server and
the CLI): times, entity names, optional texts, a note's value, the choice between an entity's history and the
tenant's changes, and a page's limit. Each refusal is a UsageError whose message says what to give.

One rule for every optional argument (`given`, `flag`, `count`): absent, null and the empty value of its type
where that value means nothing (`""` for a name, a text or a time; false for a flag; the default for a number)
all mean "not given". A caller in OpenAI's strict mode sends every property, the unused ones empty, and must get
the answer of the minimal call; only a real request for two things that cannot go together is refused."""
from __future__ import annotations

import json
from datetime import date, datetime
from typing import Any, NamedTuple

from .changes import DEFAULT_CHANGES, MAX_CHANGES
from .errors import UsageError
from .identifiers import ENTITY
from .limits import ValueRefused, check_value
from .times import Micros, parse_time

MAX_RESULTS = 100          # search's limit
DEFAULT_RESULTS = 10

Time = str | date | datetime | None
"""A time argument: RFC 3339 text or a date (`2026-09-15`), a `date` (midnight UTC), an aware `datetime`."""


def entity_arg(entity: object) -> str:
    if not isinstance(entity, str) or len(entity) > 300 or not ENTITY.fullmatch(entity):
        raise UsageError(f"entity {clip(entity)}: use '<entity type>:<id>', e.g. from search results")
    return entity


def note_value(value: Any, limit: int) -> Any:
    """A note's value: any JSON of at most `limit` bytes (the cartridge's limits.value_bytes) in UTF-8, the
    check the projector makes when the note is applied (keel.limits.check_value), so a note this passes is
    never refused for its size after it reached the log (events file or Kafka topic). Returns the value as
    JSON reads it back: a copy, so the caller's object stays theirs."""
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        raise UsageError("value: give text, a number or a JSON object") from None
    try:
        check_value(value, limit, "value")
    except ValueRefused as e:       # measured as check_value measures: a string's text, else its JSON
        size = len((value if isinstance(value, str) else text).encode("utf-8", "surrogatepass"))
        if size <= limit:
            raise UsageError(str(e)) from None
        raise UsageError(f"value: at most {limit} bytes of JSON in UTF-8 (got {size}; a character outside ASCII "
                         f"takes 2 to 4); keep notes short, and put a document behind a pointer") from None
    return json.loads(text)


def clip(value: object, limit: int = 60) -> str:
    """A repr short enough for an error message an agent reads."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def given(value: Any) -> Any:
    """An optional argument as given: None when absent, null or `""` (the rule above), else the value itself."""
    return None if value is None or (isinstance(value, str) and value == "") else value


def flag(value: object, name: str, meaning: str) -> bool:
    """A flag: true, or false when false, null or absent."""
    if value is None or value is False:
        return False
    if value is True:
        return True
    raise UsageError(f"{name}: true ({meaning}) or false, got {clip(value)}")


def count(value: object, name: str, default: int, maximum: int) -> int:
    """A number of results: `default` when absent or null, else an integer from 1 to `maximum`."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise UsageError(f"{name}: an integer from 1 to {maximum} (default {default})")
    return value


class HistoryArgs(NamedTuple):
    """`history`'s arguments after the rule: `entity` None asks for the tenant's changes."""
    entity: str | None
    predicate: str | None
    known_at: Time
    since: Time
    type: str | None
    cursor: str | None
    limit: int


def history_args(entity: object, predicate: object, known_at: object, since: object, type: object,
                 cursor: object, limit: object) -> HistoryArgs:
    """Which history a call of `history` asks for (Tools and ToolSet): an entity's, or the tenant's changes when
    no entity is given. An argument of the other kind that is really given (not empty, a limit other than the
    default) is a contradiction (UsageError)."""
    entity, predicate, known_at, since, type, cursor = (given(v) for v in (entity, predicate, known_at, since,
                                                                             type, cursor))
    pages = count(limit, "limit", DEFAULT_CHANGES, MAX_CHANGES)
    if entity is None:
        if predicate is not None or known_at is not None:
            raise UsageError("predicate and known_at go with an entity; without one, history lists the "
                             "changes since `since`")
    elif since is not None or type is not None or cursor is not None or pages != DEFAULT_CHANGES:
        raise UsageError("since, type, cursor and limit go without an entity (the tenant's changes); "
                         "leave them empty to read the entity's history, or leave entity empty to list changes")
    return HistoryArgs(entity, predicate, known_at, since, type, cursor, pages)


def time_arg(value: object, name: str) -> Micros | None:
    """A time argument: text (RFC 3339 or a date), a date (midnight UTC) or an aware datetime (JSON gives
    text only, so the MCP tools see the first kind); None when not given."""
    if given(value) is None:
        return None
    if isinstance(value, datetime) and (value.tzinfo is None or value.utcoffset() is None):
        raise UsageError(f"{name}: {clip(value)} has no time zone; give an aware datetime, e.g. "
                         f"datetime(2026, 9, 15, tzinfo=timezone.utc)")
    try:
        return parse_time(value if isinstance(value, date) else str(value))
    except UsageError:
        raise UsageError(f"{name}: {clip(value)} is neither RFC 3339 (2026-09-15T00:00:00Z) nor a date "
                         f"(2026-09-15)") from None


def opt_text(value: object, name: str) -> str | None:
    """An optional text of at most 256 characters; None when not given."""
    if given(value) is None:
        return None
    if not isinstance(value, str) or len(value) > 256:
        raise UsageError(f"{name}: expected a string of at most 256 characters, got {clip(value)}")
    return value
