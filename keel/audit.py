"""The audit log: one record per MCP tool call, so that every answer an agent acted on can be shown and asked
again (`keel audit show ID`, `keel audit replay ID`; docs/operations.md, "Audit log").

A record says who asked (tenant, agent, task, and the token's subject when the caller signed in with one), what
(the tool and its arguments, free text and entity ids replaced by their sha256), as known when (`at`, the world
time the answer is of, and the answer's `known_through`) and what came back: `result_sha256`, the sha256 of the
exact bytes MCP sent, and `answer_sha256`, the sha256 of the answer's reproducible part (`answer_bytes`).

Values that may be personal data are never written: entity ids, search queries and evidence ids are kept as
`{"sha256": ...}` of their compact JSON (a replay is given the plaintext and checks it against the hash); note
values and a withdrawal's reason are not kept at all (annotate writes, so a replay of it means nothing). Names from the cartridge's
vocabulary (predicate, relation, type, scope), numbers and times are kept as given when they look like one.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Protocol

import msgspec

from .errors import UsageError
from .times import format_time, now_micros

HASHED = frozenset({"entity", "query", "evidence"})     # may be personal data: kept as sha256 only
DROPPED = frozenset({"value", "reason"})                 # annotate's note value, a withdrawal's reason: not kept
NAMES = frozenset({"predicate", "relation", "type", "scope"})
TIMES = frozenset({"at", "known_at"})
NOT_REPRODUCIBLE = ("lag", "lag_measured_at", "applied_through", "at", "known_at")   # see answer_bytes
READERS = ("context", "history", "search", "related")   # annotate writes: its records are not replayed

_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
_TIME = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}([T ][0-9:.]+)?(Z|[+-][0-9]{2}:?[0-9]{2})?$")


def _plain(value: Any) -> Any:
    """msgspec's hook for subclasses of JSON's types (keel.times.Instant is an int): their plain value."""
    for kind in (bool, int, float, str):
        if isinstance(value, kind):
            return kind(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


RESULT_JSON = msgspec.json.Encoder(enc_hook=_plain)      # compact UTF-8 JSON: the bytes the MCP servers send


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def value_sha256(value: Any) -> str:
    """The hash a record keeps of an argument: sha256 of its compact JSON (`"customer:42"` with the quotes)."""
    try:
        data = RESULT_JSON.encode(value)
    except (TypeError, msgspec.EncodeError):
        data = repr(value).encode("utf-8", "replace")
    return sha256(data)


def answer_bytes(result: Mapping[str, Any]) -> bytes:
    """The reproducible part of a result: its compact JSON without the top-level fields that say how and when it
    was asked rather than what the answer is: `lag` and `lag_measured_at` (measured from the log's end when the
    answer is made), `applied_through` (what had been applied then), and the echoes `at` and `known_at` (the
    record holds the world time and `known_through` the replay asks with)."""
    return RESULT_JSON.encode({k: v for k, v in result.items() if k not in NOT_REPRODUCIBLE})


def kept_arguments(tool: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """What a record keeps of a call's arguments (None and absent arguments are left out)."""
    kept: dict[str, Any] = {}
    for name, value in arguments.items():
        if value is None or name in DROPPED:
            continue
        if name in HASHED:
            kept[name] = {"sha256": value_sha256(value)}
        elif name in NAMES and isinstance(value, str) and _NAME.fullmatch(value):
            kept[name] = value
        elif name in TIMES and isinstance(value, str) and _TIME.fullmatch(value.strip()):
            kept[name] = value.strip()
        elif isinstance(value, bool) or (name == "limit" and isinstance(value, int)):   # a switch, a count
            kept[name] = value
        else:                                   # anything else (a malformed argument): its hash, never its text
            kept[name] = {"sha256": value_sha256(value)}
    return kept


def new_record(*, cartridge: str, tool: str, tenant: str | None, agent: str | None, task: str | None,
               subject: str | None, arguments: Mapping[str, Any], at: str | None, when: int | None = None,
               ) -> dict[str, Any]:
    """A record of one call, before its outcome (`finish` adds it). `at` is the world time the answer is of (the
    call's own, or the clock's when it gave none); `subject` is the bearer token's subject when there is one, kept
    only as its sha256 (an identity provider may put an e-mail address in `sub`: personal data never enters a
    record; an operator finds a caller's records by hashing the subject they know)."""
    return {"id": uuid.uuid4().hex, "when": format_time(when if when is not None else now_micros()),
            "cartridge": cartridge, "tenant": tenant, "agent": agent, "task": task,
            "subject": None if subject is None else sha256(subject.encode()),
            "tool": tool, "arguments": kept_arguments(tool, arguments), "at": at}


def finish(record: dict[str, Any], *, outcome: str, error: str | None = None, result: Mapping[str, Any] | None = None,
           sent: bytes | None = None) -> dict[str, Any]:
    """The record with the call's outcome and, for an answer, its known_through and hashes."""
    record["outcome"] = outcome
    record["error"] = error
    record["known_through"] = result.get("known_through") if result is not None else None
    record["result_sha256"] = sha256(sent) if sent is not None else None
    record["answer_sha256"] = sha256(answer_bytes(result)) if result is not None else None
    return record


class AuditWriter(Protocol):
    """Where records go: a JSON-lines file (AuditFile) or a Kafka topic (keel.kafka_audit.AuditTopic)."""

    def write(self, record: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


class AuditFile:
    """Appends records to a JSON-lines file (compact UTF-8 JSON), one line each, handed to the OS before the call
    returns its answer."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        try:
            self._file = self.path.open("ab")
        except OSError as e:
            raise UsageError(f"cannot open the audit log {self.path}: {e.strerror or e}") from None
        self._lock = threading.Lock()

    def write(self, record: Mapping[str, Any]) -> None:
        line = RESULT_JSON.encode(record) + b"\n"        # written to the OS at once (not fsync'd)
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_records(path: str | Path) -> Iterator[dict[str, Any]]:
    """The records of a JSON-lines audit file (a line that is not one is refused, with its number)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"cannot read the audit log {path}: {getattr(e, 'strerror', None) or e}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            raise UsageError(f"{path}:{number}: not a JSON audit record") from None
        if not isinstance(record, dict) or "id" not in record:
            raise UsageError(f"{path}:{number}: not an audit record (no id)")
        yield record


def find_record(path: str | Path, record_id: str) -> dict[str, Any]:
    for record in read_records(path):
        if record.get("id") == record_id:
            return record
    raise UsageError(f"no audit record {record_id!r} in {path}")
