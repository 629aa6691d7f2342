"""The entry module: what it registers, what it imports, and building from plan keys."""

from __future__ import annotations

import subprocess
import sys

import pydantic
import pytest
from rllm_core.plugins import PluginManager
from rllm_trace_store_deltachain import plugin
from rllm_trace_store_deltachain.memory import MemoryTraceStore
from rllm_trace_store_deltachain.store import DeltaChainTraceStore


@pytest.fixture
def manager():
    pm = PluginManager(load_entry_points=False, strict=True)
    pm.register(plugin, name="deltachain", distribution="rllm-trace-store-deltachain")
    return pm


def test_entry_module_imports_no_implementation():
    code = (
        "import sys, rllm_trace_store_deltachain.plugin\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('zstandard', 'rllm_trace_store_deltachain')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert (
        result.stdout.strip()
        == "['rllm_trace_store_deltachain', 'rllm_trace_store_deltachain.plugin']"
    )


def test_installed_entry_point_provides_the_two_trace_stores():
    pm = PluginManager(disabled=())
    keys = {
        spec_key
        for record in pm.plugins()
        if record.distribution == "rllm-trace-store-deltachain"
        for spec_key in record.components
    }
    assert keys == {"trace_store:deltachain", "trace_store:memory"}


def test_builds_both_stores_from_plan_keys(manager, tmp_path):
    store = manager.get("trace_store", "deltachain").build(
        {
            "path": str(tmp_path / "t"),
            "snapshot_every": 8,
            "segment_bytes": 1 << 20,
            "compression_level": 9,
            "fsync": True,
        }
    )
    try:
        assert isinstance(store, DeltaChainTraceStore)
        assert (store.path, store.snapshot_every, store.fsync) == (tmp_path / "t", 8, True)
        assert store._log.segment_bytes == 1 << 20
    finally:
        store.close()
    memory = manager.get("trace_store", "memory").build({})
    assert isinstance(memory, MemoryTraceStore)


def test_defaults(manager, tmp_path):
    config = manager.get("trace_store", "deltachain").validate_config({"path": str(tmp_path)})
    assert (config.snapshot_every, config.segment_bytes, config.compression_level) == (
        0,
        64 * 1024 * 1024,
        3,
    )
    assert config.fsync is False


@pytest.mark.parametrize(
    ("name", "values"),
    [
        ("deltachain", {}),
        ("deltachain", {"path": "t", "snapshots": 4}),
        ("deltachain", {"path": "t", "snapshot_every": -1}),
        ("deltachain", {"path": "t", "segment_bytes": 10}),
        ("deltachain", {"path": "t", "compression_level": 23}),
        ("memory", {"path": "t"}),
    ],
)
def test_bad_plan_keys_are_rejected(manager, name, values):
    with pytest.raises(pydantic.ValidationError):
        manager.get("trace_store", name).validate_config(values)
