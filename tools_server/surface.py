"""The tool surface as data: the five tools' names, descriptions, input and output schemas and hints.

It is part of every agent's prompt, so it is written by hand, kept short, and is the same bytes for
every tenant, cartridge and restart: no tenant names, counts, dates or domain words. The golden file
tests/golden/tools_list.json pins it; change both together, on purpose.
"""
from __future__ import annotations

import json
from typing import Any, NamedTuple

from mcp_types import Tool as MCPTool
from mcp_types import ToolAnnotations

TOOL_NAMES = ("context", "history", "search", "annotate", "related")
TOKEN_GOAL = 1500
BYTES_LIMIT = 6000                      # the tools array of tools/list, compact JSON, UTF-8
LIST_TOOLS_TTL_MS = 24 * 3600 * 1000    # the surface changes only with a Keel release

_S: dict[str, Any] = {"type": "string"}
_NULL: dict[str, Any] = {"type": "null"}


def _nullable(schema: dict[str, Any], description: str | None = None) -> dict[str, Any]:
    """`schema` or null, as anyOf branches of one type each: the spelling that OpenAI's strict mode, Gemini's
    converters and the Inspector's portability check all accept (a `type` array is not)."""
    out: dict[str, Any] = {"anyOf": [schema, _NULL]}
    if description:
        out["description"] = description
    return out


_NS = _nullable(_S)
_N = {"$ref": "#/$defs/n"}      # a string or null: a local $ref where a schema has three or more (see _shared_nulls)


def _arg(description: str) -> dict[str, Any]:
    """An optional text argument: nullable, so that a strict-mode caller (every property required) can leave it
    out by sending null; `""` counts as absent too (keel/tool_args.py)."""
    return {**_N, "description": description}


def _shared_nulls(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with its string-or-null properties as one local definition (`#/$defs/n`) when three or more share
    it, else spelled out in place: the shorter of the two."""
    properties = schema["properties"]
    if sum(v.get("$ref") == _N["$ref"] for v in properties.values()) >= 3:
        return {**schema, "$defs": {"n": _NS}}
    inline = {k: {**_NS, **{x: y for x, y in v.items() if x != "$ref"}} if v.get("$ref") == _N["$ref"] else v
              for k, v in properties.items()}
    return {**schema, "properties": inline}


_ENTITY = {"type": "string", "description": "<type>:<id> from search"}
_AT = _arg("World time: date or RFC 3339")
_KNOWN_AT = _arg("As known then")
_TYPE = _arg("Only this type")
# A note's value in the schema: what OpenAI's strict mode can express (it refuses an object open to any key, so a
# strict converter would send the tool non-strict); a JSON object or array is accepted too (keel.tool_args.note_value)
# from a caller that does not hold to the schema, e.g. the Python API.
_SCALARS = [{"type": "string"}, {"type": "number"}, {"type": "boolean"}]

# Output schemas: every key of a result typed (a client such as FastMCP builds its result type from them and drops
# undeclared keys); the records inside (facts, versions, relations, changes) are objects, their keys and types in
# docs/contracts.md and keel/results.py. Typing those keys too would take the surface past BYTES_LIMIT (measured:
# about 7,700 bytes).
_RECORDS = {"type": "array", "items": {"type": "object"}}
_LABELS = {"type": "object"}            # label name -> JSON value


def _object(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        out["required"] = required
    return out


def _input(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """An input schema: strict, an unknown argument is an error (tools_server.server enforces it)."""
    return _shared_nulls({**_object(properties, required), "additionalProperties": False})


def _array(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


def _result(properties: dict[str, Any]) -> dict[str, Any]:
    """An output schema: the tool's properties, then what every result may end with (docs/contracts.md,
    "known_through"): `known_through`; with known_at, `applied_through`; on a Redis graph, `lag` and, when Kafka
    has not answered since, `lag_measured_at`."""
    out = _object({**properties, "known_through": _N, "applied_through": _N, "lag": {"type": "integer"},
                   "lag_measured_at": _S})
    return _shared_nulls(out)


# A rule with `when:` carries Keel's verdict: holds (null: see missing or reason) and its evidence ids; the rest of
# a rule's keys are the cartridge's own.
_RULES = {"type": "object"}     # rule name -> the rule's definition, parameters and verdict


class ToolSpec(NamedTuple):
    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    annotations: ToolAnnotations


_READER = ToolAnnotations(read_only_hint=True, open_world_hint=False)
_WRITER = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)   # not idempotent:
# MCP's default, left out (a withdrawal closes a note but keeps it in history: nothing is destroyed)

SPECS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "context",
        "An entity's labels, facts with evidence, relations, rule verdicts. Use it for what is true.",
        _input({"entity": _ENTITY, "at": _AT, "known_at": _KNOWN_AT}, ["entity"]),
        _result({"entity": _S, "type": _S, "ref": _N, "labels": _LABELS, "at": _N, "known_at": _N,
                 "facts": _RECORDS, "relations": _RECORDS, "rules": _RULES}),
        _READER),
    ToolSpec(
        "history",
        "An entity's versions of labels, facts, notes, relations, superseded too; no entity: changes since. "
        "Use it to explain or catch up.",
        _input({"entity": _arg("<type>:<id>; none: changes"),
                "predicate": _arg("Only this name"), "known_at": _KNOWN_AT,
                "since": _arg("After this time"), "type": _TYPE,
                "cursor": _arg("Previous cursor"),
                "limit": _nullable({"type": "integer", "maximum": 500}, "Default 100")},
               []),
        _result({"entity": _S, "versions": _RECORDS, "labels": _RECORDS, "relations": _RECORDS, "since": _N,
                 "type": _N, "changes": _RECORDS, "cursor": _S, "more": {"type": "boolean"}}),
        _READER),
    ToolSpec(
        "search",
        "Find entity ids by words or meaning. Use it first without an id.",
        _input({"query": {"type": "string", "description": "Names, labels, notes"}, "type": _TYPE,
                "limit": _nullable({"type": "integer", "maximum": 100}, "Default 10"),
                "at": _AT, "known_at": _KNOWN_AT}, ["query"]),
        _result({"query": _S, "results": _array({"type": "object", "properties": {
            "entity": _S, "type": _S, "labels": _LABELS, "score": {"type": "number"}, "found_by": _S}}),
            "message": _S}),
        _READER),
    ToolSpec(
        "annotate",
        "Save a note on an entity or withdraw yours. Use it for conclusions or next steps, citing evidence.",
        _input({"entity": _ENTITY,
                "predicate": {"type": "string", "description": "Note name, e.g. next_step"},
                "value": {"anyOf": [*_SCALARS, _NULL], "description": "Text, number or boolean"},
                "scope": {"type": "string", "enum": ["tenant", "task", "agent", "global"],
                          "description": "tenant: all agents; task: yours; agent: you; global: all tenants"},
                "evidence": _arg("Event id behind it; some scopes need it"),
                "withdraw": _nullable({"type": "boolean"}, "Close your note"),
                "reason": _arg("Why you withdraw")},
               ["entity", "predicate", "scope"]),
        _result({"fact": {"type": "object"}, "applied": {"type": "boolean"}, "event_id": _S, "message": _S}),
        _WRITER),
    ToolSpec(
        "related",
        "An entity's relations both ways, with validity. Use it to reach linked entities.",
        _input({"entity": _ENTITY, "relation": _arg("Only this name"), "at": _AT, "known_at": _KNOWN_AT},
               ["entity"]),
        _result({"entity": _S, "relations": _RECORDS}),
        _READER),
)


def mcp_tools() -> list[MCPTool]:
    """The five tools as tools/list returns them, in the fixed order."""
    return [MCPTool(name=s.name, description=s.description, input_schema=s.input_schema,
                    output_schema=s.output_schema, annotations=s.annotations) for s in SPECS]


def tools_json(tools: list[MCPTool] | None = None, *, indent: int | None = 2) -> str:
    """Canonical JSON of a tools list (the golden file's form with indent=2; compact with None)."""
    data = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in (tools or mcp_tools())]
    separators = (",", ":") if indent is None else None
    return json.dumps(data, indent=indent, ensure_ascii=False, separators=separators)


def approx_tokens(text: str) -> int:
    """A rough token count (characters / 4), enough to watch the surface's size."""
    return (len(text) + 3) // 4
