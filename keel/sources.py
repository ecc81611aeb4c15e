"""Captured tables → event types: the `sources:` section of cartridge.yaml, checked and compiled once.

A product that has only a database reaches Keel through change data capture (Debezium reading PostgreSQL's
logical replication, docs/ingress.md). Each entry of `sources:` maps one captured table's changes to the
cartridge's event types; this module is the domain-free part: the mapping's schema, its checks against the event
catalog (`keel validate`), and the function that turns one decoded change into an envelope (or the reason for
none). The Debezium wire format and the relay live in keel/ingress/cdc*.py.

    sources:
      debts:                              # the mapping's name: part of every id it derives
        table: public.debts               # <schema>.<table> as the database names it
        key: [id]                         # the primary key's columns (default [id])
        tenant: "{household_id}"          # a column (as a placeholder) or one constant tenant for the table
        columns: {id: integer, household_id: string, debt_key: string, month: date, balance_cop: number}
        changes:                          # every entry whose `ops` and `when` match gives an event
          - ops: [read, insert, update]   # read (a snapshot's row), insert, update, delete
            when: "op != 'update' || before.balance_cop != after.balance_cop"      # optional CEL
            type: debt.snapshot
            subject: "debt:{debt_key}"
            occurred_at: "{month}"        # a column, or {change.committed_at}
            payload: {balance_cop: "{balance_cop}"}
          - ops: [delete]
            retract: true                 # keel.retracted of the event the deleted row's state produced

Values follow the placeholder rules of `project:` (keel/projection.py): `{column}` is the row (the new row; a
delete's old one), `{before.column}` / `{after.column}` a side, `{change.X}` an attribute of the change (op table
committed_at lsn tx_id); `{x:date}` the UTC day of a time; a string that is exactly one placeholder keeps the
value's JSON type, any other is text; `{{`/`}}` are literal braces. `columns:` types what the mapping reads:
string integer number boolean date datetime json; a change whose mapped column is missing, null where a required
value is needed, or of another type cannot map (the relay dead-letters it with the reason).

CEL conditions see `op` (read insert update delete), `before` and `after` (maps of the declared columns, null
where the side does not exist: an insert has no before) and `change` (op table committed_at lsn tx_id).

Ids. A streamed change (insert, update, delete) gets an id derived from its position: the mapping, the row's
key, the change's commit and change LSN and the event type; a snapshot read and an insert get one derived from
the row's key and the envelope's content instead (the row's state), so a row read again by a re-snapshot is the
same envelope as its insert or its earlier snapshot read: Keel's dedupe counts it once. A `retract: true` delete
names that state id of the deleted row's old values: it retracts the event its insert or snapshot read produced
(after updates, map deletes to an event type of the catalog instead; docs/ingress.md).
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .cartridge_spec import CartridgeSpec
from .templates import DAY, template_pieces
from .times import Micros

OPS = ("read", "insert", "update", "delete")
COLUMN_TYPES = ("string", "integer", "number", "boolean", "date", "datetime", "json")
CHANGE_ATTRIBUTES = ("op", "table", "committed_at", "lsn", "tx_id")
CEL_VARIABLES = ("op", "before", "after", "change")
RETRACTED = "keel.retracted"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_COLUMN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_TABLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*\.[A-Za-z_][A-Za-z0-9_$]*$")
# which column types may fill which payload type (a text template takes any scalar)
_FITS = {"string": {"string", "date", "datetime"}, "integer": {"integer"}, "number": {"integer", "number"}, "boolean": {"boolean"},
         "date": {"date"}, "datetime": {"date", "datetime"}, "object": {"json"}, "array": {"json"}}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ChangeSpec(_Strict):
    """One way a change of the table becomes an event (or a retraction)."""
    ops: list[str] = Field(min_length=1)     # not `on`: YAML 1.1 reads an unquoted `on` key as true
    when: str | None = None
    type: str | None = None
    subject: str | None = None
    occurred_at: str = "{change.committed_at}"
    by: str | None = None
    payload: dict[str, Any] = Field(default_factory=dict)
    retract: bool = False


class SourceSpec(_Strict):
    """One captured table's mapping."""
    table: str
    key: list[str] = Field(default_factory=lambda: ["id"], min_length=1)
    tenant: str
    columns: dict[str, str] = Field(default_factory=dict)
    changes: list[ChangeSpec] = Field(min_length=1)


class Unmappable(Exception):
    """A change that cannot map: a mapped column missing or of the wrong type (the relay dead-letters it)."""

    def __init__(self, reason: str, detail: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason            # names columns and entries, never a value: dead letters and logs get it
        self.detail = detail            # a library's own words, which may quote values: `keel cdc explain` only


@dataclass(frozen=True)
class Ref:
    side: str | None          # "before", "after", "change" or None (the row)
    name: str
    day: bool = False


@dataclass(frozen=True)
class Template:
    parts: tuple[str | Ref, ...]


Value = Any     # a constant, a Ref or a Template


@dataclass(frozen=True)
class Change:
    """One decoded change of a captured table (keel/ingress/cdc_decode.py builds it from Debezium's envelope).
    Column values are as the wire gives them; the mapping converts the ones it reads to their declared types."""
    op: str                              # read insert update delete
    table: str                           # <schema>.<table>
    before: Mapping[str, Any] | None
    after: Mapping[str, Any] | None
    committed_at: Micros                 # the transaction's commit time (a snapshot's read time)
    lsn: int | None = None               # the change's LSN
    commit_lsn: int | None = None        # the LSN of the last commit before it (Debezium's source.sequence[0])
    tx_id: int | None = None

    @property
    def row(self) -> Mapping[str, Any] | None:
        return self.before if self.op == "delete" else self.after


@dataclass
class Mapped:
    """What a change becomes: its envelopes (one per matching entry, in entry order; `entries` their indexes),
    or none with why (`reason`)."""
    envelopes: list[dict[str, Any]]
    reason: str | None = None
    mapping: str | None = None
    entries: list[int] = field(default_factory=list)


@dataclass
class _Entry:
    spec: ChangeSpec
    ops: frozenset[str]
    program: Any
    subject: Value
    occurred_at: Value
    by: Value
    payload: dict[str, Value]


@dataclass
class CompiledSource:
    name: str
    spec: SourceSpec
    tenant: Value
    entries: list[_Entry] = field(default_factory=list)


def _parse(raw: object, where: str, columns: Mapping[str, str], problems: list[str]) -> Value:
    """A value as a constant, a Ref or a Template; its names checked against the declared columns."""
    if not isinstance(raw, str):
        if raw is not None and not isinstance(raw, bool | int | float):
            problems.append(f"{where}: expected a JSON scalar, got a YAML {type(raw).__name__}")
        return raw
    pieces, bad = template_pieces(raw)
    problems.extend(f"{where}: {text}" for text in bad)
    if pieces is None:
        return raw
    parts: list[str | Ref] = []
    for piece in pieces:
        if isinstance(piece, str):
            parts.append(piece)
            continue
        name = piece.name
        side, _, column = name.rpartition(".")
        if side not in ("", "before", "after", "change"):
            problems.append(f"{where}: {{{name}}}: use {{column}}, {{before.column}}, {{after.column}} or "
                            f"{{change.X}}")
            continue
        ref = Ref(side or None, column, piece.day)
        if side == "change":
            if column not in CHANGE_ATTRIBUTES:
                problems.append(f"{where}: {{{name}}}: the change has no attribute {column!r}; use one of "
                                f"{' '.join(CHANGE_ATTRIBUTES)}")
            elif ref.day and column != "committed_at":
                problems.append(f"{where}: {{{name}:{DAY}}}: only committed_at is a time")
        elif not _COLUMN.match(column) or column not in columns:
            problems.append(f"{where}: {{{name}}}: {column!r} is not a column of `columns:` (declare its type "
                            f"there: {' '.join(COLUMN_TYPES)})")
        elif ref.day and columns[column] not in ("date", "datetime"):
            problems.append(f"{where}: {{{name}:{DAY}}}: {column} is not a date or datetime column")
        parts.append(ref)
    if not any(isinstance(p, Ref) for p in parts):
        return "".join(p for p in parts if isinstance(p, str))
    if len(parts) == 1:
        return parts[0]
    for ref in parts:
        if isinstance(ref, Ref) and ref.side != "change" and columns.get(ref.name) == "json":
            problems.append(f"{where}: {raw!r}: {{{ref.name}}} is a json column, which has no text form")
    return Template(tuple(parts))


def _refs(value: Value) -> list[Ref]:
    if isinstance(value, Ref):
        return [value]
    if isinstance(value, Template):
        return [p for p in value.parts if isinstance(p, Ref)]
    return []


def _kind(value: Value, columns: Mapping[str, str]) -> str:
    """The column type a value gives: a single placeholder's, `string` for text, the constant's JSON type."""
    if isinstance(value, Ref):
        if value.day:
            return "date"
        if value.side == "change":
            return "datetime" if value.name == "committed_at" else "integer" if value.name in (
                "lsn", "tx_id") else "string"
        return columns.get(value.name, "string")
    if isinstance(value, Template):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "string"


def compile_sources(spec: CartridgeSpec) -> tuple[dict[str, CompiledSource], list[str]]:
    """Every `sources:` entry checked against the catalog and compiled; ({name: source}, problems)."""
    out: dict[str, CompiledSource] = {}
    problems: list[str] = []
    tables: dict[str, str] = {}
    for name, raw in sorted(getattr(spec, "sources", {}).items()):
        where = f"sources.{name}"
        try:
            source = SourceSpec.model_validate(raw)
        except ValidationError as e:
            for err in e.errors():
                loc = ".".join(str(p) for p in err["loc"])
                problems.append(f"{where}{'.' + loc if loc else ''}: {err['msg']}")
            continue
        compiled, found = _compile_source(name, source, spec)
        problems += found
        if source.table in tables:
            problems.append(f"{where}.table: {source.table} is mapped by sources.{tables[source.table]} too; "
                            "map each table once (an entry may list several changes)")
        tables.setdefault(source.table, name)
        out[name] = compiled
    return out, problems


def _compile_source(name: str, source: SourceSpec, spec: CartridgeSpec) -> tuple[CompiledSource, list[str]]:
    where = f"sources.{name}"
    problems: list[str] = []
    if not re.match(r"^[a-z][a-z0-9_]*$", name):
        problems.append(f"{where}: a mapping's name uses lowercase letters, digits and _")
    if not _TABLE.match(source.table):
        problems.append(f"{where}.table: {source.table!r}: write <schema>.<table> (e.g. public.debts)")
    columns = source.columns
    for column, kind in columns.items():
        if not _COLUMN.match(column):
            problems.append(f"{where}.columns.{column}: not a column name")
        if kind not in COLUMN_TYPES:
            problems.append(f"{where}.columns.{column}: bad type {kind!r}; use one of {' '.join(COLUMN_TYPES)}")
    for k in source.key:
        if k not in columns:
            problems.append(f"{where}.key: {k!r} is not a column of `columns:`")
    tenant = _parse(source.tenant, f"{where}.tenant", columns, problems)
    if any(r.side is not None for r in _refs(tenant)):
        problems.append(f"{where}.tenant: use a column of the row ({{column}}) or a constant")
    compiled = CompiledSource(name, source, tenant)
    for i, change in enumerate(source.changes):
        entry = _compile_entry(f"{where}.changes[{i}]", change, columns, spec, problems)
        if entry is not None:
            compiled.entries.append(entry)
    return compiled, problems


def _compile_entry(where: str, change: ChangeSpec, columns: Mapping[str, str], spec: CartridgeSpec,
                   problems: list[str]) -> _Entry | None:
    bad_ops = [op for op in change.ops if op not in OPS]
    if bad_ops:
        problems.append(f"{where}.ops: {', '.join(map(repr, bad_ops))}: operations are {' '.join(OPS)}")
    ops = frozenset(op for op in change.ops if op in OPS)
    program = _compile_when(f"{where}.when", change.when, columns, ops, problems)
    if change.retract:
        if change.type is not None or change.payload or change.subject is not None:
            problems.append(f"{where}: `retract: true` takes no type, subject or payload (it retracts the event "
                            "the row's old state produced)")
        if ops - {"delete"}:
            problems.append(f"{where}.ops: `retract: true` maps deletes only")
        return _Entry(change, ops, program, None, None, None, {})
    if change.type is None:
        problems.append(f"{where}: give `type:` (an event type of the catalog) or `retract: true`")
        return None
    event = spec.events.get(change.type)
    if event is None:
        problems.append(f"{where}.type: {change.type!r} is not an event type of the catalog (it has "
                        f"{', '.join(sorted(spec.events)) or 'none'})")
        return None
    if change.subject is None:
        problems.append(f"{where}.subject: missing; give \"{event.subject}:{{column}}\"")
        return None
    subject = _parse(change.subject, f"{where}.subject", columns, problems)
    literal = subject.parts[0] if isinstance(subject, Template) and isinstance(subject.parts[0], str) else \
        subject if isinstance(subject, str) else ""
    if not str(literal).startswith(f"{event.subject}:"):
        problems.append(f"{where}.subject: {change.subject!r} must start with \"{event.subject}:\" (the subject "
                        f"type of {change.type})")
    occurred_at = _parse(change.occurred_at, f"{where}.occurred_at", columns, problems)
    if _kind(occurred_at, columns) not in ("date", "datetime") and not isinstance(occurred_at, str):
        problems.append(f"{where}.occurred_at: {change.occurred_at!r} is not a time; use a date or datetime "
                        "column, or {change.committed_at}")
    by = _parse(change.by, f"{where}.by", columns, problems) if change.by is not None else None
    payload = {}
    fields = event.fields()
    for name, raw in change.payload.items():
        at = f"{where}.payload.{name}"
        if name not in fields:
            problems.append(f"{at}: not a payload field of {change.type} (it has {', '.join(sorted(fields))})")
            continue
        value = _parse(raw, at, columns, problems)
        kind = _kind(value, columns)
        declared = fields[name].type
        if kind not in _FITS.get(declared, set()) and not (declared == "string" and isinstance(value, Template)):
            problems.append(f"{at}: gives a {kind} value; payload.{name} of {change.type} is {declared}")
        payload[name] = value
    for name, f in sorted(fields.items()):
        if not f.optional and name not in change.payload:
            problems.append(f"{where}.payload: {name} ({f.type}) of {change.type} is required; map it from a "
                            "column")
    for value in (subject, occurred_at, by, *payload.values()):
        for ref in _refs(value):
            if ref.side == "before" and not ops & {"update", "delete"}:
                problems.append(f"{where}: {{before.{ref.name}}}: {', '.join(sorted(ops))} has no old row (only "
                                "update and delete have one)")
    return _Entry(change, ops, program, subject, occurred_at, by, payload)


def _compile_when(where: str, when: str | None, columns: Mapping[str, str], ops: frozenset[str],
                  problems: list[str]) -> Any:
    if when is None:
        return None
    from .rules import _cel, names_used  # the CEL compiler is loaded only by mappings with a condition
    if not when.strip():
        problems.append(f"{where}: give a CEL expression as a string")
        return None
    try:
        program = _cel().compile(when)
    except (ValueError, RuntimeError, TypeError) as e:
        problems.append(f"{where}: does not compile: {str(e).strip().splitlines()[0] if str(e).strip() else e}")
        return None
    for token in sorted(set(re.findall(r"\b(before|after)\s*\.\s*([A-Za-z_][A-Za-z0-9_]*)", _strip_strings(when)))):
        if token[1] not in columns:
            problems.append(f"{where}: {token[0]}.{token[1]} is not a column of `columns:`")
    free = names_used(when).free - set(CEL_VARIABLES) - {"before", "after", "op", "change"}
    for name in sorted(free):
        problems.append(f"{where}: unknown name {name!r}; the variables are {', '.join(CEL_VARIABLES)}")
    return program


def _strip_strings(expression: str) -> str:
    return re.sub(r"'(?:\\.|[^'\\])*'|\"(?:\\.|[^\"\\])*\"", "''", expression)
