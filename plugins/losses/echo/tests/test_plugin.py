"""The entry module: what it registers, its config, and that it imports light."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest
from pydantic import ValidationError
from rllm_core.plugins import Kind, PluginManager
from rllm_core.plugins.catalog import known_provider
from rllm_loss_echo import plugin

DISTRIBUTION = "rllm-loss-echo"


def test_manager_collects_an_auxiliary_loss():
    manager = PluginManager(load_entry_points=False)
    manager.register(plugin, name="echo", distribution=DISTRIBUTION)
    assert manager.names(Kind.LOSS) == ["echo"]
    spec = manager.get("loss", "echo")
    assert spec.trait("role") == "auxiliary"
    assert known_provider(spec.kind, spec.name) == DISTRIBUTION


def test_entry_point_names_the_plugin_module():
    (entry_point,) = [
        ep for ep in importlib.metadata.entry_points(group="rllm_core") if ep.name == "echo"
    ]
    assert entry_point.value == "rllm_loss_echo.plugin"
    assert entry_point.dist is not None and entry_point.dist.name == DISTRIBUTION


def test_config():
    assert plugin.EchoConfig().coef == 0.05
    assert plugin.EchoConfig.model_fields["coef"].description
    for values in ({"coef": -0.1}, {"coef": float("inf")}, {"weight": 0.1}):
        with pytest.raises(ValidationError):
            plugin.EchoConfig(**values)


def test_entry_module_does_not_import_torch():
    code = (
        "import sys, rllm_loss_echo.plugin as p\n"
        "list(p.rllm_losses())\n"
        "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"
