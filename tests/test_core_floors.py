"""The core's floors (``docs/layout.md``): a module imports its own floor and the floors below
it, never one above; no floor imports the kit (``rllm_core.kit``, code plugins share) or the
test kit (``rllm_core.testing``); and no modules import each other in a circle. Imports under
``if TYPE_CHECKING:`` are references for the type checker, not dependencies, and are left out;
imports inside functions count.

Every top-level module and package of ``rllm_core`` must be placed on a floor below, so a new
one is placed on purpose.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

CORE = Path(__file__).resolve().parent.parent / "core" / "src" / "rllm_core"

FLOORS: dict[str, int] = {
    # 1: records, errors, storage, the model catalog and cache, constants
    "types": 1,
    "errors": 1,
    "storage": 1,
    "models": 1,
    "cache": 1,
    "sidevenvs": 1,
    "chat_dicts": 1,
    "logging_values": 1,
    "routing": 1,
    "docs_site": 1,
    "toml_text": 1,
    "addresses": 1,
    # 2: the contracts
    "ports": 2,
    # 3: the plan, the plugin manager, the algorithms; the package's own facade
    "plan": 3,
    "plugins": 3,
    "algorithms": 3,
    "numerics": 3,
    "__init__": 3,
    # 4: rollouts and the gateway
    "rollout": 4,
    "gateway": 4,
    # 5: what every run shares: components, run folder, state, checkpoints, the lifecycle
    "run": 5,
    # 6: what runs a plan: the RL pipeline, SFT, evaluation, inspection of run folders
    "training": 6,
    "sft": 6,
    "evaluation": 6,
    "inspection": 6,
    # 7: the commands, and the documentation they generate
    "cli": 7,
    "view": 7,
    "reference": 7,
    "__main__": 7,
}
OFF_LIMITS = {"kit": "the kit (code plugins share)", "testing": "the test kit"}


def _top(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "rllm_core":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _module_of(path: Path) -> tuple[str, bool]:
    relative = path.relative_to(CORE.parent).with_suffix("")
    package = relative.name == "__init__"
    parts = relative.parts[:-1] if package else relative.parts
    return ".".join(parts), package


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, module)`` for every import of ``path`` outside ``if TYPE_CHECKING:``;
    ``from package import name`` names ``package.name`` when that is a module."""
    module, package = _module_of(path)
    yield from _imports_of(path.read_text(), module, package)


def _imports_of(source: str, module: str, package: bool) -> Iterator[tuple[int, str]]:
    def visit(node: ast.AST) -> Iterator[tuple[int, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                yield from (item for other in child.orelse for item in visit_one(other))
                continue
            yield from visit_one(child)

    def visit_one(child: ast.AST) -> Iterator[tuple[int, str]]:
        if isinstance(child, ast.Import):
            for alias in child.names:
                yield child.lineno, alias.name
        elif isinstance(child, ast.ImportFrom):
            base = child.module or ""
            if child.level:
                anchor = module.split(".")
                anchor = anchor if package else anchor[:-1]
                anchor = anchor[: len(anchor) - (child.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in child.names:
                named = f"{base}.{alias.name}"
                submodule = CORE.parent / Path(*named.split("."))
                is_module = submodule.with_suffix(".py").exists() or submodule.is_dir()
                yield child.lineno, named if is_module else base
        else:
            yield from visit(child)

    yield from visit(ast.parse(source))


def _core_files() -> Iterator[Path]:
    for path in sorted(CORE.rglob("*.py")):
        top = _top(_module_of(path)[0])
        if top not in OFF_LIMITS:
            yield path


def test_every_top_level_module_is_on_a_floor() -> None:
    tops = {p.stem if p.is_file() else p.name for p in CORE.iterdir() if p.suffix == ".py"}
    tops |= {p.name for p in CORE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    unplaced = sorted(tops - set(FLOORS) - set(OFF_LIMITS))
    assert not unplaced, (
        f"rllm_core modules on no floor: {unplaced}; place each in FLOORS here and in the"
        " diagram of docs/layout.md"
    )


def test_no_module_imports_a_floor_above_its_own_or_the_kits() -> None:
    wrong: list[str] = []
    for path in _core_files():
        module = _module_of(path)[0]
        own = FLOORS[_top(module) or "__init__"]
        for line, imported in _imports(path):
            top = _top(imported)
            if top is None:
                continue
            where = f"{path.relative_to(CORE.parent)}:{line} imports {imported}"
            if top in OFF_LIMITS:
                wrong.append(f"{where} ({OFF_LIMITS[top]})")
            elif FLOORS.get(top, 0) > own:
                wrong.append(f"{where} (floor {FLOORS[top]} above its own {own})")
    assert not wrong, "imports that break the core's floors:\n" + "\n".join(wrong)


def _graph() -> dict[str, set[str]]:
    """Each core module (outside the kits) and the core modules it imports."""
    paths = {_module_of(path)[0]: path for path in _core_files()}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        found = set()
        for _, imported in _imports(path):
            parts = imported.split(".")
            while parts and ".".join(parts) not in paths:
                parts.pop()
            if parts and ".".join(parts) != module:
                found.add(".".join(parts))
        graph[module] = found
    return graph


def _a_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (its modules in order, the first repeated), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for imported in sorted(graph[module]):
            if state.get(imported) == 1:
                return [*path[path.index(imported) :], imported]
            if imported not in state and (cycle := visit(imported)):
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_no_modules_import_each_other_in_a_circle() -> None:
    cycle = _a_cycle(_graph())
    assert cycle is None, "an import circle in the core: " + " -> ".join(cycle or [])


def test_the_circle_check_finds_one() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _a_cycle(graph) == ["a", "b", "c", "a"]
    assert _a_cycle({"a": {"b"}, "b": set()}) is None


def test_the_check_sees_an_upward_import_and_the_kit_but_not_a_type_only_one() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "from rllm_core.training import loop\n"
        "from ..kit.retry import RetrySettings\n"
        "def later():\n"
        "    import rllm_core.evaluation.runner\n"
        "if TYPE_CHECKING:\n"
        "    from rllm_core.cli import output\n"
    )
    names = [name for _, name in _imports_of(source, "rllm_core.rollout.probe", False)]
    assert names == [
        "typing",
        "rllm_core.training.loop",
        "rllm_core.kit.retry",
        "rllm_core.evaluation.runner",
    ]


def _signal_handler_calls(source: str) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "signal"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "signal"
    ]


def test_only_the_run_signals_module_installs_signal_handlers() -> None:
    """Every handler goes through ``rllm_core.run.signals`` (the lifecycle's stop signals and
    its ``handled`` block), so no loop can stop differently from the others."""
    found = [
        f"{path.relative_to(CORE.parent)}:{line}"
        for path in sorted(CORE.rglob("*.py"))
        if path != CORE / "run" / "signals.py"
        for line in _signal_handler_calls(path.read_text())
    ]
    assert found == [], "signal handlers installed outside rllm_core.run.signals: " + ", ".join(
        found
    )
    assert _signal_handler_calls("import signal\nsignal.signal(signal.SIGINT, print)\n") == [2]
