"""The entry module: what it registers, what it imports, and building from plan keys."""

from __future__ import annotations

import subprocess
import sys

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


def test_entry_module_imports_no_implementation():
    code = (
        "import sys, rllm_logger_jsonl.plugin\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('numpy', 'torch', 'rllm_logger_jsonl')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "['rllm_logger_jsonl', 'rllm_logger_jsonl.plugin']"


def test_installed_entry_point_provides_the_component():
    pm = PluginManager(disabled=())
    keys = {
        spec_key
        for record in pm.plugins()
        if record.distribution == "rllm-logger-jsonl"
        for spec_key in record.components
    }
    assert keys == {"logger:jsonl"}


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
