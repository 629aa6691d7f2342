"""The entry module: what it registers and building from plan keys."""

from __future__ import annotations

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


def test_builds_from_plan_keys(manager, tmp_path):
    store = manager.get("object_store", "file").build({"root": str(tmp_path / "o")})
    assert isinstance(store, FileObjectStore)
    assert store.root == tmp_path / "o"


@pytest.mark.parametrize("values", [{"root": "o", "path": "p"}, {}])
def test_bad_plan_keys_are_rejected(manager, values):
    with pytest.raises(pydantic.ValidationError):
        manager.get("object_store", "file").validate_config(values)
