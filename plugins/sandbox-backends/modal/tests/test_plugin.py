"""The entry module: what it registers (the sandbox backend and the trainer launcher), its
configs, and that it does not import modal."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

import pytest
from pydantic import ValidationError
from rllm_core.plugins import Kind, PluginManager
from rllm_core.plugins.catalog import known_provider
from rllm_sandbox_backend_modal import plugin

DISTRIBUTION = "rllm-sandbox-backend-modal"


def test_manager_collects_the_backend():
    manager = PluginManager(load_entry_points=False)
    manager.register(plugin, name="modal", distribution=DISTRIBUTION)
    assert manager.names(Kind.SANDBOX_BACKEND) == ["modal"]
    spec = manager.get("sandbox_backend", "modal")
    assert spec.factory_path == "rllm_sandbox_backend_modal.backend:ModalBackend"
    assert known_provider(spec.kind, spec.name) == DISTRIBUTION
    assert manager.names(Kind.TRAINER_LAUNCHER) == ["modal"]
    launcher = manager.get("trainer_launcher", "modal")
    assert launcher.factory_path == (
        "rllm_sandbox_backend_modal.launcher:ModalTrainerLauncher.from_config"
    )
    assert launcher.trait("run_keys") == ("store",)
    assert known_provider(launcher.kind, launcher.name) == DISTRIBUTION


def test_rllm_core_plugins_lists_the_backend_and_the_launcher():
    from click.testing import CliRunner
    from rllm_core.cli import main

    result = CliRunner().invoke(main, ["plugins", "--json"])
    assert result.exit_code == 0, result.output
    (row,) = [row for row in json.loads(result.output) if row["distribution"] == DISTRIBUTION]
    assert row["provides"] == ["sandbox_backend:modal", "trainer_launcher:modal"]
    assert row["status"] == "active"


def test_building_the_spec_gives_a_backend_with_the_config(fake_modal):
    manager = PluginManager(load_entry_points=False)
    manager.register(plugin, name="modal", distribution=DISTRIBUTION)
    backend = manager.get("sandbox_backend", "modal").build({"app_name": "a", "run_id": "r1"})
    assert type(backend).__name__ == "ModalBackend"
    assert (backend.config.app_name, backend.run_id) == ("a", "r1")


def test_entry_point_names_the_plugin_module():
    (entry_point,) = [
        ep for ep in importlib.metadata.entry_points(group="rllm_core") if ep.name == "modal"
    ]
    assert entry_point.value == "rllm_sandbox_backend_modal.plugin"
    assert entry_point.dist is not None and entry_point.dist.name == DISTRIBUTION


def test_config_defaults_and_validation():
    config = plugin.ModalConfig()
    assert (config.app_name, config.retries, config.create_interval_s) == (
        "rllm-sandboxes",
        3,
        0.2,
    )
    assert config.output_limit_bytes == 1 << 20
    for name, field in plugin.ModalConfig.model_fields.items():
        assert field.description, f"ModalConfig.{name} has no description"
    for values in (
        {"retries": -1},
        {"create_interval_s": -0.1},
        {"output_limit_bytes": 0},
        {"run_id": "has space"},
        {"app_name": ""},
        {"token": "x"},
    ):
        with pytest.raises(ValidationError):
            plugin.ModalConfig(**values)


def test_launcher_config_defaults_and_validation():
    config = plugin.ModalLauncherConfig(image="ghcr.io/example/rllm:1")
    assert (config.app_name, config.gpu, config.timeout_s) == ("rllm-trainers", None, 24 * 3600)
    assert config.store is None and "store" not in config.model_dump()
    for name, field in plugin.ModalLauncherConfig.model_fields.items():
        assert field.description, f"ModalLauncherConfig.{name} has no description"
    for values in ({}, {"image": ""}, {"image": "i", "timeout_s": 0}, {"image": "i", "x": 1}):
        with pytest.raises(ValidationError):
            plugin.ModalLauncherConfig(**values)
    with pytest.raises(ValidationError, match="not a plan key"):
        plugin.ModalLauncherConfig(image="i", store="s3://bucket")


def test_entry_module_does_not_import_modal():
    code = (
        "import sys, rllm_sandbox_backend_modal.plugin as p\n"
        "list(p.rllm_sandbox_backends()); list(p.rllm_trainer_launchers())\n"
        "print(sorted(m for m in ('modal', 'grpclib', 'synchronicity') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"
