"""No two modules of the package import each other in a circle, counting the imports inside
functions (a lazy import hides a circle from Python, not from the design) but not those under
``if TYPE_CHECKING:``."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import rllm_trainer_backend_torch

PACKAGE = rllm_trainer_backend_torch.__name__
ROOT = Path(rllm_trainer_backend_torch.__file__).parent


def _imported(tree: ast.AST, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``tree`` imports, at any depth."""
    found: set[str] = set()
    skipped = {
        id(child)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for statement in node.body
        for child in ast.walk(statement)
    }
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found |= {name for name in names if name in modules}
    return found


def import_graph(sources: Mapping[str, str]) -> dict[str, set[str]]:
    """Each module of ``sources`` (module name to source text) and the others it imports."""
    modules = set(sources)
    return {
        module: _imported(ast.parse(source), modules) - {module}
        for module, source in sources.items()
    }


def a_circle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (its modules in order, the first repeated), or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        path.append(module)
        for imported in sorted(graph[module]):
            if imported in path:
                return [*path[path.index(imported) :], imported]
            if imported not in done and (circle := visit(imported)):
                return circle
        path.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        if module not in done and (circle := visit(module)):
            return circle
    return None


def _package_sources() -> dict[str, str]:
    sources = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        sources[".".join([PACKAGE, *parts])] = path.read_text(encoding="utf-8")
    return sources


def test_no_modules_of_the_package_import_each_other_in_a_circle() -> None:
    graph = import_graph(_package_sources())
    assert f"{PACKAGE}.checkpoint" in graph
    circle = a_circle(graph)
    assert circle is None, "an import circle: " + " -> ".join(circle or [])


def test_the_check_finds_a_circle_through_a_lazy_import_but_not_a_type_only_one() -> None:
    circular = {
        "pkg.a": "from pkg.b import helper\n",
        "pkg.b": "def helper():\n    from pkg import a\n    return a\n",
        "pkg.c": "import pkg.a\n",
    }
    assert a_circle(import_graph(circular)) == ["pkg.a", "pkg.b", "pkg.a"]
    type_only = {
        "pkg.a": "from pkg.b import helper\n",
        "pkg.b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n",
    }
    assert a_circle(import_graph(type_only)) is None
