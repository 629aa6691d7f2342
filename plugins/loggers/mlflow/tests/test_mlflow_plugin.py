"""The entry module: what it registers, what it imports, and building from plan keys."""

from __future__ import annotations

import pydantic
import pytest
from rllm_core.plugins import PluginManager
from rllm_core.testing.packages import installed_component_keys, modules_imported_by
from rllm_logger_mlflow import plugin
from rllm_logger_mlflow.logger import MlflowLogger


@pytest.fixture
def manager():
    pm = PluginManager(load_entry_points=False, strict=True)
    pm.register(plugin, name="mlflow", distribution="rllm-logger-mlflow")
    return pm


def test_entry_module_imports_no_implementation():
    loaded = modules_imported_by(
        "rllm_logger_mlflow.plugin",
        ("mlflow", "sqlalchemy", "numpy", "torch", "rllm_logger_mlflow"),
    )
    assert loaded == ["rllm_logger_mlflow", "rllm_logger_mlflow.plugin"]


def test_installed_entry_point_provides_the_logger():
    assert installed_component_keys("rllm-logger-mlflow") == {"logger:mlflow"}


def test_builds_from_plan_keys(manager, tmp_path, read_store):
    logger = manager.get("logger", "mlflow").build({"path": str(tmp_path / "ml"), "run_name": "r"})
    try:
        assert isinstance(logger, MlflowLogger)
        logger.log_metrics(1, {"reward/mean": 0.5})
    finally:
        logger.close()
    history = read_store(tmp_path / "ml").get_metric_history(logger.run_id, "reward/mean")
    assert [(m.step, m.value) for m in history] == [(1, 0.5)]


def test_plan_keys_are_checked(manager):
    spec = manager.get("logger", "mlflow")
    assert spec.validate_config({"path": "ml"}).experiment == "Default"
    assert spec.config.model_fields["path"].is_required()  # so a run fills <run>/logs/mlflow
    with pytest.raises(pydantic.ValidationError, match="path"):
        spec.validate_config({})
    with pytest.raises(pydantic.ValidationError, match="experiment_name"):
        spec.validate_config({"path": "ml", "experiment_name": "x"})
