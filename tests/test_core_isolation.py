"""The core never imports a plugin, and works with every plugin disabled.

Two halves: a static check over the AST of every module in ``core/src/rllm_core`` (no import of
a plugin package anywhere, no torch or numpy at import time outside the modules allowed to need
them, no plugin SDK at import time at all), and a run of the installed core in a subprocess with
``RLLM_CORE_DISABLE_PLUGINS`` naming every installed plugin distribution.

That the core also installs and runs in an environment with no plugin at all is checked by
``scripts/check_core_alone.sh``, which builds a throwaway virtual environment.
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

CORE_SRC = Path(__file__).resolve().parent.parent / "core" / "src"

# Modules that implement training math may import torch (and numpy) when they are imported;
# nothing else in the core may, so that `import rllm_core.cli` stays fast and torch-free.
TORCH_ALLOWED = ("rllm_core/algorithms/", "rllm_core/testing/suites/")
TORCH_LIKE = frozenset({"torch", "numpy"})
# Dependencies of plugins only: the core must never import them when a module loads.
PLUGIN_SDKS = frozenset({"transformers", "modal", "daytona", "daytona_sdk", "tinker", "fireworks"})
HEAVY = TORCH_LIKE | PLUGIN_SDKS


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported_names(node: ast.AST) -> list[str]:
    """The absolute module names an import statement or a literal dynamic import names."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        return [node.module] if node.level == 0 and node.module else []
    if isinstance(node, ast.Call) and node.args:
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        first = node.args[0]
        if called in {"import_module", "__import__"} and isinstance(first, ast.Constant):
            return [first.value] if isinstance(first.value, str) else []
    return []


def iter_imports(tree: ast.AST) -> Iterator[tuple[str, int, bool]]:
    """Yield ``(module, line, at_import_time)`` for every import in ``tree``.

    ``at_import_time`` is false inside function bodies and under ``if TYPE_CHECKING:``, the two
    places whose imports do not run when the module is imported; class bodies do run.
    """

    def visit(node: ast.AST, live: bool) -> Iterator[tuple[str, int, bool]]:
        for name in _imported_names(node):
            yield name, getattr(node, "lineno", 0), live
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            for child in ast.iter_child_nodes(node):
                yield from visit(child, False)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from visit(child, False)
            for child in node.orelse:
                yield from visit(child, live)
        else:
            for child in ast.iter_child_nodes(node):
                yield from visit(child, live)

    yield from visit(tree, True)


def find_violations(source: str, relpath: str, plugin_packages: Iterable[str]) -> list[str]:
    """Every import in ``source`` (the module at ``relpath`` under ``core/src``) that breaks
    the isolation rules, as ``"relpath:line: message"``."""
    plugins = set(plugin_packages)
    torch_ok = relpath.startswith(TORCH_ALLOWED)
    problems = []
    for name, line, live in iter_imports(ast.parse(source, filename=relpath)):
        top = name.split(".")[0]
        where = f"{relpath}:{line}"
        if top in plugins or (top.startswith("rllm_") and top != "rllm_core"):
            problems.append(f"{where}: imports the plugin package {top}; the core never does")
        elif live and top in PLUGIN_SDKS:
            problems.append(f"{where}: imports {top} at import time; only plugins may use it")
        elif live and top in TORCH_LIKE and not torch_ok:
            problems.append(
                f"{where}: imports {top} at import time; import it inside the function that"
                f" needs it, or move the code under {' or '.join(TORCH_ALLOWED)}"
            )
    return problems


# ---------------------------------------------------------------- the checker itself


def test_checker_flags_exactly_the_imports_that_run_at_import_time():
    source = """
from __future__ import annotations
import os
from typing import TYPE_CHECKING
import torch.nn
try:
    import numpy as np
except ImportError:
    np = None
if TYPE_CHECKING:
    import torch
else:
    import transformers

class Model:
    import modal

def build():
    import torch
    import rllm_loss_ppo
    return importlib.import_module("rllm_trainer_backend_torch.model")

from rllm_core.plugins import lazy
from . import types
"""
    assert find_violations(source, "rllm_core/cli/main.py", {"rllm_loss_ppo"}) == [
        "rllm_core/cli/main.py:5: imports torch at import time; import it inside the function"
        " that needs it, or move the code under rllm_core/algorithms/ or"
        " rllm_core/testing/suites/",
        "rllm_core/cli/main.py:7: imports numpy at import time; import it inside the function"
        " that needs it, or move the code under rllm_core/algorithms/ or"
        " rllm_core/testing/suites/",
        "rllm_core/cli/main.py:13: imports transformers at import time; only plugins may use it",
        "rllm_core/cli/main.py:16: imports modal at import time; only plugins may use it",
        "rllm_core/cli/main.py:20: imports the plugin package rllm_loss_ppo; the core never does",
        "rllm_core/cli/main.py:21: imports the plugin package rllm_trainer_backend_torch; the core"
        " never does",
    ]


def test_checker_allows_torch_in_the_allowed_modules_only():
    source = "import torch\nimport numpy\n"
    assert find_violations(source, "rllm_core/algorithms/merge.py", ()) == []
    assert find_violations(source, "rllm_core/testing/suites/losses.py", ()) == []
    assert len(find_violations(source, "rllm_core/testing/fixtures.py", ())) == 2


# ---------------------------------------------------------------- the core


def test_core_modules_import_no_plugin_and_no_heavy_module(first_party_plugins):
    plugin_packages = {
        f"rllm_{p.folder.parent.name}_{p.folder.name}".replace("-", "_")
        for p in first_party_plugins
    } | {module.split(".")[0] for p in first_party_plugins for module in p.entry_modules}
    files = sorted((CORE_SRC / "rllm_core").rglob("*.py"))
    assert files, f"no modules found under {CORE_SRC / 'rllm_core'}"
    problems = []
    for path in files:
        relpath = path.relative_to(CORE_SRC).as_posix()
        problems += find_violations(path.read_text(encoding="utf-8"), relpath, plugin_packages)
    assert problems == [], "\n".join(problems)


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_plugin_distributions() -> set[str]:
    """Every installed distribution that registers ``rllm_core`` entry points, plus any other
    ``rllm-*`` distribution except the core itself (normalized names)."""
    found = set()
    for dist in metadata.distributions():
        name = _normalize(dist.metadata["Name"] or "")
        registers = any(ep.group == "rllm_core" for ep in dist.entry_points)
        if registers or (name.startswith("rllm-") and name != "rllm-core"):
            found.add(name)
    return found


def _registering_distributions() -> set[str]:
    return {
        _normalize(ep.dist.metadata["Name"])
        for ep in metadata.entry_points(group="rllm_core")
        if ep.dist is not None
    }


def test_core_imports_with_every_plugin_disabled(run_python):
    disabled = ",".join(sorted(installed_plugin_distributions()))
    code = (
        "import json, sys\n"
        "import rllm_core, rllm_core.cli, rllm_core.ports, rllm_core.types\n"
        "tops = {name.split('.')[0] for name in sys.modules}\n"
        "print(json.dumps(sorted(t for t in tops if t.startswith('rllm_') and t != 'rllm_core')"
        " + sorted(tops & set(sys.argv[1].split(',')))))\n"
    )
    result = run_python(code, ",".join(sorted(HEAVY)), RLLM_CORE_DISABLE_PLUGINS=disabled)
    assert result.returncode == 0, f"the core does not import with plugins disabled:\n{result}"
    assert result.json() == [], (
        "importing rllm_core, rllm_core.cli, rllm_core.ports and rllm_core.types loaded plugin"
        f" or heavy modules: {result.json()}"
    )


def test_cli_lists_every_plugin_as_disabled(run_cli):
    disabled = sorted(installed_plugin_distributions())
    result = run_cli("plugins", "--json", RLLM_CORE_DISABLE_PLUGINS=",".join(disabled))
    assert result.returncode == 0, str(result)
    listing = result.json()
    assert isinstance(listing, list), f"expected a JSON list, got {listing!r}"
    statuses = {(_normalize(entry["distribution"]), entry["status"]) for entry in listing}
    assert statuses == {(name, "disabled") for name in _registering_distributions()}, str(result)
    assert all(entry["provides"] == [] for entry in listing), str(result)
