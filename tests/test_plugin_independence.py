"""No plugin imports another plugin: code that several plugins use lives in ``rllm_core.kit``.

A plugin's ``src/`` may import ``rllm_core``, its own package (and modules its tests name after
it) and third-party libraries. Its
``tests/`` may also import the plugins its ``test`` extra names (the torch backend's tests train
with a real loss), since those are what the tests install. Checked over the AST of every file,
function bodies included, so a lazy import counts too.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent

PLUGIN_MODULE = re.compile(r"^rllm_(?!core$)[a-z0-9_]+$")


def _import_name(distribution: str) -> str:
    return re.sub(r"[-.]+", "_", distribution.split("[")[0]).lower()


def _test_extra(package: Any) -> set[str]:
    with (package.folder / "pyproject.toml").open("rb") as handle:
        project = tomllib.load(handle)["project"]
    extra = project.get("optional-dependencies", {}).get("test", [])
    names = {re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._\[\]-]*)", r).group(1) for r in extra}
    return {_import_name(name) for name in names}


def _imports(path: Path) -> set[tuple[str, int]]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found |= {(alias.name.split(".")[0], node.lineno) for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add((node.module.split(".")[0], node.lineno))
    return found


def _foreign(package: Any, part: str, allowed: set[str], root: Path = REPO_ROOT) -> list[str]:
    own = _import_name(package.distribution)
    problems = []
    for path in sorted((package.folder / part).rglob("*.py")):
        for module, line in sorted(_imports(path)):
            if PLUGIN_MODULE.match(module) and not module.startswith(own) and module not in allowed:
                problems.append(f"{path.relative_to(root)}:{line} imports {module}")
    return problems


def test_plugin_sources_import_no_other_plugin(plugin_package):
    problems = _foreign(plugin_package, "src", set())
    assert problems == [], (
        "a plugin imports another plugin; move the shared code into rllm_core.kit:\n  "
        + "\n  ".join(problems)
    )


def test_plugin_tests_import_only_the_plugins_their_test_extra_names(plugin_package):
    problems = _foreign(plugin_package, "tests", _test_extra(plugin_package))
    assert problems == [], (
        "a plugin's tests import a plugin its `test` extra does not name; add it there:\n  "
        + "\n  ".join(problems)
    )


def test_the_check_finds_an_import_of_another_plugin(tmp_path):
    folder = tmp_path / "plugins" / "losses" / "mine"
    (folder / "src" / "rllm_loss_mine").mkdir(parents=True)
    (folder / "src" / "rllm_loss_mine" / "loss.py").write_text(
        "import json\nfrom rllm_core import hookimpl\n\ndef f():\n"
        "    from rllm_loss_ppo.plugin import PPOClipConfig\n    import rllm_loss_mine.x\n"
    )
    package = SimpleNamespace(folder=folder, distribution="rllm-loss-mine")
    found = [line.rsplit(" imports ", 1)[1] for line in _foreign(package, "src", set(), tmp_path)]
    assert found == ["rllm_loss_ppo"]
