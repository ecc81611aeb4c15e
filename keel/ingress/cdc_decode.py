"""Debezium's change events (the JSON converter, with or without embedded schemas) → keel.sources.Change.

A record value is Debezium's envelope `{before, after, source, op, ts_ms}`, or `{schema, payload}` wrapping it
when the converter embeds schemas (`value.converter.schemas.enable=true`). `source` says where the change was
read: `schema`, `table`, `lsn`, `sequence` (`["<last commit LSN>", "<change LSN>"]`), `txId`, `ts_ms`/`ts_us`
(the commit time; a snapshot's read time) and `snapshot`. Topic order is commit order, so `lsn` does not grow
along a topic (a long transaction's rows arrive at its commit); ids use the whole position, never the order.

A tombstone (a null value), a truncate (`op` t) and a logical decoding message (`op` m) are no row change: they
map to nothing and are counted. Anything else that is not a change event is Undecodable, with the reason.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import msgspec

from keel.sources import Change

OPS = {"c": "insert", "u": "update", "d": "delete", "r": "read"}
NOT_ROWS = {"t": "a truncate", "m": "a logical decoding message"}


class Undecodable(Exception):
    """A record that is not a Debezium change event (the relay dead-letters it with the reason)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Skipped:
    """A record that is no row change (tombstone, truncate, message): counted, mapped to nothing."""
    reason: str


def decode_change(value: bytes | str | dict[str, Any] | None) -> Change | Skipped:
    """One record value as a Change (Undecodable when it is not a change event)."""
    if value is None:
        return Skipped("a tombstone (null value)")
    if isinstance(value, bytes | str):
        try:
            doc = msgspec.json.decode(value)             # 3-4x json.loads on Debezium's records
        except msgspec.DecodeError as e:
            raise Undecodable(f"not JSON: {e}") from None
    else:
        doc = value
    if doc is None:
        return Skipped("a tombstone (null value)")
    if not isinstance(doc, dict):
        raise Undecodable(f"a change event is a JSON object, not {type(doc).__name__}")
    if "payload" in doc and "schema" in doc and "op" not in doc:
        doc = doc["payload"]                 # schemas.enable=true: {schema, payload}
        if doc is None:
            return Skipped("a tombstone (null payload)")
        if not isinstance(doc, dict):
            raise Undecodable("the payload of a change event is a JSON object")
    op = doc.get("op")
    if op in NOT_ROWS:
        return Skipped(NOT_ROWS[op])
    if op not in OPS:
        raise Undecodable(f"op {op!r}: not a Debezium change (c u d r t m)")
    source = doc.get("source")
    if not isinstance(source, dict):
        raise Undecodable("no `source` block (where the change was read)")
    schema, table = source.get("schema"), source.get("table")
    if not isinstance(schema, str) or not isinstance(table, str):
        raise Undecodable("source.schema and source.table name the captured table")
    before, after = doc.get("before"), doc.get("after")
    for side, row in (("before", before), ("after", after)):
        if row is not None and not isinstance(row, dict):
            raise Undecodable(f"`{side}` is a row (a JSON object) or null")
    kind = OPS[op]
    if kind in ("insert", "read", "update") and after is None:
        raise Undecodable(f"an {kind} without `after`")
    if kind == "delete" and before is None:
        raise Undecodable("a delete without `before`")
    return Change(kind, f"{schema}.{table}", before, after, _commit_micros(source, doc), _int(source.get("lsn")),
                  _commit_lsn(source.get("sequence")), _int(source.get("txId")))


def position_of(value: bytes | None) -> dict[str, str]:
    """Where a record's change was read (table, lsn, sequence, txId), as far as it can be read: dead letters
    carry it (never the row's values)."""
    try:
        doc = json.loads(value) if value else None
    except (UnicodeDecodeError, ValueError):
        return {}
    if isinstance(doc, dict) and "payload" in doc and "schema" in doc:
        doc = doc["payload"]
    source = doc.get("source") if isinstance(doc, dict) else None
    if not isinstance(source, dict):
        return {}
    out = {"table": f"{source.get('schema')}.{source.get('table')}"}
    for key in ("lsn", "sequence", "txId"):
        if source.get(key) is not None:
            out[key] = str(source[key])[:120]
    if isinstance(doc, dict) and isinstance(doc.get("op"), str):
        out["op"] = doc["op"][:4]
    return out


def _commit_micros(source: dict[str, Any], doc: dict[str, Any]) -> int:
    for key, scale in (("ts_us", 1), ("ts_ms", 1000)):
        value = _int(source.get(key))
        if value is not None:
            return value * scale
    value = _int(doc.get("ts_ms"))
    if value is not None:
        return value * 1000
    raise Undecodable("source.ts_ms (the commit time) is missing")


def _commit_lsn(sequence: Any) -> int | None:
    """The first element of `source.sequence` (a JSON text `["<last commit LSN>", "<change LSN>"]`)."""
    if isinstance(sequence, str):
        try:
            sequence = json.loads(sequence)
        except ValueError:
            return None
    if isinstance(sequence, list) and sequence:
        return _int(sequence[0])
    return None


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None
