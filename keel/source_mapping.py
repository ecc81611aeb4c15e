"""Mapping one captured change with a compiled `sources:` entry (keel/sources.py): its columns converted to
their declared types, its `when:` evaluated, its envelopes built, their ids derived (the rules are in
keel/sources.py's docstring). Raises Unmappable for a change that cannot map; a reason never holds a value."""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from datetime import timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

import msgspec

from .errors import BadTime
from .sources import (
    _EPOCH,
    RETRACTED,
    Change,
    CompiledSource,
    Mapped,
    Ref,
    SourceSpec,
    Template,
    Unmappable,
    Value,
    _Entry,
)
from .times import format_time, parse_time

__all__ = ["Change", "Mapped", "Unmappable", "map_change", "source_for_table"]


def _convert(value: Any, kind: str, column: str) -> Any:
    """A column's wire value as its declared type's JSON value (Unmappable when it is not one)."""
    if value is None:
        return None
    try:
        if kind == "string":
            if isinstance(value, str):
                return value
        elif kind == "integer":
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
                return int(value)
        elif kind == "number":
            if isinstance(value, int | float) and not isinstance(value, bool):
                return value
            if isinstance(value, str):
                d = Decimal(value.strip())
                if not d.is_finite():
                    raise InvalidOperation
                return int(d) if d == d.to_integral_value() else float(d)
        elif kind == "boolean":
            if isinstance(value, bool):
                return value
        elif kind == "date":
            if isinstance(value, int) and not isinstance(value, bool):       # days since 1970-01-01
                return (_EPOCH + timedelta(days=value)).date().isoformat()
            if isinstance(value, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
                parse_time(value)
                return value
        elif kind == "datetime":
            if isinstance(value, int) and not isinstance(value, bool):       # microseconds since the epoch
                return format_time(value)
            if isinstance(value, str):
                return format_time(parse_time(value))
        elif kind == "json":
            return json.loads(value) if isinstance(value, str) else value
    except (InvalidOperation, ValueError, BadTime, OverflowError) as e:
        raise Unmappable(f"column {column}: a {_wire(value)} that is not a {kind} value ({type(e).__name__})") \
            from None
    raise Unmappable(f"column {column}: a {_wire(value)} is not a {kind} value")


def _wire(value: Any) -> str:
    """What a wire value is, never what it holds (a reason may be logged; a column may hold personal data)."""
    return {str: "text", bool: "boolean", int: "integer", float: "number", dict: "JSON object",
            list: "JSON array"}.get(type(value), type(value).__name__)


class _Rows:
    """The converted sides of one change, column by column, converted when first read."""

    def __init__(self, source: SourceSpec, change: Change) -> None:
        self.columns = source.columns
        self.change = change
        self._cache: dict[tuple[str, str], Any] = {}

    def side(self, side: str | None) -> Mapping[str, Any] | None:
        c = self.change
        return c.row if side is None else c.before if side == "before" else c.after

    def get(self, side: str | None, column: str) -> Any:
        key = (side or "row", column)
        if key in self._cache:
            return self._cache[key]
        row = self.side(side)
        name = side or ("before" if self.change.op == "delete" else "after")
        if row is None:
            raise Unmappable(f"{{{side + '.' if side else ''}{column}}}: the {self.change.op} has no {name} row")
        if column not in row:
            raise Unmappable(f"column {column} is missing from the {name} row (a schema change?)")
        value = _convert(row[column], self.columns[column], column)
        self._cache[key] = value
        return value

    def whole(self, side: str) -> dict[str, Any] | None:
        row = self.side(side)
        if row is None:
            return None
        return {c: self.get(side, c) for c in self.columns if c in row}

    def attribute(self, name: str) -> Any:
        c = self.change
        return {"op": c.op, "table": c.table, "committed_at": format_time(c.committed_at), "lsn": c.lsn,
                "tx_id": c.tx_id}[name]


def _value(value: Value, rows: _Rows, *, required: bool, what: str) -> Any:
    """A compiled value for one change; None when a placeholder is null (Unmappable when `required`)."""
    if isinstance(value, Ref):
        got = rows.attribute(value.name) if value.side == "change" else rows.get(value.side, value.name)
        if got is None:
            if required:
                raise Unmappable(f"{what}: column {value.name} is null")
            return None
        return format_time(parse_time(got))[:10] if value.day else got
    if isinstance(value, Template):
        out = []
        for part in value.parts:
            if isinstance(part, str):
                out.append(part)
                continue
            got = _value(part, rows, required=required, what=what)
            if got is None:
                return None
            out.append(got if isinstance(got, str) else json.dumps(got))
        return "".join(out)
    return value


def _digest(*parts: Any) -> str:
    """A stable digest of JSON values (keys sorted): the same parts give the same id in every process."""
    return hashlib.sha256(msgspec.json.encode(parts, order="sorted")).hexdigest()[:32]


def map_change(source: CompiledSource, change: Change) -> Mapped:
    """The envelopes a change becomes (without `recorded_at`: the relay gives the commit time), one per entry
    whose `ops` and `when` match, in entry order; or none, with why. Raises Unmappable when the change cannot map
    (a mapped column missing, null or of another type, a condition that cannot be evaluated)."""
    rows = _Rows(source.spec, change)
    out = Mapped([], None, source.name)
    for i, entry in enumerate(source.entries):
        if change.op not in entry.ops:
            continue
        if entry.program is not None and not _holds(entry, rows, i):
            continue
        tenant = _value(source.tenant, rows, required=True, what="tenant")
        key = [rows.get(None, k) for k in source.spec.key]
        if entry.spec.retract:
            target = _state_id(source, entry_of_state(source, change), rows, key, side="before")
            if target is None:
                continue
            event = {"id": _id("r", source.name, key, change, RETRACTED, i), "tenant": tenant, "type": RETRACTED,
                     "subject": target[1], "occurred_at": format_time(change.committed_at),
                     "payload": {"event": target[0], "reason": f"row deleted from {change.table}"}}
        else:
            event = _envelope(entry, rows, tenant)
            event["id"] = (_content_id(source.name, key, event) if change.op in ("read", "insert")
                           else _id("c", source.name, key, change, event["type"], i))
        out.envelopes.append(event)
        out.entries.append(i)
    if not out.envelopes:
        takes = any(change.op in e.ops for e in source.entries)
        out.reason = (f"{change.op} of {change.table}: "
                      + ("no entry's condition holds for this change" if takes else
                         "no entry of the mapping takes this operation"))
    return out


def _envelope(entry: _Entry, rows: _Rows, tenant: str) -> dict[str, Any]:
    event: dict[str, Any] = {"tenant": tenant, "type": entry.spec.type,
                             "subject": _value(entry.subject, rows, required=True, what="subject"),
                             "occurred_at": _value(entry.occurred_at, rows, required=True, what="occurred_at")}
    if entry.by is not None:
        by = _value(entry.by, rows, required=False, what="by")
        if by is not None:
            event["by"] = by
    payload = {}
    for name, value in entry.payload.items():
        got = _value(value, rows, required=False, what=f"payload.{name}")
        if got is not None:
            payload[name] = got
    event["payload"] = payload
    return event


def entry_of_state(source: CompiledSource, change: Change) -> _Entry | None:
    """The entry an insert of the deleted row's old values would have taken (whose event a delete retracts)."""
    state = _Rows(source.spec, Change("insert", change.table, None, change.before, change.committed_at))
    for i, entry in enumerate(source.entries):
        if "insert" in entry.ops and not entry.spec.retract and (entry.program is None or _holds(entry, state, i)):
            return entry
    return None


def _state_id(source: CompiledSource, entry: _Entry | None, rows: _Rows, key: list[Any],
              side: str) -> tuple[str, str] | None:
    """(id, subject) of the event the row's `side` state produced when inserted (or read by a snapshot)."""
    if entry is None:
        return None
    c = rows.change
    state = _Rows(source.spec, Change("insert", c.table, None, rows.side(side), c.committed_at))
    tenant = _value(source.tenant, state, required=True, what="tenant")
    event = _envelope(entry, state, tenant)
    return _content_id(source.name, key, event), event["subject"]


def _content_id(name: str, key: list[Any], event: Mapping[str, Any]) -> str:
    """A row state's id: the mapping, the row's key and the envelope's content (not where it was read)."""
    body = {k: event[k] for k in ("tenant", "type", "subject", "occurred_at", "by", "payload") if k in event}
    return f"cdc-{name}-{_digest('state', name, key, body)}"


def _id(kind: str, name: str, key: list[Any], change: Change, event_type: str | None, entry: int) -> str:
    """A streamed change's id: the mapping, the row's key, the change's position (commit and change LSN,
    transaction) and the event type, so a change read twice is the same envelope."""
    digest = _digest(kind, name, key, change.commit_lsn, change.lsn, change.tx_id, change.op, event_type, entry)
    return f"cdc-{name}-{digest}"


def _holds(entry: _Entry, rows: _Rows, index: int) -> bool:
    """Whether an entry's CEL condition holds for the change (Unmappable when it cannot be evaluated)."""
    from .rules import cel_value
    c = rows.change
    variables = {"op": c.op, "before": _cel_row(rows.whole("before")), "after": _cel_row(rows.whole("after")),
                 "change": {"op": c.op, "table": c.table, "committed_at": cel_value(format_time(c.committed_at)),
                            "lsn": c.lsn, "tx_id": c.tx_id}}
    try:
        result = entry.program.execute(variables)
    except Exception as e:  # noqa: BLE001 - a failed evaluation is the change's reason, never a crash
        text = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise Unmappable(f"changes[{index}].when could not be evaluated ({type(e).__name__})",
                         text[:200] or None) from None
    if not isinstance(result, bool):
        raise Unmappable(f"changes[{index}].when gave {type(result).__name__}, not true or false")
    return result


def _cel_row(row: dict[str, Any] | None) -> Any:
    from .rules import cel_value
    return None if row is None else {k: cel_value(v) for k, v in row.items()}


def source_for_table(sources: Mapping[str, CompiledSource], table: str) -> CompiledSource | None:
    """The mapping of a captured table (`<schema>.<table>`), None when the cartridge maps none."""
    for source in sources.values():
        if source.spec.table == table:
            return source
    return None
