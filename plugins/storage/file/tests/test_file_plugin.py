"""The entry module: what it registers, what it imports, and building from plan keys."""

from __future__ import annotations

import subprocess
import sys

import pydantic
import pytest
from rllm_core.plugins import PluginManager
from rllm_storage_file import plugin
from rllm_storage_file.buffer import FileSampleBuffer
from rllm_storage_file.jsonl_logger import JsonlLogger
from rllm_storage_file.objects import FileObjectStore


@pytest.fixture
def manager():
    pm = PluginManager(load_entry_points=False, strict=True)
    pm.register(plugin, name="file", distribution="rllm-storage-file")
    return pm


def test_entry_module_imports_no_implementation():
    code = (
        "import sys, rllm_storage_file.plugin\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('numpy', 'torch', 'rllm_storage_file')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "['rllm_storage_file', 'rllm_storage_file.plugin']"


def test_installed_entry_point_provides_the_three_components():
    pm = PluginManager(disabled=())
    keys = {
        spec_key
        for record in pm.plugins()
        if record.distribution == "rllm-storage-file"
        for spec_key in record.components
    }
    assert keys == {"sample_buffer:file", "object_store:file", "logger:jsonl"}


def test_builds_each_component_from_plan_keys(manager, tmp_path):
    buffer = manager.get_sample_buffer("file").build({"path": str(tmp_path / "b"), "fsync": False})
    try:
        assert isinstance(buffer, FileSampleBuffer)
        assert (buffer.path, buffer.fsync) == (tmp_path / "b", False)
    finally:
        buffer.close()
    store = manager.get_object_store("file").build({"root": str(tmp_path / "o")})
    assert isinstance(store, FileObjectStore)
    assert store.root == tmp_path / "o"
    logger = manager.get_logger("jsonl").build({"path": str(tmp_path / "m.jsonl")})
    try:
        assert isinstance(logger, JsonlLogger)
    finally:
        logger.close()


def test_fsync_defaults_to_on(manager, tmp_path):
    config = manager.get_sample_buffer("file").validate_config({"path": str(tmp_path)})
    assert config.fsync is True


@pytest.mark.parametrize(
    ("getter", "values"),
    [
        ("get_sample_buffer", {"path": "b", "fsynk": False}),
        ("get_sample_buffer", {}),
        ("get_object_store", {"root": "o", "path": "p"}),
        ("get_logger", {}),
    ],
)
def test_bad_plan_keys_are_rejected(manager, getter, values):
    with pytest.raises(pydantic.ValidationError):
        getattr(manager, getter)("file" if getter != "get_logger" else "jsonl").validate_config(
            values
        )
