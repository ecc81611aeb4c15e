"""The layering rules, read from the code (ast), so a change that breaks them fails here:

* `keel` (the domain-free core) never imports `workers` or `tools_server`, not even by a module name handed to
  importlib; the two upper packages never import each other;
* only `workers/` imports faust and only `tools_server/` the MCP SDK;
* no import error is caught (a missing dependency fails loudly, it never turns a feature off);
* no module of the three packages is longer than MAX_LINES.
"""
from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("keel", "workers", "tools_server")
MAX_LINES = 600
FORBIDDEN = {"keel": {"workers", "tools_server"}, "workers": {"tools_server"}, "tools_server": {"workers"}}
ONLY_IN = {"faust": "workers", "mcp": "tools_server"}


def modules() -> Iterator[tuple[str, Path, ast.Module]]:
    for package in PACKAGES:
        for file in sorted((ROOT / package).rglob("*.py")):
            yield package, file, ast.parse(file.read_text(), str(file))


def imported(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """(line, top-level name) of every absolute import, and of every string naming a module of ours that is
    handed to importlib or sits in the code as a dotted module path."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module.split(".")[0]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            head = node.value.split(".")[0].split(":")[0]
            if head in PACKAGES and (node.value.startswith(f"{head}.") or node.value == head):
                yield node.lineno, head


def test_imports_go_one_way() -> None:
    bad = [f"{file.relative_to(ROOT)}:{line}: {package} -> {name}"
           for package, file, tree in modules() for line, name in imported(tree)
           if name in FORBIDDEN[package]]
    assert bad == []


def test_faust_and_the_mcp_sdk_stay_in_their_layer() -> None:
    bad = [f"{file.relative_to(ROOT)}:{line}: {name}"
           for package, file, tree in modules() for line, name in imported(tree)
           if name in ONLY_IN and ONLY_IN[name] != package]
    assert bad == []


def test_no_import_error_is_swallowed() -> None:
    bad = []
    for _, file, tree in modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ExceptHandler) and node.type is not None:
                names = {n.id for n in ast.walk(node.type) if isinstance(n, ast.Name)}
                if names & {"ImportError", "ModuleNotFoundError"}:
                    bad.append(f"{file.relative_to(ROOT)}:{node.lineno}")
    assert bad == []


def test_modules_are_small() -> None:
    long = {str(file.relative_to(ROOT)): n for _, file, _ in modules()
            if (n := len(file.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_the_checks_see_a_violation(tmp_path: Path) -> None:
    """The import check is not vacuous: a planted upward import and an importlib string are found."""
    tree = ast.parse('import importlib\nfrom workers.cli import register\nimportlib.import_module("tools_server.cli")\n')
    assert [name for _, name in imported(tree) if name in FORBIDDEN["keel"]] == ["workers", "tools_server"]
