"""The entry module: what it registers, what it imports, and building from plan keys."""

from __future__ import annotations

import subprocess
import sys

import pydantic
import pytest
from rllm_core.plugins import PluginManager
from rllm_object_store_file import plugin
from rllm_object_store_file.objects import FileObjectStore


@pytest.fixture
def manager():
    pm = PluginManager(load_entry_points=False, strict=True)
    pm.register(plugin, name="file", distribution="rllm-object-store-file")
    return pm


def test_entry_module_imports_no_implementation():
    code = (
        "import sys, rllm_object_store_file.plugin\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('numpy', 'torch', 'rllm_object_store_file')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "['rllm_object_store_file', 'rllm_object_store_file.plugin']"


def test_installed_entry_point_provides_the_component():
    pm = PluginManager(disabled=())
    keys = {
        spec_key
        for record in pm.plugins()
        if record.distribution == "rllm-object-store-file"
        for spec_key in record.components
    }
    assert keys == {"object_store:file"}


def test_builds_from_plan_keys(manager, tmp_path):
    store = manager.get("object_store", "file").build({"root": str(tmp_path / "o")})
    assert isinstance(store, FileObjectStore)
    assert store.root == tmp_path / "o"


@pytest.mark.parametrize("values", [{"root": "o", "path": "p"}, {}])
def test_bad_plan_keys_are_rejected(manager, values):
    with pytest.raises(pydantic.ValidationError):
        manager.get("object_store", "file").validate_config(values)
