"""The event envelope (docs/envelope.md): its structural model, the catalog's checks, and the Event handlers
receive."""
from __future__ import annotations

import hashlib
import json
import re
from typing import Annotated, Any, NotRequired

import msgspec
from pydantic import ConfigDict, Field, Strict, StringConstraints, TypeAdapter, ValidationError
from typing_extensions import TypedDict

from .cartridge import Cartridge
from .cartridge_spec import MAX_VERSION, FieldSpec
from .decoding import TypedDecoder, canonical_json, exact_shape
from .echo import quote
from .errors import BadTime, EnvelopeRejected, VersionUnknown
from .identifiers import (
    ENTITY,  # noqa: F401 - named here too, for the modules that import it with the envelope's names
    ENTITY_PATTERN,
    TENANT,  # noqa: F401 - likewise
    TENANT_PATTERN,
)
from .times import Micros, format_time, now_micros, parse_time
from .upcast import UpcastFailed

ANNOTATED = "keel.annotated"
RETRACTED = "keel.retracted"
ERASED = "keel.erased"      # the receipt of a data subject's erasure (keel erase, docs/privacy.md)
OFFBOARDED = "keel.offboarded"  # the receipt of a tenant's offboarding (keel offboard, docs/privacy.md)

Tenant = Annotated[str, StringConstraints(pattern=TENANT_PATTERN)]
EntityRef = Annotated[str, StringConstraints(pattern=ENTITY_PATTERN)]


class Envelope(TypedDict):
    """One event as products publish it: a Kafka record value or a JSONL line.

    A pydantic-validated TypedDict rather than a BaseModel: validation yields the parsed dict itself, without
    building a model instance per event (40% of the validation time on the replay path)."""
    __pydantic_config__ = ConfigDict(extra="forbid")   # type: ignore[misc]
    id: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    tenant: Tenant
    type: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    subject: EntityRef
    occurred_at: str
    recorded_at: NotRequired[str | None]
    source: NotRequired[str | None]
    by: NotRequired[str | None]
    corrects: NotRequired[Annotated[str, StringConstraints(min_length=1, max_length=256)] | None]
    version: NotRequired[Annotated[int, Strict(), Field(ge=1, le=MAX_VERSION)] | None]
    payload: dict[str, Any]


class Instant(int):
    """A time as integer microseconds since the epoch (UTC) that prints as RFC 3339."""
    __slots__ = ()

    def __str__(self) -> str:
        return format_time(self) or ""

    __repr__ = __str__


class Event:
    """What a handler receives: a checked envelope with times parsed and defaults filled."""
    __slots__ = (
        "by",
        "clamped_from",
        "corrects",
        "id",
        "occurred_at",
        "payload",
        "recorded_at",
        "recorded_payload",
        "source",
        "subject",
        "subject_id",
        "subject_type",
        "tenant",
        "type",
        "version",
    )

    def __init__(self, *, id: str, tenant: str, type: str, subject: str, occurred_at: Micros,
                 recorded_at: Micros, source: str | None, by: str | None, payload: dict[str, Any],
                 corrects: str | None = None, version: int = 1,
                 recorded_payload: dict[str, Any] | None = None) -> None:
        self.id = id
        self.tenant = tenant
        self.type = type
        self.subject = subject
        self.subject_type, _, self.subject_id = subject.partition(":")
        self.occurred_at = Instant(occurred_at)
        self.recorded_at = Instant(recorded_at)
        self.source = source
        self.by = by
        self.payload = payload
        self.corrects = corrects
        self.clamped_from: Instant | None = None
        self.version = version                      # the version the envelope was recorded in
        self.recorded_payload = recorded_payload    # the payload as recorded, when it was upcast (else None)

    @classmethod
    def _checked(cls, id: str, tenant: str, type: str, subject: str, subject_type: str, subject_id: str,
                 occurred_at: Instant, recorded_at: Instant, source: str | None, by: str | None,
                 payload: dict[str, Any], corrects: str | None = None, version: int = 1,
                 recorded_payload: dict[str, Any] | None = None) -> Event:
        """The Catalog's constructor: fields already checked, subject split, times already Instants."""
        e = cls.__new__(cls)
        e.id, e.tenant, e.type, e.subject = id, tenant, type, subject
        e.subject_type, e.subject_id = subject_type, subject_id
        e.occurred_at, e.recorded_at = occurred_at, recorded_at
        e.source, e.by, e.payload = source, by, payload
        e.clamped_from, e.corrects = None, corrects
        e.version, e.recorded_payload = version, recorded_payload
        return e

    @property
    def supersedes(self) -> str | None:
        """The id of the event whose versions this one supersedes (`corrects`, or a retraction's target)."""
        return self.payload["event"] if self.type == RETRACTED else self.corrects

    def clamp_recorded_at(self, latest: Micros) -> None:
        """Take the event as recorded at `latest` (the tenant's latest recorded_at), keeping what it said."""
        self.clamped_from = self.recorded_at
        self.recorded_at = Instant(latest)

    def content_hash(self) -> str:
        """The event's identity for idempotency: a short hash of its canonical envelope without `recorded_at`
        (which a broker may assign): every other field after the checks (times as integers, `source` with
        its default), payload keys sorted. Two envelopes under one id are identical when their hashes are
        equal; see docs/envelope.md. The envelope as recorded counts: an upcast payload hashes as it was
        recorded, with its version (version 1 is hashed as before versions existed)."""
        head: tuple[Any, ...] = (self.id, self.tenant, self.type, self.subject, int(self.occurred_at),
                                 self.source, self.by, self.corrects)
        if self.version != 1:
            head += (self.version,)
        payload = self.payload if self.recorded_payload is None else self.recorded_payload
        return hashlib.blake2b(canonical_json(head, payload, _CANONICAL), digest_size=8).hexdigest()

    def to_envelope(self) -> dict[str, Any]:
        """The canonical envelope: what `keel publish` sends, so file and topic build equal graphs. An upcast
        event keeps its version and payload as recorded: the log is never rewritten."""
        out: dict[str, Any] = {"id": self.id, "tenant": self.tenant, "type": self.type,
                               "subject": self.subject, "occurred_at": format_time(self.occurred_at),
                               "recorded_at": format_time(self.recorded_at)}
        if self.source is not None:
            out["source"] = self.source
        if self.by is not None:
            out["by"] = self.by
        if self.corrects is not None:
            out["corrects"] = self.corrects
        if self.version != 1:
            out["version"] = self.version
        out["payload"] = self.payload if self.recorded_payload is None else self.recorded_payload
        return out

    def __repr__(self) -> str:
        return f"Event({self.id!r}, {self.tenant!r}, {self.type!r}, {self.subject!r})"


class Catalog:
    """A cartridge's event catalog compiled for fast envelope checks.

    Envelope text is decoded by msgspec into a Struct derived from the pydantic model (keel/decoding.py) when
    it is certainly valid, else by pydantic, whose errors are the refusals; `typed_decoding=False` always
    takes the pydantic path (tests and bench/decode.py compare the two)."""

    def __init__(self, cartridge: Cartridge, *, typed_decoding: bool = True, check_upcasters: bool = False) -> None:
        self.cartridge = cartridge
        self._typed = _TYPED.decode if typed_decoding else None
        self._upcasts = cartridge.upcasts
        self._versioned = frozenset(ev for ev, spec in cartridge.spec.events.items() if spec.version != 1)
        self._twice = check_upcasters     # `keel validate`: each Python upcaster runs twice, and must agree
        # event type -> (payload check, subject entity type, owner: the default source)
        personal = cartridge.spec.personal
        self._types = {ev: (PayloadCheck(ev, spec.fields(), frozenset(personal[ev].fields) if ev in personal else
                                         frozenset()), spec.subject, spec.owner)
                       for ev, spec in cartridge.spec.events.items()}
        self._instants: dict[str, Instant] = {}
        self._max_bytes = cartridge.spec.limits.envelope_bytes
        self._future = cartridge.spec.limits.future_micros

    def parse(self, raw: bytes | str | dict[str, Any], *, default_recorded_at: Micros | None = None) -> Event:
        """Raw envelope → Event. `default_recorded_at` is the Kafka record's time: the moment Keel learned
        the event, and its recorded_at when the envelope has none. Without it (file mode) the moment is now
        and recorded_at defaults to occurred_at. A recorded_at after that moment is taken as that moment;
        more than `limits.future_tolerance` after it is refused. Raises EnvelopeRejected."""
        if not isinstance(raw, dict) and len(raw) > self._max_bytes:
            event_id, tenant = _peek_ids(raw[:4096])
            raise EnvelopeRejected(f"envelope of {len(raw)} bytes is over the {self._max_bytes}-byte limit "
                                   f"(limits.envelope_bytes); keep documents elsewhere and a pointer in the "
                                   f"payload", event_id=event_id, tenant=tenant)
        typed = self._typed is not None and not isinstance(raw, dict)     # JSON text, and msgspec is on
        env = self._typed(raw) if typed else None
        if env is None:
            env = _TYPED.from_dict(_structure(raw))
        occurred = self._instant(env.occurred_at, "occurred_at", env)
        read_at = default_recorded_at if default_recorded_at is not None else now_micros()
        recorded_text = env.recorded_at
        if recorded_text is not None:
            recorded = self._instant(recorded_text, "recorded_at", env)
            if recorded > read_at:
                if recorded - read_at > self._future:
                    raise EnvelopeRejected(
                        f"recorded_at {recorded_text} is in the future: more than "
                        f"{self.cartridge.spec.limits.future_tolerance} (limits.future_tolerance) after Keel "
                        f"read the event at {format_time(read_at)}", event_id=env.id, tenant=env.tenant)
                recorded = Instant(read_at)
        elif default_recorded_at is not None:
            recorded = Instant(default_recorded_at)
        else:
            recorded = occurred if occurred <= read_at else Instant(read_at)
        event_type, subject = env.type, env.subject
        subject_type, _, subject_id = subject.partition(":")
        source = env.source
        corrects = env.corrects
        version = env.version
        payload = recorded_payload = env.payload
        if event_type in (ANNOTATED, RETRACTED, ERASED, OFFBOARDED):
            if version is not None and version != 1:
                raise VersionUnknown(event_type, version, 1, event_id=env.id, tenant=env.tenant)
            if corrects is not None:
                raise EnvelopeRejected(f"corrects: a {event_type} event corrects nothing (retract a note "
                                       f"with keel.retracted, correct it with a new note)",
                                       event_id=env.id, tenant=env.tenant)
            _CORE_CHECKS[event_type](env)
            if source is None and event_type != ANNOTATED:
                source = "keel"
        else:
            known = self._types.get(event_type)
            if known is None:
                raise EnvelopeRejected(f"unknown event type {quote(event_type)} for cartridge "
                                       f"{self.cartridge.name!r}", event_id=env.id, tenant=env.tenant)
            check, subject_kind, owner = known
            if subject_type != subject_kind:
                raise EnvelopeRejected(f"subject {subject!r}: {event_type} takes a {subject_kind!r} subject",
                                       event_id=env.id, tenant=env.tenant)
            if version is None and event_type not in self._versioned:
                check(env, typed)                   # the common case: version 1 of a type that has only one
            else:
                payload = self._upcast(check, event_type, version or 1, env, typed)
            if source is None:
                source = owner
        if corrects == env.id:
            raise EnvelopeRejected("corrects: an event cannot correct itself", event_id=env.id,
                                   tenant=env.tenant)
        return Event._checked(env.id, env.tenant, event_type, subject, subject_type, subject_id,
                              occurred, recorded, source, env.by, payload, corrects, version or 1,
                              None if payload is recorded_payload else recorded_payload)

    def _upcast(self, check: PayloadCheck, event_type: str, version: int, env: Decoded, typed: bool
                ) -> dict[str, Any]:
        """The payload of an envelope of `version` as the event type's declared version, checked: upcast from
        an older version (keel/upcast.py), refused when newer than the cartridge knows (VersionUnknown)."""
        latest = self._upcasts.version(event_type)
        if version == latest:
            check(env, typed)
            return env.payload
        if version > latest:
            raise VersionUnknown(event_type, version, latest, event_id=env.id, tenant=env.tenant)
        try:
            payload = self._upcasts.upcast(event_type, version, env.payload, twice=self._twice)
        except UpcastFailed as e:
            raise EnvelopeRejected(str(e), event_id=env.id, tenant=env.tenant) from None
        problems = [] if check.plainly_valid(payload) else check.problems(payload)
        if problems:
            raise EnvelopeRejected(f"upcast from version {version} to {latest}: {'; '.join(problems)}",
                                   event_id=env.id, tenant=env.tenant)
        return payload

    def _instant(self, text: str, field: str, env: Decoded) -> Instant:
        """A time field as an Instant; the Instants of recent texts are shared (events repeat their dates)."""
        instants = self._instants
        hit = instants.get(text)
        if hit is None:
            hit = Instant(_time(text, field, env))
            if len(instants) >= _INSTANTS_MAX:
                instants.clear()
            instants[text] = hit
        return hit


_INSTANTS_MAX = 65536
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)     # one instance: C speed
_ADAPTER = TypeAdapter(Envelope)
_VALIDATOR = _ADAPTER.validator     # validate_json/validate_python without TypeAdapter's Python layer
_TYPED = TypedDecoder(_ADAPTER.core_schema, "DecodedEnvelope")     # the msgspec fast path, same schema
Decoded = Any       # an instance of _TYPED.struct: the envelope's fields as attributes, absent ones None


def _structure(raw: bytes | str | dict[str, Any]) -> Envelope:
    try:
        if isinstance(raw, dict):
            return _VALIDATOR.validate_python(raw)
        return _VALIDATOR.validate_json(raw)
    except ValidationError as e:
        event_id, tenant = _peek_ids(raw)
        raise EnvelopeRejected(_reasons(e, raw), event_id=event_id, tenant=tenant) from None


_HINTS = {
    "subject": "'<entity type>:<id>': a type of lowercase letters, digits and _, then an id of ASCII letters, "
               "digits and . _ @ - (first a letter or digit, at most 128 characters)",
    "tenant": "ASCII letters, digits and . _ - (first a letter or digit, at most 64 characters)",
}
_LONE_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _reasons(e: ValidationError, raw: bytes | str | dict[str, Any]) -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"])
        kind = err["type"]
        if kind == "json_invalid":
            parts.append(_json_problem(err["msg"], raw))
        elif kind == "missing":
            parts.append(f"{loc}: required field missing")
        elif kind == "extra_forbidden":
            parts.append(f"{loc}: unknown envelope field")
        elif kind == "string_pattern_mismatch":
            hint = _HINTS.get(loc, _HINTS["tenant"])
            parts.append(f"{loc}: {quote(err.get('input'))} is not allowed; use {hint}")
        elif kind == "dict_type" and not loc:
            parts.append("an envelope must be a JSON object")
        elif loc == "version":
            parts.append(f"version: {quote(err.get('input'))} is not a version; use an integer from 1 (absent "
                         f"means 1)")
        else:
            parts.append(f"{loc}: {quote(err['msg'])}" if loc else quote(err["msg"]))
    return "; ".join(parts)


# What arrived is not always a file (a Kafka record's bytes, most often): the reason says what to do about the
# bytes, and a reader of a file says "save the file" instead (`in_a_file`).
NOT_UTF8_ADVICE = "; its producer must encode it as UTF-8"
_NOT_UTF8_IN_A_FILE = "; save the file as UTF-8"


def in_a_file(reason: str) -> str:
    """A rejection's reason as a reader of an events file reports it (a line of a file, not a record)."""
    return reason.replace(NOT_UTF8_ADVICE, _NOT_UTF8_IN_A_FILE)


def _json_problem(message: str, raw: bytes | str | dict[str, Any]) -> str:
    """What is wrong with text that is not JSON, in words a person understands."""
    data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
    if isinstance(data, bytes):
        try:
            data.decode()
        except UnicodeDecodeError as u:
            return f"not UTF-8 text (byte 0x{data[u.start]:02x} at position {u.start}){NOT_UTF8_ADVICE}"
        if _LONE_SURROGATE.search(data) and ("escape" in message or "surrogate" in message):
            return ("not valid JSON: a \\uD800-\\uDFFF escape must be one half of a surrogate pair (like "
                    "\\ud83d\\ude00 for one emoji); alone it is not a character")
    detail = re.sub(r" at line \d+ column \d+$", "", message.removeprefix("Invalid JSON: "))
    return f"not valid JSON ({detail})"


def _peek_ids(raw: bytes | str | dict[str, Any]) -> tuple[str | None, str | None]:
    doc: Any = raw
    if not isinstance(raw, dict):
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
            found = _ID_IN_TEXT.search(text)
            return (found.group(1) if found else None), None
    if not isinstance(doc, dict):
        return None, None
    ident, tenant = doc.get("id"), doc.get("tenant")
    return (ident if isinstance(ident, str) else None, tenant if isinstance(tenant, str) else None)


_ID_IN_TEXT = re.compile(r'"id"\s*:\s*"([^"\\]{1,256})"')


def _time(text: str, field: str, env: Decoded) -> Micros:
    try:
        return parse_time(text)
    except BadTime:
        raise EnvelopeRejected(f"{field}: {quote(text)} is neither RFC 3339 (2026-10-01T00:00:00Z) nor a date "
                               f"(2026-10-01)", event_id=env.id, tenant=env.tenant) from None


_CHECKS = {
    "string": lambda v: isinstance(v, str),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "date": lambda v: isinstance(v, str) and _is_time(v, date_only=True),
    "datetime": lambda v: isinstance(v, str) and _is_time(v, date_only=False),
}


def _is_time(text: str, *, date_only: bool) -> bool:
    if date_only and len(text) != 10:
        return False
    try:
        parse_time(text)
    except BadTime:
        return False
    return True


# The exact types a JSON value of each kind has: these pass without calling the check (`bool` is not a
# number and a date needs parsing, so those kinds always go through it).
_PLAIN_TYPES: dict[str, frozenset[type]] = {
    "string": frozenset({str}), "number": frozenset({int, float}), "integer": frozenset({int}),
    "boolean": frozenset({bool}), "object": frozenset({dict}), "array": frozenset({list}),
    "date": frozenset(), "datetime": frozenset(),
}


class PayloadCheck:
    """One event type's payload schema, compiled: a pass at C speed over the common payload (every field of a
    plain JSON type, no unknown field, time fields parse), else a field-by-field pass naming every problem."""
    __slots__ = ("_accepts", "_order", "_shape", "_times", "event_type", "fields", "names", "personal")

    def __init__(self, event_type: str, fields: dict[str, FieldSpec], personal: frozenset[str] = frozenset()) -> None:
        self.event_type = event_type
        self.personal = personal        # fields whose values a refusal never shows (docs/privacy.md)
        self.fields = [(name, spec.type, _CHECKS[spec.type], spec.optional, _PLAIN_TYPES[spec.type])
                       for name, spec in fields.items()]
        self.names = frozenset(fields)
        self._order = tuple(fields)
        # The exact types a field's value may have in the common case (a time is a str, checked below;
        # an optional field may be missing: payload.get gives None).
        self._accepts = tuple(frozenset(_PLAIN_TYPES[spec.type] or {str}) | ({type(None)} if spec.optional else set())
                              for spec in fields.values())
        self._times = tuple((name, spec.type == "date") for name, spec in fields.items()
                            if spec.type in ("date", "datetime"))
        # the same exact types as a Struct msgspec fills in C (faster than the map above; JSON values only)
        self._shape = exact_shape(event_type, {name: (_PLAIN_TYPES[spec.type] or frozenset({str}), spec.optional)
                                               for name, spec in fields.items()})

    def __call__(self, env: Decoded, typed: bool = False) -> None:
        """Raises EnvelopeRejected naming every problem. `typed`: the payload's values were decoded from JSON
        text (exact JSON types), and msgspec may decide the common case."""
        payload = env.payload
        if typed:
            try:
                msgspec.convert(payload, self._shape)
            except msgspec.ValidationError:
                pass
            else:
                if not self._times or self._times_parse(payload):
                    return
        if self.plainly_valid(payload):
            return
        problems = self.problems(payload)
        if problems:
            raise EnvelopeRejected("; ".join(problems), event_id=env.id, tenant=env.tenant)

    def plainly_valid(self, payload: dict[str, Any]) -> bool:
        """The common case, decided at C speed: True only if `problems` would find none."""
        return (all(map(frozenset.__contains__, self._accepts, map(type, map(payload.get, self._order))))
                and self.names.issuperset(payload) and self._times_parse(payload))

    def problems(self, payload: dict[str, Any]) -> list[str]:
        """Every problem of a payload, one reason per field."""
        problems = []
        for name, kind, check, optional, plain in self.fields:
            value = payload.get(name)
            if type(value) in plain:
                continue
            if value is None:
                if not optional:
                    problems.append(f"payload.{name}: required {kind} missing")
            elif not check(value):
                got = f"a value of type {type(value).__name__} (personal data, not shown)" if name in self.personal else quote(value)
                problems.append(f"payload.{name}: expected {kind}, got {got}")
        if not self.names.issuperset(payload):
            problems += [f"payload.{k}: unknown field for {self.event_type}" for k in payload if k not in self.names]
        return problems

    def _times_parse(self, payload: dict[str, Any]) -> bool:
        for name, date_only in self._times:
            value = payload.get(name)
            if value is not None and not _is_time(value, date_only=date_only):
                return False
        return True


ANNOTATION_FIELDS = {"predicate", "value", "scope", "evidence", "task", "agent", "withdraw", "reason"}
MAX_REASON = 512        # characters of a withdrawal's reason (keel.notes)


def check_annotation_payload(env: Decoded) -> None:
    """Structural checks of a keel.annotated payload, a note or (`withdraw: true`, no value, `reason?`) the
    withdrawal of one; the memory policy runs when it is applied."""
    p = env.payload
    problems = [f"payload.{k}: unknown field for {ANNOTATED}" for k in p if k not in ANNOTATION_FIELDS]
    if not isinstance(p.get("predicate"), str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$",
                                                               p.get("predicate") or ""):
        problems.append("payload.predicate: required, a name like next_step or note")
    withdraw = p.get("withdraw")
    if withdraw is not None and withdraw is not True:
        problems.append("payload.withdraw: true (a withdrawal) or absent (a note)")
    elif withdraw:
        if "value" in p:
            problems.append("payload.value: a withdrawal (withdraw: true) carries no value")
        reason = p.get("reason")
        if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_REASON):
            problems.append(f"payload.reason: expected a string of at most {MAX_REASON} characters")
    elif "value" not in p:
        problems.append("payload.value: required")
    if not withdraw and "reason" in p:
        problems.append("payload.reason: only a withdrawal (withdraw: true) has a reason")
    if p.get("scope") not in ("global", "tenant", "task", "agent"):
        problems.append("payload.scope: one of global, tenant, task, agent")
    for k in ("evidence", "task", "agent"):
        if p.get(k) is not None and not isinstance(p[k], str):
            problems.append(f"payload.{k}: expected string")
    if problems:
        raise EnvelopeRejected("; ".join(problems), event_id=env.id, tenant=env.tenant)


def check_retraction_payload(env: Decoded) -> None:
    """A keel.retracted payload: `{event: <id of an event of the tenant>, reason?: string}`."""
    p = env.payload
    problems = [f"payload.{k}: unknown field for {RETRACTED}" for k in p if k not in ("event", "reason")]
    target = p.get("event")
    if not isinstance(target, str) or not 1 <= len(target) <= 256:
        problems.append("payload.event: required, the id of the event to retract")
    elif target == env.id:
        problems.append("payload.event: an event cannot retract itself")
    if p.get("reason") is not None and not isinstance(p["reason"], str):
        problems.append("payload.reason: expected string")
    if problems:
        raise EnvelopeRejected("; ".join(problems), event_id=env.id, tenant=env.tenant)


def check_erasure_payload(env: Decoded) -> None:
    """A keel.erased payload, the PII-free receipt of an erasure of the envelope's subject (the data subject), and
    a keel.offboarded one (of a tenant): `{keys: <how many keys were deleted>, reason?: string}`."""
    p = env.payload
    problems = [f"payload.{k}: unknown field for {env.type}" for k in p if k not in ("keys", "reason")]
    keys = p.get("keys")
    if not isinstance(keys, int) or isinstance(keys, bool) or keys < 0:
        problems.append("payload.keys: required, the number of keys deleted (an integer from 0)")
    reason = p.get("reason")
    if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_REASON):
        problems.append(f"payload.reason: expected a string of at most {MAX_REASON} characters")
    if problems:
        raise EnvelopeRejected("; ".join(problems), event_id=env.id, tenant=env.tenant)


_CORE_CHECKS = {ANNOTATED: check_annotation_payload, RETRACTED: check_retraction_payload,
                ERASED: check_erasure_payload, OFFBOARDED: check_erasure_payload}
