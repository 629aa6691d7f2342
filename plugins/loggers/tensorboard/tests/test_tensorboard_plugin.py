"""The entry module: what it registers, what it imports, and building from plan keys."""

from __future__ import annotations

import pydantic
import pytest
from rllm_core.plugins import PluginManager
from rllm_core.testing.packages import installed_component_keys, modules_imported_by
from rllm_logger_tensorboard import plugin
from rllm_logger_tensorboard.logger import TensorboardLogger


@pytest.fixture
def manager():
    pm = PluginManager(load_entry_points=False, strict=True)
    pm.register(plugin, name="tensorboard", distribution="rllm-logger-tensorboard")
    return pm


def test_entry_module_imports_no_implementation():
    loaded = modules_imported_by(
        "rllm_logger_tensorboard.plugin",
        ("tensorboard", "numpy", "torch", "rllm_logger_tensorboard"),
    )
    assert loaded == ["rllm_logger_tensorboard", "rllm_logger_tensorboard.plugin"]


def test_installed_entry_point_provides_the_logger():
    assert installed_component_keys("rllm-logger-tensorboard") == {"logger:tensorboard"}


def test_builds_from_plan_keys(manager, tmp_path):
    logger = manager.get("logger", "tensorboard").build({"path": str(tmp_path / "tb")})
    try:
        assert isinstance(logger, TensorboardLogger)
        assert logger.path == tmp_path / "tb"
        assert len(list((tmp_path / "tb").glob("events.out.tfevents.*"))) == 1
    finally:
        logger.close()


def test_plan_keys_are_checked(manager):
    spec = manager.get("logger", "tensorboard")
    with pytest.raises(pydantic.ValidationError, match="path"):
        spec.validate_config({})
    with pytest.raises(pydantic.ValidationError, match="flush"):
        spec.validate_config({"path": "tb", "flush": True})
