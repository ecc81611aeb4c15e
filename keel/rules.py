"""Rule verdicts: a cartridge rule's `when:` condition, in CEL, evaluated by Keel over one entity's view.

Keel, not each agent, compares the facts with the rule, so every agent asking the same question gets the
same verdict, byte for byte. The expression language is CEL (the `common-expression-language` package,
bindings to the Rust `cel` crate; bench/cel_libraries.py compares it with `cel-python`).

Variables of an expression (nothing else is visible; there is no I/O and no clock but `at`):
    facts      predicate -> value of the entity's domain facts valid at `at` as known at `known_at`
               (notes are agent memory and never feed a verdict)
    labels     label -> value, as of the same times
    params     the rule's parameters (its keys besides applies_to, definition and when)
    relations  relation name -> sorted ids of the entities at the other end, valid at `at`; every relation
               the cartridge declares with the rule's entity type at either end is present (an empty list
               when no link holds at that `at`/`known_at`)
    at         the question's world time, a timestamp

Values are given to CEL as JSON gives them, with two normalisations: every number is a double (JSON
has one number type, so `4.0 > 20` is false and `25.0 == 25` true, never a type error), and a string in
RFC 3339 form, a date (`2026-11-05`, midnight UTC) or a date-time with an offset, is a timestamp, so
dates compare in time order with each other, with `at` and with `timestamp(...)`, and take
`duration(...)` arithmetic.

A verdict is `holds` true or false, or null with `missing` (the facts or labels it named that the entity
lacks) or a `reason` (a failed evaluation: division by zero, mismatched types, a result that is not a
boolean). `because` lists the evidence event ids of the facts the expression reads.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from .errors import BadTime
from .times import Micros, parse_time

VARIABLES = ("facts", "labels", "params", "relations", "at")
RESERVED = ("applies_to", "definition", "when", "holds", "because", "missing", "reason")
MAX_EXPRESSION = 2000
MAX_REASON = 200
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TIMEISH = re.compile(r"^\d{4}-\d{2}-\d{2}(?:[Tt]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:[Zz]|[+-]\d{2}:\d{2}))?$")
_TOKEN = re.compile(r"""
    (?P<str>(?:[rR][bB]?|[bB][rR]?)?(?:'''.*?'''|\"\"\".*?\"\"\"|'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*"))
  | (?P<id>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<sym>[.\[\](,])
  | (?P<num>\d+(?:\.\d*)?(?:[eE][+-]?\d+)?[uU]?)
  | (?P<space>\s+)
  | (?P<other>.)""", re.VERBOSE | re.DOTALL)
_MACROS = {"all", "exists", "exists_one", "map", "filter", "transformList", "transformMap"}
_WORDS = {"true", "false", "null", "in"}


@dataclass(frozen=True)
class Names:
    """What an expression names: `facts.x` / `facts['x']` per variable, other free identifiers, and the
    variables it also uses as a whole (e.g. `facts[params.name]`, `'x' in facts`)."""
    selected: dict[str, frozenset[str]]
    free: frozenset[str]
    whole: frozenset[str]
    used: frozenset[str]


def names_used(expression: str) -> Names:
    """The names an expression reads, from its tokens (string literals never count)."""
    tokens = [(m.lastgroup, m.group()) for m in _TOKEN.finditer(expression) if m.lastgroup != "space"]
    selected: dict[str, set[str]] = {v: set() for v in VARIABLES}
    free: set[str] = set()
    whole: set[str] = set()
    used: set[str] = set()
    bound: set[str] = set()
    for i, (kind, text) in enumerate(tokens):
        if kind == "id" and text in _MACROS and i + 2 < len(tokens) and tokens[i + 1][1] == "(":
            j = i + 2                               # .exists(x, …), .all(k, v, …): the bound variables
            while j + 1 < len(tokens) and tokens[j][0] == "id" and tokens[j + 1][1] == ",":
                bound.add(tokens[j][1])
                j += 2
    for i, (kind, text) in enumerate(tokens):
        if kind != "id" or text in _WORDS or (i > 0 and tokens[i - 1][1] == "."):
            continue
        nxt = tokens[i + 1] if i + 1 < len(tokens) else ("", "")
        if nxt[1] == "(":
            continue                                # a function or macro name
        if text in bound:
            continue
        if text not in selected:
            free.add(text)
            continue
        used.add(text)
        after = tokens[i + 2] if i + 2 < len(tokens) else ("", "")
        if nxt[1] == "." and after[0] == "id":
            selected[text].add(after[1])
        elif nxt[1] == "[" and after[0] == "str" and i + 3 < len(tokens) and tokens[i + 3][1] == "]" \
                and (name := _plain_string(after[1])) is not None:
            selected[text].add(name)
        elif text != "at":
            whole.add(text)
    return Names({k: frozenset(v) for k, v in selected.items()}, frozenset(free), frozenset(whole),
                 frozenset(used))


def _plain_string(literal: str) -> str | None:
    """The value of a simple quoted literal ('x' or "x", no escapes); None for anything else."""
    if len(literal) >= 2 and literal[0] in "'\"" and literal[-1] == literal[0] and "\\" not in literal \
            and not literal.startswith(("'''", '"""')):
        return literal[1:-1]
    return None


@dataclass(frozen=True)
class Rule:
    """One cartridge rule: its definition and parameters, and when it has `when:`, the compiled program."""
    name: str
    applies_to: str
    definition: str
    params: dict[str, Any]
    when: str | None = None
    program: Any = None
    names: Names | None = None
    cel_params: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        """What `context` shows of the rule besides its verdict (definition, parameters, condition)."""
        out: dict[str, Any] = {"definition": self.definition, **self.params}
        if self.when is not None:
            out["when"] = self.when
        return out


def compile_rule(name: str, applies_to: str, definition: str, params: Mapping[str, Any],
                 when: object) -> tuple[Rule, list[str]]:
    """A Rule, and the problems of its `when:` (syntax, size, names outside the five variables and
    parameters not declared), each naming the rule."""
    params = dict(params)
    if when is None:
        return Rule(name, applies_to, definition, params), []
    where = f"rules.{name}.when"
    if not isinstance(when, str) or not when.strip():
        return Rule(name, applies_to, definition, params), [f"{where}: give a CEL expression as a string"]
    if len(when) > MAX_EXPRESSION:
        return Rule(name, applies_to, definition, params), [f"{where}: at most {MAX_EXPRESSION} characters"]
    problems = []
    try:
        program = _cel().compile(when)
    except (ValueError, RuntimeError, TypeError) as e:
        return Rule(name, applies_to, definition, params, when), [f"{where}: does not compile: {_first_line(e)}"]
    names = names_used(when)
    for free in sorted(names.free):
        problems.append(f"{where}: unknown name {free!r}; the variables are {', '.join(VARIABLES)}")
    for p in sorted(names.selected["params"] - set(params)):
        problems.append(f"{where}: params.{p} is not a parameter of the rule (it has "
                        f"{', '.join(sorted(params)) or 'none'})")
    try:
        cel_params = {k: cel_value(v) for k, v in params.items()}
    except (TypeError, ValueError) as e:
        problems.append(f"rules.{name}: parameter value not usable in CEL: {e}")
        cel_params = {}
    return Rule(name, applies_to, definition, params, when, program, names, cel_params), problems


def _cel() -> Any:
    """The CEL compiler: the `cel` package's Rust extension `cel.cel`, loaded at the first `when:` and without the
    package's __init__, which imports the package's command line (typer, rich): 0.2 s of CPU at the start of every
    process that loads a cartridge with `when:` rules, 0.03 s without. Kept as `cel.cel` in sys.modules, so that a
    later `import cel` uses it; the whole package where its extension is not found."""
    loaded = sys.modules.get("cel.cel")
    if loaded is not None:
        return loaded
    package = importlib.util.find_spec("cel")
    folders = package.submodule_search_locations if package is not None else None
    for path in (Path(f, f"cel{suffix}") for f in folders or () for suffix in importlib.machinery.EXTENSION_SUFFIXES):
        spec = importlib.util.spec_from_file_location("cel.cel", path) if path.is_file() else None
        if spec is not None and spec.loader is not None:
            module = importlib.util.module_from_spec(spec)
            sys.modules["cel.cel"] = module
            spec.loader.exec_module(module)
            return module
    import cel
    return cel


def check_names(rule: Rule, known: Mapping[str, Iterable[str]], origin: str = "of") -> list[str]:
    """Problems of the names a rule selects from the variables in `known` (facts, labels, relations) that
    its entity type does not have; `origin` says where the known names come from ("of", "met on")."""
    if rule.names is None:
        return []
    where = f"rules.{rule.name}.when"
    problems = []
    for var, names in known.items():
        have = set(names)
        for n in sorted(rule.names.selected[var] - have):
            problems.append(f"{where}: {var}.{n} is not a {var[:-1]} {origin} {rule.applies_to} entities "
                            f"(known: {', '.join(sorted(have)) or 'none'})")
    return problems


def verdict(rule: Rule, facts: Iterable[Mapping[str, Any]], labels: Mapping[str, Any],
            relations: Iterable[Mapping[str, Any]], entity: str, at: Micros,
            declared: Iterable[str] = ()) -> dict[str, Any]:
    """`{holds, because}` (plus `missing` or `reason` when holds is null) of a rule with `when:` for one
    entity's view: `facts` are fact results (domain facts only are used), `relations` relation results,
    `declared` the relation names of the entity's type (Cartridge.relations_of): each is in `relations`,
    an empty list when no link holds, so `size(relations.x) == 0` answers instead of failing."""
    assert rule.program is not None and rule.names is not None
    domain = {f["predicate"]: f for f in facts if f.get("scope") is None}
    read = rule.names.selected["facts"]
    evidence = domain.values() if "facts" in rule.names.whole else (domain[p] for p in read if p in domain)
    out: dict[str, Any] = {"holds": None,
                           "because": sorted({f["evidence"] for f in evidence if f.get("evidence")})}
    names = rule.names
    try:
        variables: dict[str, Any] = {}      # only what the expression uses: converting values is the cost
        if "facts" in names.used:
            variables["facts"] = {p: cel_value(f["value"]) for p, f in domain.items()
                                  if "facts" in names.whole or p in read}
        if "labels" in names.used:
            variables["labels"] = {k: cel_value(v) for k, v in labels.items()
                                   if "labels" in names.whole or k in names.selected["labels"]}
        if "params" in names.used:
            variables["params"] = rule.cel_params
        if "relations" in names.used:
            variables["relations"] = _relation_ids(relations, entity, declared)
        if "at" in names.used:
            variables["at"] = _timestamp(at)
        result = rule.program.execute(variables)
    except Exception as e:  # noqa: BLE001 - any failed evaluation is a null verdict with its reason
        missing = sorted((read - set(domain)) | (rule.names.selected["labels"] - set(labels)))
        if missing:
            out["missing"] = missing
        else:
            out["reason"] = _first_line(e)
        return out
    if isinstance(result, bool):
        out["holds"] = result
    else:
        out["reason"] = f"the condition gave {type(result).__name__} {_clip(repr(result))}, not true or false"
    return out


def cel_value(value: Any) -> Any:
    """A JSON (or YAML) value as CEL gets it: numbers as doubles, date strings as timestamps."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        if _TIMEISH.match(value):
            try:
                return _timestamp(parse_time(value))
            except BadTime:
                return value
        return value
    if isinstance(value, datetime):
        return _timestamp(parse_time(value)) if value.tzinfo is not None else value.isoformat()
    if isinstance(value, date):
        return _timestamp(parse_time(value))
    if isinstance(value, dict):
        return {str(k): cel_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [cel_value(v) for v in value]
    raise TypeError(f"{type(value).__name__} is not a JSON value")


def _timestamp(micros: Micros) -> datetime:
    return _EPOCH + timedelta(microseconds=micros)


def _relation_ids(relations: Iterable[Mapping[str, Any]], entity: str,
                  declared: Iterable[str] = ()) -> dict[str, list[str]]:
    out: dict[str, set[str]] = {name: set() for name in declared}
    for r in relations:
        other = r["object"] if r["subject"] == entity else r["subject"]
        out.setdefault(r["relation"], set()).add(other)
    return {name: sorted(ids) for name, ids in sorted(out.items())}


def _first_line(e: BaseException) -> str:
    """A short, stable reason from a library error: its first sentence, type first."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    text = text.split(". ")[0].rstrip(".")
    return _clip(f"{type(e).__name__}: {text}" if text else type(e).__name__)


def _clip(text: str, limit: int = MAX_REASON) -> str:
    return text if len(text) <= limit else text[:limit] + "…"
