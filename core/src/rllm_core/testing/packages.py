"""Checks of a plugin package as it is installed: which modules its entry module imports, and
which components its entry point registers.

A plugin's entry module is imported whenever rllm-core loads plugins, so it should import no
heavy library; test it with :func:`modules_imported_by` in a fresh interpreter::

    def test_entry_module_imports_no_implementation():
        loaded = modules_imported_by("my_plugin.plugin", ("torch", "numpy", "my_plugin"))
        assert loaded == ["my_plugin", "my_plugin.plugin"]
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable

from rllm_core.plugins import PluginManager

__all__ = ["installed_component_keys", "modules_imported_by"]


def modules_imported_by(module: str, roots: Iterable[str]) -> list[str]:
    """Sorted names of the loaded modules whose top-level package is one of ``roots``, after a
    fresh interpreter imports ``module``."""
    code = (
        f"import json, sys, {module}\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {tuple(roots)!r})))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    return json.loads(result.stdout)


def installed_component_keys(distribution: str) -> set[str]:
    """The component keys (``"logger:mlflow"``) that the installed ``distribution`` registers
    through its entry points, no plugin disabled."""
    manager = PluginManager(disabled=())
    return {
        key
        for record in manager.plugins()
        if record.distribution == distribution
        for key in record.components
    }
