"""`keel schema`: JSON Schemas (draft 2020-12) of a cartridge's envelopes, for producers in any language.

The envelope's schema is pydantic's, generated from the model Keel checks envelopes with (keel/envelope.py);
time fields get a pattern of the forms Keel reads. Each event type's payload schema, per version, is made from
the catalog: the declared version from its `payload:`, older versions from the shapes keel/upcast.py derives
by undoing the YAML upcast steps (a version a Python upcaster reads is any object: Keel checks what it
returns). The cartridge's document validates a whole envelope of any of its event types: `type` names one,
and `allOf` ties each (type, version) to its payload schema in `$defs` (`<type>.v<N>`); an envelope without
`version` is version 1. Keel's own checks stay the authority (a pattern approximates a time; Keel parses it).

A cartridge's `personal:` fields travel sealed (docs/privacy.md): on the events topic, and in every file `keel seal`
writes, their value is the `keel.enc` wire object, not the declared type. The document describes the records as
they are on the topic, so a personal field's schema is that wire object (or, with `personal: {accept_clear: true}`,
the wire object or the clear value). `clear=True` describes the form before sealing instead, what `keel seal`,
`keel publish`, the outbox relay and the webhook take: every field of its declared type.
"""
from __future__ import annotations

import copy
from typing import Any

from pydantic import TypeAdapter

from .cartridge import Cartridge
from .envelope import ANNOTATED, MAX_REASON, RETRACTED, Envelope
from .errors import UsageError
from .privacy import ENC, WIRE
from .upcast import FieldShape, shapes

DRAFT = "https://json-schema.org/draft/2020-12/schema"
DATE_PATTERN = r"^\d{4}-\d{2}-\d{2}$"
TIME_PATTERN = r"^\d{4}-\d{2}-\d{2}([Tt]\d{2}:\d{2}(:\d{2}(\.\d+)?)?([Zz]|[+-]\d{2}:?\d{2}))?$"
_TIME = {"type": "string", "pattern": TIME_PATTERN,
         "description": "RFC 3339 with a zone (2026-10-01T09:30:00Z), or a date (2026-10-01: midnight UTC)"}
_TYPES: dict[str, dict[str, Any]] = {
    "string": {"type": "string"},
    "number": {"type": "number"},
    "integer": {"type": "integer"},
    "boolean": {"type": "boolean"},
    "object": {"type": "object"},
    "array": {"type": "array"},
    "date": {"type": "string", "format": "date", "pattern": DATE_PATTERN},
    "datetime": _TIME,
}
_ENVELOPE = TypeAdapter(Envelope).json_schema()
_BASE64 = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
# a personal field as sealed (keel.privacy.encrypt_field, docs/privacy.md "Wire format"): a 12-byte iv is 16
# base64 characters; the ciphertext ends with a 16-byte tag, so it is at least 24
SEALED: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": [ENC, "kid", "iv", "ct"],
    "properties": {ENC: {"const": WIRE}, "kid": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
                   "iv": {"type": "string", "pattern": _BASE64, "minLength": 16, "maxLength": 16},
                   "ct": {"type": "string", "pattern": _BASE64, "minLength": 24}}}
# the core event types' payloads (keel/envelope.py: check_annotation_payload, check_retraction_payload)
_NULLABLE_STRING = {"type": ["string", "null"]}
_CORE: dict[str, dict[str, Any]] = {
    ANNOTATED: {"type": "object", "additionalProperties": False, "required": ["predicate", "scope"],
                "properties": {"predicate": {"type": "string", "pattern": r"^[A-Za-z_][A-Za-z0-9_.-]{0,127}$"},
                               "value": {}, "scope": {"enum": ["global", "tenant", "task", "agent"]},
                               "evidence": _NULLABLE_STRING, "task": _NULLABLE_STRING, "agent": _NULLABLE_STRING,
                               "withdraw": {"const": True},
                               "reason": {"type": ["string", "null"], "maxLength": MAX_REASON}},
                # a note has a value; a withdrawal (withdraw: true) has none and may have a reason
                "oneOf": [{"required": ["value"], "properties": {"withdraw": False, "reason": False}},
                          {"required": ["withdraw"], "properties": {"value": False}}]},
    RETRACTED: {"type": "object", "additionalProperties": False, "required": ["event"],
                "properties": {"event": {"type": "string", "minLength": 1, "maxLength": 256},
                               "reason": _NULLABLE_STRING}},
}


def field_schema(shape: FieldShape) -> dict[str, Any]:
    """One payload field; an optional field may also be null."""
    schema = dict(_TYPES[shape.type]) if shape.type is not None else {}
    if shape.optional and shape.type is not None:
        return {"anyOf": [schema, {"type": "null"}]}
    return schema


def personal_schema(shape: FieldShape, accept_clear: bool) -> dict[str, Any]:
    """A personal field as it is on the topic: sealed (null too when optional: sealing keeps a null), or, when
    the cartridge accepts personal fields in clear, sealed or its clear value."""
    clear = dict(_TYPES[shape.type]) if shape.type is not None else {}
    kind = f"a {shape.type}" if shape.type is not None else "any JSON value"
    forms = [dict(SEALED)] + ([clear] if accept_clear else []) + ([{"type": "null"}] if shape.optional else [])
    return {"anyOf": forms} | {"description": (
        f"personal data, sealed ({ENC} {WIRE}: keel seal, keel publish, keel.sealer); sealed, it is {kind}"
        + (" (the cartridge also accepts it in clear: personal.accept_clear)" if accept_clear else ""))}


def payload_schemas(cartridge: Cartridge, event_type: str, *, clear: bool = False) -> dict[int, dict[str, Any]]:
    """{version: the JSON Schema of that version's payload} of one event type, oldest first; its personal fields
    sealed, or (`clear`) as they are before sealing."""
    event = cartridge.spec.events.get(event_type)
    if event is None:
        raise UsageError(f"unknown event type {event_type!r}; {cartridge.name} has "
                         f"{', '.join(sorted(cartridge.spec.events))}")
    found, _ = shapes(event_type, event, cartridge.upcasts.hops.get(event_type, []))
    declared = cartridge.spec.personal.get(event_type)
    personal = set() if clear or declared is None else set(declared.fields)   # sealed by name, in any version
    accept = cartridge.spec.personal_accept_clear

    def schema_of(name: str, f: FieldShape) -> dict[str, Any]:
        return personal_schema(f, accept) if name in personal else field_schema(f)
    out = {}
    for version in sorted(found):
        shape = found[version]
        if shape is None:
            out[version] = {"type": "object", "description": (
                f"{event_type} version {version}: read by a Python upcaster of handlers.py, so any object here; "
                f"Keel checks what it returns against version {event.version}")}
            continue
        out[version] = {"type": "object", "additionalProperties": False,
                        "properties": {name: schema_of(name, f) for name, f in shape.items()},
                        "required": sorted(name for name, f in shape.items() if not f.optional),
                        "description": f"{event_type} version {version}"
                                       + (" (the current one)" if version == event.version else
                                          f" (upcast to version {event.version} when read)")}
    return out


def payload_document(cartridge: Cartridge, event_type: str, version: int | None = None, *,
                     clear: bool = False) -> dict[str, Any]:
    """The payload schema of one event type and version (default: the declared one), as a document; `clear`:
    its personal fields before sealing."""
    schemas = payload_schemas(cartridge, event_type, clear=clear)
    version = max(schemas) if version is None else version
    if version not in schemas:
        raise UsageError(f"{event_type} has versions 1 to {max(schemas)}, not {version}")
    return {"$schema": DRAFT, "$id": f"urn:keel:{cartridge.name}:{event_type}:v{version}",
            "title": f"{event_type} version {version} payload ({cartridge.name})", **schemas[version]}


def cartridge_document(cartridge: Cartridge, *, clear: bool = False) -> dict[str, Any]:
    """A schema validating any envelope of the cartridge: the envelope, its type, and per (type, version) the
    payload schema in `$defs`. Personal fields are sealed, as on the topic; `clear`: as before sealing."""
    doc: dict[str, Any] = {"$schema": DRAFT, "$id": f"urn:keel:{cartridge.name}:envelope",
                           **copy.deepcopy(_ENVELOPE)}
    doc["title"] = f"Keel envelope of cartridge {cartridge.name}"
    doc["description"] = ("One event as a product publishes it to keel." + cartridge.name + ".events (the record "
                          "value, key = tenant) or in a JSONL file; docs/envelope.md")
    if cartridge.spec.personal:
        doc["description"] += (" Personal fields in clear, as keel seal, keel publish, the outbox relay and the "
                               "webhook take them before sealing." if clear else
                               " Personal fields sealed (keel.enc), as on the topic; keel schema --clear: before "
                               "sealing.")
    props = doc["properties"]
    for name in ("occurred_at", "recorded_at"):
        props[name] = _TIME if name == "occurred_at" else {"anyOf": [_TIME, {"type": "null"}]}
    types = sorted(cartridge.spec.events)
    props["type"] = {**props["type"], "enum": [*types, ANNOTATED, RETRACTED]}
    defs: dict[str, Any] = {}
    rules: list[dict[str, Any]] = []
    for event_type in types:
        schemas = payload_schemas(cartridge, event_type, clear=clear)
        latest = max(schemas)
        rules.append({"if": _is(event_type), "then": {"properties": {
            "version": {"maximum": latest},
            "subject": {"pattern": f"^{cartridge.spec.events[event_type].subject}:"}}}})
        for version, schema in schemas.items():
            defs[f"{event_type}.v{version}"] = schema
            rules.append({"if": _is(event_type, version), "then": {"properties": {
                "payload": {"$ref": f"#/$defs/{event_type}.v{version}"}}}})
    for event_type, schema in _CORE.items():
        defs[f"{event_type}.v1"] = schema
        rules.append({"if": _is(event_type), "then": {"properties": {
            "version": {"maximum": 1}, "payload": {"$ref": f"#/$defs/{event_type}.v1"}}}})
    doc["allOf"] = rules
    doc["$defs"] = defs
    return doc


def _is(event_type: str, version: int | None = None) -> dict[str, Any]:
    """The `if` of an envelope of `event_type` (and `version`; version 1 also when absent or null)."""
    props: dict[str, Any] = {"type": {"const": event_type}}
    if version is not None:
        props["version"] = {"enum": [1, None]} if version == 1 else {"const": version}
    return {"properties": props, "required": ["type"] if version in (None, 1) else ["type", "version"]}
