"""The layering rules, read from the code (ast), so a change that breaks them fails here:

* `keel` (the domain-free core) never imports `workers`, `tools_server` or `inspector`, not even by a module name
  handed to importlib; the upper packages never import each other;
* only `workers/` imports faust, only `tools_server/` the MCP SDK and only `inspector/` Jinja2;
* no import error is caught (a missing dependency fails loudly, it never turns a feature off);
* no module of the four packages is longer than MAX_LINES;
* no import circle inside `keel/`: every import counts, at module level, inside a function (a lazy import) or
  under `if TYPE_CHECKING:` (a type named is a dependency too), relative imports resolved;
* `keel.cli`, the entry point, is the top floor: no other module of the four packages imports it; ingress
  (`keel/ingress/`) plugs into it like `workers` and `tools_server`, and the rest of `keel/` never imports it.
"""
from __future__ import annotations

import ast
import graphlib
import itertools
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("keel", "workers", "tools_server", "inspector")
MAX_LINES = 600
PLUGINS = {"workers", "tools_server", "inspector"}
FORBIDDEN = {"keel": PLUGINS, **{plugin: PLUGINS - {plugin} for plugin in PLUGINS}}
ONLY_IN = {"faust": "workers", "mcp": "tools_server", "jinja2": "inspector"}


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


# ---- import circles and floors inside keel/ ---------------------------------------------------------------

Graph = dict[str, dict[str, int]]       # module -> {module it imports: line of the first such import}


def module_files(root: Path, *packages: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the packages (`pkg/__init__.py` is `pkg`)."""
    out = {}
    for package in packages:
        for file in sorted((root / package).rglob("*.py")):
            parts = file.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return out


def import_graph(root: Path, *packages: str) -> Graph:
    """Who imports whom among the modules of the packages, from every import statement wherever it stands.

    `from .a import b` is an import of module `a.b` when that is a module, else of `a` (the module that defines
    `b`); a package's `__init__` that Python runs on the way is not counted, so `from .store.writes import X`
    ties a module to `store.writes` alone."""
    files = module_files(root, *packages)
    graph: Graph = {name: {} for name in files}
    for name, file in files.items():
        package_of = name.split(".") if file.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(package_of[:len(package_of) - node.level + 1] + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            else:
                continue
            for target in targets:
                if target in files and target != name:
                    graph[name].setdefault(target, node.lineno)
    return graph


def circles(graph: Graph) -> list[list[str]]:
    """Import circles, each as [a, b, …, a] where each module imports the next: one is found (graphlib's
    topological sort), one of its imports set aside, and the search goes on until the graph sorts."""
    edges = {name: dict(targets) for name, targets in graph.items()}
    found = []
    while True:
        try:
            graphlib.TopologicalSorter({name: set(t) for name, t in edges.items()}).prepare()
        except graphlib.CycleError as e:
            cycle = list(reversed(e.args[1]))       # graphlib lists each node before the nodes that import it
            found.append(cycle)
            del edges[cycle[0]][cycle[1]]
        else:
            return found


def spelled(cycle: list[str], graph: Graph, files: dict[str, Path], root: Path) -> str:
    """`a (a.py:line) -> b (b.py:line) -> a`: each module with the line of its import of the next."""
    steps = [f"{a} ({files[a].relative_to(root)}:{graph[a][b]})" for a, b in itertools.pairwise(cycle)]
    return " -> ".join(steps + [cycle[-1]])


def test_no_import_circle_in_the_core() -> None:
    graph = import_graph(ROOT, "keel")
    files = module_files(ROOT, "keel")
    assert [spelled(c, graph, files, ROOT) for c in circles(graph)] == []


def top_floor_breaches(root: Path, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """Imports of `keel.cli` by another module, and of the ingress plug-in by the rest of the core."""
    graph = import_graph(root, *packages)
    files = module_files(root, *packages)
    return [f"{files[name].relative_to(root)}:{line}: {name} -> {target}"
            for name, targets in graph.items() for target, line in targets.items()
            if (target == "keel.cli" and name != "keel.cli")
            or (target.startswith("keel.ingress") and not name.startswith(("keel.ingress", "workers", "tools_server")))]


def test_the_entry_point_is_the_top_floor() -> None:
    """Only `keel.cli` itself imports `keel.cli`; the rest of the core never imports the ingress plug-in."""
    assert top_floor_breaches(ROOT) == []


def test_the_top_floor_check_sees_a_breach(tmp_path: Path) -> None:
    """Not vacuous: a lazy import of keel.cli from a plug-in and the core importing ingress are found."""
    (tmp_path / "keel" / "ingress").mkdir(parents=True)
    (tmp_path / "keel" / "__init__.py").write_text("")
    (tmp_path / "keel" / "cli.py").write_text("from .ingress import cli\n")
    (tmp_path / "keel" / "tools.py").write_text("def f():\n    from .ingress.cli import register\n")
    (tmp_path / "keel" / "ingress" / "__init__.py").write_text("")
    (tmp_path / "keel" / "ingress" / "cli.py").write_text("if __name__ == '__main__':\n    from keel.cli import main\n")
    assert sorted(top_floor_breaches(tmp_path, ("keel",))) == [
        "keel/cli.py:1: keel.cli -> keel.ingress.cli",
        "keel/ingress/cli.py:2: keel.ingress.cli -> keel.cli",
        "keel/tools.py:2: keel.tools -> keel.ingress.cli"]


def test_the_circle_check_sees_a_lazy_circle(tmp_path: Path) -> None:
    """Not vacuous: a circle closed by a function-level relative import, and one closed under TYPE_CHECKING,
    are found and named with their files and lines."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub.b import f\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from ..a import g\n    return g\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import d\n")
    (pkg / "d.py").write_text("import pkg.c\n")
    graph = import_graph(tmp_path, "pkg")
    found = circles(graph)
    assert sorted(sorted(set(c)) for c in found) == [["pkg.a", "pkg.sub.b"], ["pkg.c", "pkg.d"]]
    text = " | ".join(spelled(c, graph, module_files(tmp_path, "pkg"), tmp_path) for c in found)
    for step in ("pkg.a (pkg/a.py:1)", "pkg.sub.b (pkg/sub/b.py:2)", "pkg.c (pkg/c.py:3)", "pkg.d (pkg/d.py:1)"):
        assert step in text
