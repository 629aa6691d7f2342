"""The entry module: what it registers and building from plan keys."""

from __future__ import annotations

import pydantic
import pytest
from rllm_core.plugins import PluginManager
from rllm_sample_buffer_file import plugin
from rllm_sample_buffer_file.buffer import FileSampleBuffer


@pytest.fixture
def manager():
    pm = PluginManager(load_entry_points=False, strict=True)
    pm.register(plugin, name="file", distribution="rllm-sample-buffer-file")
    return pm


def test_builds_from_plan_keys(manager, tmp_path):
    buffer = manager.get("sample_buffer", "file").build(
        {"path": str(tmp_path / "b"), "fsync": False}
    )
    try:
        assert isinstance(buffer, FileSampleBuffer)
        assert (buffer.path, buffer.fsync) == (tmp_path / "b", False)
    finally:
        buffer.close()


def test_fsync_defaults_to_on(manager, tmp_path):
    config = manager.get("sample_buffer", "file").validate_config({"path": str(tmp_path)})
    assert config.fsync is True


@pytest.mark.parametrize("values", [{"path": "b", "fsynk": False}, {}])
def test_bad_plan_keys_are_rejected(manager, values):
    with pytest.raises(pydantic.ValidationError):
        manager.get("sample_buffer", "file").validate_config(values)
