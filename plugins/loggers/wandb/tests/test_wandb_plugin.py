"""The entry module: what it registers, what it imports, and building from plan keys."""

from __future__ import annotations

from pathlib import Path

import pydantic
import pytest
from rllm_core.plugins import PluginManager
from rllm_core.testing.packages import installed_component_keys, modules_imported_by
from rllm_logger_wandb import plugin
from rllm_logger_wandb.logger import WandbLogger


@pytest.fixture
def manager():
    pm = PluginManager(load_entry_points=False, strict=True)
    pm.register(plugin, name="wandb", distribution="rllm-logger-wandb")
    return pm


def test_entry_module_imports_no_implementation():
    loaded = modules_imported_by(
        "rllm_logger_wandb.plugin", ("wandb", "numpy", "torch", "rllm_logger_wandb")
    )
    assert loaded == ["rllm_logger_wandb", "rllm_logger_wandb.plugin"]


def test_installed_entry_point_provides_the_logger():
    assert installed_component_keys("rllm-logger-wandb") == {"logger:wandb"}


def test_builds_offline_from_plan_keys(manager, tmp_path, read_history):
    logger = manager.get("logger", "wandb").build({"path": str(tmp_path / "w"), "tags": ["x"]})
    try:
        assert isinstance(logger, WandbLogger)
        logger.log_metrics(1, {"loss": 0.5})
    finally:
        logger.close()
    assert read_history(tmp_path / "w") == {1: {"loss": 0.5}}


def test_plan_keys_are_checked(manager):
    spec = manager.get("logger", "wandb")
    config = spec.validate_config({"path": "runs/q/logs/wandb"})
    assert (config.mode, config.path) == ("offline", Path("runs/q/logs/wandb"))
    assert spec.config.model_fields["path"].is_required()  # so a run fills <run>/logs/wandb
    with pytest.raises(pydantic.ValidationError, match="path"):
        spec.validate_config({})
    with pytest.raises(pydantic.ValidationError, match="mode"):
        spec.validate_config({"path": "w", "mode": "shared"})
    with pytest.raises(pydantic.ValidationError, match="dir"):
        spec.validate_config({"path": "w", "dir": "w"})
    with pytest.raises(pydantic.ValidationError, match="api_key"):
        spec.validate_config({"path": "w", "api_key": "secret"})
