"""The one argument rule of the five tools (keel/tool_args.py): an optional argument that is absent, null, or the
empty value of its type (`""` for a name, text or time; false for a flag; a number's default) is not given, so
the call a strict-mode model makes (every property present, the unused ones empty) answers as the minimal call;
only a real request for two things that cannot go together is refused. And the schemas say so: every optional
argument is nullable, in the spelling the Inspector's portability check accepts."""
from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from keel import Tools, UsageError, load_cartridge
from keel.embedded import build_embedded
from keel.eventlog import FileLog
from keel.times import parse_time
from tools_server.surface import SPECS

ROOT = Path(__file__).resolve().parents[1]
FINANCE = ROOT / "cartridges" / "finance"
NOW = parse_time("2026-11-30T12:00:00Z")
SCHEMAS = {s.name: s.input_schema for s in SPECS}


@pytest.fixture
def make(tmp_path: Path) -> Any:
    events = tmp_path / "events.jsonl"
    shutil.copyfile(FINANCE / "events.jsonl", events)
    cartridge = load_cartridge(FINANCE)
    projector, _ = build_embedded(cartridge, events)
    clock = iter(range(NOW, NOW + 10**12, 1_000_000))     # a new second per call: notes are distinct writes

    def tools() -> Tools:
        return Tools(cartridge, projector.store, "hogar-demo", agent="a1", task="t1",
                     log=FileLog(projector, events), clock=lambda: next(clock))
    return tools


def empties(schema: dict[str, Any], name: str) -> list[Any]:
    """The values a strict-mode caller may send for an argument it does not mean to use."""
    prop = schema["properties"][name]
    text = json.dumps(schema["$defs"][prop["$ref"].rpartition("/")[2]] if "$ref" in prop else prop)
    out: list[Any] = [None]
    if '"string"' in text:
        out.append("")
    if '"boolean"' in text:
        out.append(False)
    if "Default " in prop.get("description", ""):
        out.append(int(prop["description"].split("Default ")[1]))
    return out


def strict_calls(tool: str, minimal: dict[str, Any]) -> list[dict[str, Any]]:
    """Every way of sending each property the minimal call leaves out as an empty value, all at once."""
    schema = SCHEMAS[tool]
    unused = [n for n in schema["properties"] if n not in minimal]
    return [{**minimal, **dict(zip(unused, values))}
            for values in itertools.product(*(empties(schema, n) for n in unused))]


def call(tools: Tools, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    args = dict(arguments)
    if tool == "annotate":
        return dict(tools.annotate(args.pop("entity"), args.pop("predicate"), args.pop("value", None),
                                   args.pop("scope"), **args))
    positional = args.pop("entity", None) if tool != "search" else args.pop("query")
    return dict(getattr(tools, tool)(positional, **args))


READS = [
    ("context", {"entity": "debt:visa", "at": "2026-09-15"}),
    ("history", {"entity": "debt:visa"}),
    ("history", {"entity": "debt:visa", "predicate": "balance_cop"}),
    ("history", {"since": "2020-01-01"}),
    ("history", {"since": "2020-01-01", "limit": 3}),
    ("search", {"query": "visa"}),
    ("related", {"entity": "debt:visa"}),
]


@pytest.mark.parametrize(("tool", "minimal"), READS, ids=[f"{t}-{'-'.join(m)}" for t, m in READS])
def test_a_strict_mode_call_answers_as_the_minimal_call(make: Any, tool: str, minimal: dict[str, Any]) -> None:
    expected = call(make(), tool, minimal)
    variants = strict_calls(tool, minimal)
    assert len(variants) > 1
    for arguments in variants:
        assert call(make(), tool, arguments) == expected, arguments


def test_a_strict_mode_note_and_withdrawal(make: Any) -> None:
    note = {"entity": "debt:visa", "predicate": "next_step", "value": "call the bank", "scope": "agent"}
    for i, arguments in enumerate(strict_calls("annotate", note)):
        written = call(make(), "annotate", {**arguments, "value": f"call the bank {i}"})
        assert written["applied"] and written["fact"]["value"] == f"call the bank {i}"
        assert "withdrawn" not in written["fact"]
    for i, (value, reason) in enumerate(((None, None), ("", ""), (None, "done"))):
        make().annotate("debt:visa", "next_step", f"again {i}", "agent")
        closed = make().annotate("debt:visa", "next_step", value, "agent", withdraw=True, evidence="",
                                 reason=reason)
        assert closed["applied"] and closed["fact"]["withdrawn"]["reason"] == (reason or None)


@pytest.mark.parametrize(("arguments", "message"), [
    ({"entity": "debt:visa", "since": "2020-01-01"}, "go without an entity"),
    ({"entity": "debt:visa", "type": "debt"}, "go without an entity"),
    ({"entity": "debt:visa", "limit": 50}, "go without an entity"),
    ({"entity": "", "since": "2020-01-01", "known_at": "2026-09-15"}, "go with an entity"),
    ({"entity": None, "predicate": "balance_cop", "since": "2020-01-01"}, "go with an entity"),
    ({"entity": ""}, "since: a recorded time"),
    ({"since": "2020-01-01", "limit": 0}, "limit: an integer from 1 to 500"),
    ({"since": "2020-01-01", "limit": True}, "limit: an integer from 1 to 500"),
])
def test_history_refuses_only_real_contradictions(make: Any, arguments: dict[str, Any], message: str) -> None:
    entity = arguments.pop("entity", None)
    with pytest.raises(UsageError, match=message):
        make().history(entity, **arguments)


@pytest.mark.parametrize(("arguments", "message"), [
    ({"withdraw": False, "reason": "changed my mind"}, "only a withdrawal"),
    ({"withdraw": True, "value": "x"}, "a withdrawal takes no value"),
    ({"withdraw": "yes"}, "withdraw: true"),
    ({"value": ""}, "value: required"),
    ({"value": None}, "value: required"),
    ({"scope": ""}, "scope: required"),
])
def test_annotate_refuses_only_real_contradictions(make: Any, arguments: dict[str, Any], message: str) -> None:
    args = {"value": "call the bank", "scope": "agent", **arguments}
    with pytest.raises(UsageError, match=message):
        make().annotate("debt:visa", "next_step", args.pop("value"), args.pop("scope"), **args)


def test_search_takes_null_and_empty_for_its_options(make: Any) -> None:
    plain = make().search("visa")
    assert make().search("visa", type="", limit=None, at="", known_at=None) == plain
    with pytest.raises(UsageError, match="limit: an integer from 1 to 100"):
        make().search("visa", limit=0)
    with pytest.raises(UsageError, match="is not an entity type"):
        make().search("visa", type="nothing")


def _nodes(schema: Any, path: str = "") -> list[tuple[str, Any]]:
    """Every subschema of a schema with its path (the places the Inspector's portability check visits)."""
    out = [(path, schema)]
    if isinstance(schema, dict):
        for key in ("properties", "$defs", "patternProperties"):
            for name, sub in schema.get(key, {}).items():
                out += _nodes(sub, f"{path}.{key}.{name}")
        for key in ("anyOf", "oneOf", "allOf", "prefixItems"):
            for i, sub in enumerate(schema.get(key, [])):
                out += _nodes(sub, f"{path}.{key}[{i}]")
        for key in ("items", "additionalProperties", "not", "contains", "propertyNames"):
            if isinstance(schema.get(key), dict):
                out += _nodes(schema[key], f"{path}.{key}")
    return out


CONSTRAINING = {"type", "enum", "const", "anyOf", "oneOf", "allOf", "not", "$ref", "properties", "items",
                "required", "additionalProperties", "propertyNames", "minimum", "maximum", "pattern", "format"}


@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_schemas_are_portable(spec: Any) -> None:
    """No `type` array (a single-type dialect such as Gemini's rejects it), no schema that constrains nothing, no
    reference outside the document: the rules of the MCP Inspector's portability check (tests/test_agent_clients.py
    runs the Inspector itself)."""
    for kind, schema in (("input", spec.input_schema), ("output", spec.output_schema)):
        for path, node in _nodes(schema):
            assert isinstance(node, dict), f"{kind}{path}: a bare boolean schema"
            assert not isinstance(node.get("type"), list), f"{kind}{path}: a type array"
            assert set(node) & CONSTRAINING, f"{kind}{path}: an untyped schema"
            assert str(node.get("$ref", "#")).startswith("#"), f"{kind}{path}: a remote $ref"
        Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("spec", SPECS, ids=[s.name for s in SPECS])
def test_every_optional_argument_is_nullable(spec: Any) -> None:
    schema = spec.input_schema
    validator = Draft202012Validator(schema)
    required = {name: "debt:visa" if name == "entity" else "tenant" if name == "scope" else "x"
                for name in schema.get("required", [])}
    for name in schema["properties"]:
        if name not in required:
            errors = list(validator.iter_errors({**required, name: None}))
            assert not errors, f"{spec.name}.{name}: null refused: {errors[0].message}"
    everything = {**required, **{n: None for n in schema["properties"] if n not in required}}
    assert validator.is_valid(everything)     # a strict-mode call: every property present


def test_the_output_schema_check_refuses_an_undeclared_key(make: Any) -> None:
    """The suite-wide check (tests/conftest.py) is not vacuous: a result with a key its schema does not declare
    fails it, and the results of this module's calls were checked."""
    from support.output_schemas import CHECKED, check_result
    before = CHECKED["context"]
    result = make().context("debt:visa", known_at="2026-10-01")
    assert "applied_through" in result and CHECKED["context"] == before + 1
    with pytest.raises(AssertionError, match="'surprise' was unexpected"):
        check_result("context", {**result, "surprise": 1})
