"""Reading cartridge.yaml: PyYAML's safe loader made strict where a slip would pass silently (a key named twice, a
flow mapping's entry cut by an unquoted comma), and YAML problems that name the line and the usual cause."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml


class CartridgeLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a mapping naming one key twice is an error (PyYAML keeps the last), and
    that a flow mapping's entry without a value is taken out and kept in `slips`.

    `{description: a rentable unit, in a property}` is valid YAML: the unquoted comma ends the value `a rentable
    unit`, and `in a property` becomes a key of its own, valued null. In a cartridge that is always a slip (no
    key of the format is meant without a value), so it is reported with its line and the quoted form, and left out:
    the entry is checked as if the text after the comma were not there, so nothing else fails because of it."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.slips: list[str] = []

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if node.flow_style:
            node.value = self._without_slips(node)
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:
                continue                        # an unhashable key: construct_mapping below reports it
            if first != key_node.start_mark.line + 1:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first at line {first})", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)

    def _without_slips(self, node: yaml.MappingNode) -> list[tuple[yaml.Node, yaml.Node]]:
        """The entries of a flow mapping but those without a value; each run of them is one slip."""
        kept: list[tuple[yaml.Node, yaml.Node]] = []
        run: list[yaml.Node] = []
        for key, value in node.value:
            if _no_value(key, value):
                run.append(key)
                continue
            if run:
                self.slips.append(_slip(kept[-1] if kept else None, run))
                run = []
            kept.append((key, value))
        if run:
            self.slips.append(_slip(kept[-1] if kept else None, run))
        return kept


def _no_value(key: yaml.Node, value: yaml.Node) -> bool:
    """A flow mapping entry written without `:` (`{a: 1, b}`: b), as opposed to an explicit empty value (`b:`)."""
    if not (isinstance(value, yaml.ScalarNode) and value.tag == "tag:yaml.org,2002:null" and value.value == ""):
        return False
    text = key.end_mark.buffer
    if text is None:
        return key.end_mark.index == value.start_mark.index
    return ":" not in text[key.end_mark.pointer:value.start_mark.pointer]


def _slip(before: tuple[yaml.Node, yaml.Node] | None, run: list[yaml.Node]) -> str:
    """The problem of keys without a value after the entry `before`: where, why, and the value quoted."""
    first = run[0].start_mark
    where = f"line {first.line + 1}, column {first.column + 1}"
    names = ", ".join(repr(str(k.value)) for k in run)
    hint = "quote a value that holds commas or colons"
    if before is not None and isinstance(before[1], yaml.ScalarNode) and before[1].style is None \
            and before[1].start_mark.buffer is not None:
        key, value = before
        whole = value.start_mark.buffer[value.start_mark.pointer:run[-1].end_mark.pointer]
        return (f"{where}: {names} has no value: an unquoted comma inside {{…}} ended the value of {key.value} "
                f"({str(value.value)!r}) there; {hint}: {key.value}: {json.dumps(whole, ensure_ascii=False)}")
    return f"{where}: {names} has no value (an entry of {{…}} without ':'); {hint}"


def yaml_problem(file: Path, e: yaml.YAMLError) -> str:
    """A YAML error as one line: the file, line and column, what is wrong, and the usual cause: an unquoted colon
    (or, inside {…} or […], a comma) in a value."""
    if not isinstance(e, yaml.MarkedYAMLError):
        return f"{file}: not valid YAML: {e}"
    mark = e.problem_mark or e.context_mark
    where = f"{file}:line {mark.line + 1}, column {mark.column + 1}" if mark is not None else str(file)
    problem = str(e.problem or e.context or "")
    if problem.startswith("duplicate key"):
        return f"{where}: {problem}"
    context = ""
    if e.context and e.context_mark is not None and e.context_mark is not mark:
        context = f" ({e.context}, from line {e.context_mark.line + 1}, column {e.context_mark.column + 1})"
    quote = "quote a value that holds colons or commas (description: \"a: b, c\")"
    if "'\\t'" in problem:
        hint = "indent with spaces, not tabs"
    elif "':'" in problem or "mapping values are not allowed" in problem:
        hint = f"{quote}: a colon followed by a space, and inside {{…}} or […] a comma, end a plain value"
    else:
        hint = f"check the quoting, brackets and indentation there; {quote}"
    return f"{where}: not valid YAML: {problem}{context}; {hint}"


def line_of(root: yaml.Node, loc: tuple[Any, ...]) -> int | None:
    """The line (from 1) of the deepest key or item of `loc` found in the YAML node tree."""
    node, line = root, None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            found = next(((k, v) for k, v in node.value if str(k.value) == str(part)), None)
            if found is None:
                break
            line, node = found[0].start_mark.line + 1, found[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line
