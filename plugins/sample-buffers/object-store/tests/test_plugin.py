"""The entry module: what it registers, building from plan keys with the run's store, and a run
that fills the buffer in from its ``[object_store]``."""

from __future__ import annotations

import pydantic
import pytest
from rllm_core.plugins import PluginManager
from rllm_core.storage.memory_objects import MemoryObjectStore
from rllm_core.testing.suites.storage import make_samples
from rllm_sample_buffer_object_store import plugin
from rllm_sample_buffer_object_store.buffer import ObjectStoreSampleBuffer


@pytest.fixture
def spec():
    pm = PluginManager(load_entry_points=False, strict=True)
    pm.register(plugin, name="object-store", distribution="rllm-sample-buffer-object-store")
    return pm.get("sample_buffer", "object-store")


def test_builds_in_the_store_the_run_gives_it(spec):
    store = MemoryObjectStore()
    buffer = spec.build({"store": store, "prefix": "runs/r/buffer", "writer": "s0"})
    assert isinstance(buffer, ObjectStoreSampleBuffer)
    buffer.append(make_samples(2))
    assert store.list("runs/r/buffer/index/") and buffer.writer == "s0"
    assert ObjectStoreSampleBuffer(store, "runs/r/buffer").pending() == 2


def test_the_run_keys_are_the_store_and_the_prefix(spec):
    assert spec.trait("run_keys") == ("store", "prefix")
    assert "store" not in spec.validate_config({"store": MemoryObjectStore()}).model_dump()


def test_without_a_store_building_says_to_add_an_object_store(spec):
    with pytest.raises(ValueError, match=r"add an \[object_store\] section"):
        spec.build({})


@pytest.mark.parametrize(
    "values",
    [{"store": "bucket"}, {"prefix": "/runs"}, {"missing_payload_timeout_s": -1}, {"x": 1}],
)
def test_bad_plan_keys_are_rejected(spec, values):
    with pytest.raises((pydantic.ValidationError, ValueError)):
        spec.build(values)
