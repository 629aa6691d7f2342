"""The entry module: what it registers and building from plan keys."""

from __future__ import annotations

import pydantic
import pytest
from rllm_core.plugins import PluginManager
from rllm_logger_jsonl import plugin
from rllm_logger_jsonl.logger import JsonlLogger


@pytest.fixture
def manager():
    pm = PluginManager(load_entry_points=False, strict=True)
    pm.register(plugin, name="jsonl", distribution="rllm-logger-jsonl")
    return pm


def test_builds_from_plan_keys(manager, tmp_path):
    logger = manager.get("logger", "jsonl").build({"path": str(tmp_path / "m.jsonl")})
    try:
        assert isinstance(logger, JsonlLogger)
    finally:
        logger.close()


@pytest.mark.parametrize("values", [{}, {"path": "m.jsonl", "flush": True}])
def test_bad_plan_keys_are_rejected(manager, values):
    with pytest.raises(pydantic.ValidationError):
        manager.get("logger", "jsonl").validate_config(values)
