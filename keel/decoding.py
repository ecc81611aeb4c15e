"""Typed decoding of envelopes at C speed (msgspec), beside the pydantic model that stays their schema.

pydantic (keel/envelope.py) defines the envelope: its JSON schema, its checks and the words of every refusal.
msgspec decodes the common, valid envelope into a Struct derived from that same schema (pydantic's core schema:
field names, required or not, null allowed or not, string lengths, patterns) at a fraction of the cost
(docs/performance.md, "Typed decoding"). The fast path only ever accepts: whatever it cannot accept for certain
(malformed JSON, an unmet constraint, deep nesting, NaN or a number beyond a double, which pydantic reads as
infinity) gives None, and the caller runs pydantic, which accepts it or says why not.
"""
from __future__ import annotations

import functools
import json
import operator
import re
from typing import Annotated, Any

import msgspec

# pydantic's JSON parser refuses nesting 200 levels deep (tests/test_decoding.py finds the limit), msgspec goes
# deeper: an envelope with more opening brackets than this (in strings too: it only bounds the depth from
# above) takes the pydantic path. Text shorter than twice this cannot hold that many pairs, and is not counted.
SAFE_DEPTH = 180
_VALID_MAX = 65536      # strings remembered per pattern as matching it (tenants and subjects repeat)


_VALUE = msgspec.json.Decoder()


def json_value(text: str | bytes) -> Any:
    """JSON text → value: msgspec (C; about ten times json.loads on the short values of Redis members), the json
    module for what msgspec refuses (integers beyond 64 bits); ValueError when it is not JSON."""
    try:
        return _VALUE.decode(text)
    except msgspec.DecodeError:
        return json.loads(text)


def python_pattern(pattern: str) -> re.Pattern[str]:
    """pydantic's (Rust) pattern for Python's `re`: Python's `$` also matches before a trailing newline, `\\Z`
    does not."""
    return re.compile(pattern.removesuffix("$") + r"\Z")


class TypedDecoder:
    """Decodes envelope text into a msgspec Struct built from a pydantic typed-dict core schema."""
    __slots__ = ("_decode", "_patterns", "struct")

    def __init__(self, schema: dict[str, Any], name: str = "Decoded") -> None:
        if schema.get("type") != "typed-dict" or schema.get("extra_behavior") != "forbid":
            raise TypeError(f"TypedDecoder needs a typed-dict schema that forbids extra fields, not {schema!r}")
        required, optional = [], []
        patterns = []
        for field, spec in schema["fields"].items():
            kind, pattern = _field_type(field, spec["schema"])
            if pattern is not None:
                patterns.append((field, python_pattern(pattern)))
            if spec.get("required", True):
                required.append((field, kind))
            else:
                optional.append((field, kind, None))      # absent reads as None, as `env.get` did
        self.struct: type[msgspec.Struct] = msgspec.defstruct(
            name, [*required, *optional], kw_only=True, forbid_unknown_fields=True, gc=False)
        self._decode = msgspec.json.Decoder(self.struct).decode
        # (field, pattern, values known to match): a pattern is checked here, not by msgspec, so that a
        # tenant or subject seen before costs a set lookup instead of a regex (msgspec calls `re` each time).
        self._patterns = tuple((field, pattern.match, set()) for field, pattern in patterns)

    def decode(self, raw: bytes | str) -> Any:
        """The Struct of a valid envelope, or None when pydantic must decide (it may still accept)."""
        if len(raw) > 2 * SAFE_DEPTH:      # fewer bytes than that cannot open more brackets than SAFE_DEPTH
            if type(raw) is bytes:
                opens = raw.count(b"{") + raw.count(b"[")
            elif type(raw) is str:
                opens = raw.count("{") + raw.count("[")
            else:
                return None
            if opens > SAFE_DEPTH:
                return None
        try:
            env = self._decode(raw)
        except Exception:         # noqa: BLE001 - any refusal (bad JSON, a type, a length, depth) is pydantic's
            return None
        for field, match, valid in self._patterns:
            value = getattr(env, field)
            if value is None or value in valid:
                continue
            if match(value) is None:
                return None
            if len(valid) >= _VALID_MAX:
                valid.clear()
            valid.add(value)
        return env

    def from_dict(self, env: dict[str, Any]) -> Any:
        """A dict pydantic validated against the same schema, as the Struct `decode` gives."""
        return self.struct(**env)


def _field_type(field: str, schema: dict[str, Any]) -> tuple[Any, str | None]:
    """The msgspec type of one field's core schema, and its pattern (checked in Python, see above)."""
    kind = schema["type"]
    if kind == "nullable":
        inner, pattern = _field_type(field, schema["schema"])
        return inner | None, pattern
    if kind == "str":
        known = {"type", "min_length", "max_length", "pattern", "metadata"}
        if set(schema) - known:
            raise TypeError(f"field {field!r}: string constraints {sorted(set(schema) - known)} have no fast path")
        lengths = {k: schema[k] for k in ("min_length", "max_length") if k in schema}
        return (Annotated[str, msgspec.Meta(**lengths)] if lengths else str), schema.get("pattern")
    if kind == "int":               # a strict integer (`version`): msgspec refuses bools and floats as pydantic does
        known = {"type", "strict", "ge", "le", "metadata"}
        if set(schema) - known or not schema.get("strict"):
            raise TypeError(f"field {field!r}: only a strict integer with ge/le has a fast path, not {schema!r}")
        bounds = {k: schema[k] for k in ("ge", "le") if k in schema}
        return (Annotated[int, msgspec.Meta(**bounds)] if bounds else int), None
    if kind == "dict" and schema.get("keys_schema", {}).get("type") == "str" \
            and schema.get("values_schema", {}).get("type") == "any" and set(schema) <= {
                "type", "keys_schema", "values_schema", "metadata"}:
        return dict[str, Any], None
    raise TypeError(f"field {field!r}: no fast path for the schema {schema!r}")


def exact_shape(name: str, fields: dict[str, tuple[frozenset[type], bool]]) -> type[msgspec.Struct]:
    """A Struct that `msgspec.convert` fills, in C, only from a dict of JSON values with exactly these keys, each
    of one of its types (`field: (types, optional)`; an optional field may be absent or null). It checks; its
    instances are dropped. For values that came from JSON text only: `convert` also takes a tuple for a list."""
    spec = []
    for i, (field, (types, optional)) in enumerate(fields.items()):
        kind = functools.reduce(operator.or_, sorted(types, key=lambda t: t.__name__))
        if optional:
            spec.append((f"f{i}", kind | None, msgspec.field(default=None, name=field)))
        else:
            spec.append((f"f{i}", kind, msgspec.field(name=field)))
    return msgspec.defstruct(name, spec, kw_only=True, forbid_unknown_fields=True, gc=False)


_SORTED = msgspec.json.Encoder(order="sorted")


def canonical_json(head: tuple[Any, ...], payload: Any, slow: Any) -> bytes:
    """`[*head, payload]` as compact JSON with sorted keys, byte for byte what `slow` (a json.JSONEncoder with
    sort_keys, compact separators, ensure_ascii=False) makes, encoded as UTF-8 with surrogatepass: msgspec at
    C speed where the two agree, `slow` where they may not (a float in exponent form or not finite, or
    anything msgspec refuses, like a lone surrogate). `head` is not empty and holds no floats (strings,
    integers, None).
    Content hashes of stored events depend on these bytes."""
    try:
        body = _SORTED.encode(payload)
        text = _SORTED.encode(head)
    except (TypeError, ValueError, OverflowError, UnicodeError):
        body = None
    if body is None or not _numbers_agree(payload if type(payload) is dict else (payload,)):
        return slow.encode((*head, payload)).encode("utf-8", "surrogatepass")
    return text[:-1] + b"," + body + b"]"


def _numbers_agree(value: Any) -> bool:
    """Whether msgspec writes every float in a JSON-like value as json does: both use the shortest repr, but
    msgspec writes 1e16 and 0.00001 where json writes 1e+16 and 1e-05, and null for inf and NaN."""
    for x in (value.values() if type(value) is dict else value):
        kind = type(x)
        if kind is float:
            if not 1e-4 <= (x if x >= 0.0 else -x) < 1e16 and x != 0.0:
                return False
        elif (kind is dict or kind is list or kind is tuple) and not _numbers_agree(x):
            return False
    return True
