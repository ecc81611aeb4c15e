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
_SN: dict[str, Any] = {"type": ["string", "null"]}


def _arg(description: str, **schema: Any) -> dict[str, Any]:
    return {"type": "string", **schema, "description": description}


_ENTITY = _arg("<type>:<id> from search")
_AT = _arg("World time: date or RFC 3339")
_KNOWN_AT = _arg("As known then; default now")
_TYPE = _arg("Only this entity type")

_FACT = {"type": "object", "properties": {
    "predicate": _S, "value": {}, "valid_from": _S, "valid_to": _SN, "recorded_at": _S, "source": _SN,
    "evidence": _SN, "scope": _SN, "by": _SN, "expires_at": _SN, "corrected_by": _SN}}
_RELATION = {"type": "object", "properties": {
    "subject": _S, "relation": _S, "object": _S, "valid_from": _S, "valid_to": _SN}}


def _object(properties: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        out["required"] = required
    return out


def _input(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """An input schema: strict, an unknown argument is an error (tools_server.server enforces it)."""
    return {**_object(properties, required), "additionalProperties": False}


def _array(items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": items}


def _result(properties: dict[str, Any]) -> dict[str, Any]:
    """An output schema: the tool's properties, then `known_through`, which every result carries (the
    recorded_at of the latest event applied for the tenant; Redis mode adds `lag`, see docs/contracts.md)."""
    return _object({**properties, "known_through": _SN})


# A rule with `when:` carries Keel's verdict: holds (null: see missing or reason) and its evidence ids.
_RULES = {"additionalProperties": {"properties": {
    "holds": {"type": ["boolean", "null"]}, "because": {"type": "array"}}}}


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
        _result({"entity": _S, "type": _S, "ref": _SN, "labels": {"type": "object"},
                 "facts": _array(_FACT), "relations": _array(_RELATION), "rules": _RULES}),
        _READER),
    ToolSpec(
        "history",
        "Versions of an entity's labels, facts, notes, relations, superseded too; no entity: changes since a "
        "time. Use it to explain or catch up.",
        _input({"entity": _ENTITY, "predicate": _arg("Only this predicate"), "known_at": _KNOWN_AT,
                "since": _arg("No entity: changes after this time"), "type": _TYPE,
                "cursor": _arg("Last answer's cursor"),
                "limit": {"type": "integer", "minimum": 1, "maximum": 500, "default": 100,
                          "description": "Max changes"}}, []),
        _result({"entity": _S, "versions": _array({**_FACT, "properties": {
            **_FACT["properties"], "superseded_at": _SN, "superseded_by": _SN}}),
            "changes": {"type": "array"}, "cursor": _SN, "more": {"type": "boolean"}}),
        _READER),
    ToolSpec(
        "search",
        "Find entity ids by words of ids, types, labels, notes. Use it first when you lack an id.",
        _input({"query": _arg("Words of a name, label, note, type"), "type": _TYPE,
                "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 10,
                          "description": "Max results"},
                "at": _AT, "known_at": _KNOWN_AT}, ["query"]),
        _result({"query": _S, "results": _array({"type": "object", "properties": {
            "entity": _S, "type": _S, "labels": {"type": "object"}, "score": {"type": "number"}}}),
                 "message": _S}),
        _READER),
    ToolSpec(
        "annotate",
        "Save a note on an entity for context and history, or withdraw yours. Use it for conclusions or "
        "next steps, citing evidence.",
        _input({"entity": _ENTITY,
                "predicate": _arg("Note name, e.g. next_step"),
                "value": {"description": "Text, number or JSON"},
                "scope": _arg("tenant: all agents; task: your task; agent: you; global: all tenants",
                              enum=["tenant", "task", "agent", "global"]),
                "evidence": _arg("Id of an event that wrote this entity; some scopes need it"),
                "withdraw": {"type": "boolean", "description": "Close your note of this name"},
                "reason": _arg("Why you withdraw")},
               ["entity", "predicate", "scope"]),
        _result({"fact": {"type": "object"}, "applied": {"type": "boolean"}, "event_id": _S, "message": _S}),
        _WRITER),
    ToolSpec(
        "related",
        "An entity's relations both ways, with validity. Use it to reach linked entities.",
        _input({"entity": _ENTITY, "relation": _arg("Only this relation"), "at": _AT, "known_at": _KNOWN_AT},
               ["entity"]),
        _result({"entity": _S, "relations": _array(_RELATION)}),
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
