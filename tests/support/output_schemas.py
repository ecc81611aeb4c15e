"""Every tool result the suite sees, checked against the tool's declared outputSchema with every declared object
closed (`additionalProperties: false` where the schema lists properties and says nothing else): a key a result
carries that the schema does not declare fails the test that made the call (issue: FastMCP's typed `.data` and
pydantic-ai drop undeclared keys silently).

`install()` wraps the five methods of keel.Tools and keel.ToolSet for the session (tests/conftest.py); MCP calls
made through `support.mcp_sessions.ok` are checked there, whatever process served them."""
from __future__ import annotations

import copy
import functools
from collections import Counter
from typing import Any

from jsonschema import Draft202012Validator

from keel.tool_set import ToolSet
from keel.tools import Tools
from tools_server.surface import SPECS

CHECKED: Counter[str] = Counter()        # results checked per tool, this process


def closed(schema: Any) -> Any:
    """A copy of `schema` in which every object that lists properties allows no other key."""
    out = copy.deepcopy(schema)
    stack = [out]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node:
                node["additionalProperties"] = False
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return out


VALIDATORS = {spec.name: Draft202012Validator(closed(spec.output_schema)) for spec in SPECS}


def check_result(tool: str, result: Any) -> None:
    """AssertionError naming each place where `result` leaves the declared outputSchema of `tool`."""
    errors = sorted(VALIDATORS[tool].iter_errors(result), key=lambda e: list(e.absolute_path))
    assert not errors, f"{tool} result outside its outputSchema: " + "; ".join(
        f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in errors)
    CHECKED[tool] += 1


def install() -> list[tuple[type, str, Any]]:
    """Wrap the tool methods of Tools and ToolSet; returns what to put back."""
    saved = []
    for cls in (Tools, ToolSet):
        for name in VALIDATORS:
            original = getattr(cls, name)
            saved.append((cls, name, original))
            setattr(cls, name, _checking(name, original))
    return saved


def uninstall(saved: list[tuple[type, str, Any]]) -> None:
    for cls, name, original in saved:
        setattr(cls, name, original)


def _checking(name: str, method: Any) -> Any:
    @functools.wraps(method)
    def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = method(self, *args, **kwargs)
        check_result(name, result)
        return result
    return checked
