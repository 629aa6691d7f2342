"""The entry module: what it registers, what it imports, and building from plan keys."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pydantic
import pytest
from rllm_core.plugins import PluginManager
from rllm_core.ports import SandboxBackend
from rllm_sandbox_backend_local import plugin
from rllm_sandbox_backend_local.backend import LocalBackend


def test_entry_module_imports_no_implementation() -> None:
    code = (
        "import sys, rllm_sandbox_backend_local.plugin\n"
        "print(sorted(m for m in sys.modules if m.startswith('rllm_sandbox_backend_local')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert (
        result.stdout.strip()
        == "['rllm_sandbox_backend_local', 'rllm_sandbox_backend_local.plugin']"
    )


def test_installed_entry_point_provides_the_local_backend() -> None:
    pm = PluginManager(disabled=())
    keys = {
        key
        for record in pm.plugins()
        if record.distribution == "rllm-sandbox-backend-local"
        for key in record.components
    }
    assert keys == {"sandbox_backend:local"}


def test_builds_from_plan_keys(tmp_path: Path) -> None:
    pm = PluginManager(load_entry_points=False, strict=True)
    pm.register(plugin, name="local", distribution="rllm-sandbox-backend-local")
    backend = pm.get("sandbox_backend", "local").build(
        {"isolation": "none", "output_limit_bytes": 4096, "root_dir": str(tmp_path)}
    )
    assert isinstance(backend, LocalBackend)
    assert isinstance(backend, SandboxBackend)
    assert backend.config.output_limit_bytes == 4096
    assert backend.config.root_dir == tmp_path
    assert backend.isolation is None, "the isolation mode is decided at the first create"


@pytest.mark.parametrize(
    ("keys", "field"),
    [
        ({"isolation": "docker"}, "isolation"),
        ({"output_limit_bytes": 0}, "output_limit_bytes"),
        ({"extra_ro_binds": ["opt/tools"]}, "extra_ro_binds"),
        ({"extra_ro_binds": ["/"]}, "extra_ro_binds"),
        ({"network": "full"}, "network"),
    ],
)
def test_config_rejects_bad_keys(keys: dict[str, object], field: str) -> None:
    with pytest.raises(pydantic.ValidationError) as caught:
        plugin.LocalSandboxConfig.model_validate(keys)
    assert [e["loc"][0] for e in caught.value.errors()] == [field]
