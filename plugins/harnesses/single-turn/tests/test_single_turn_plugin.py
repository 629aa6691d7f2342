"""The entry module: what it registers, what it imports, and building from plan keys."""

from __future__ import annotations

import subprocess
import sys

import pydantic
import pytest
from rllm_core.plugins import PluginManager
from rllm_harness_single_turn import plugin
from rllm_harness_single_turn.harness import SingleTurnHarness


def test_entry_module_imports_neither_the_harness_nor_openai():
    code = (
        "import sys, rllm_harness_single_turn.plugin\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('openai', 'httpx', 'rllm_harness_single_turn')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == (
        "['rllm_harness_single_turn', 'rllm_harness_single_turn.plugin']"
    )


def test_installed_entry_point_provides_the_harness():
    pm = PluginManager(disabled=())
    [record] = [r for r in pm.plugins() if r.distribution == "rllm-harness-single-turn"]
    assert list(record.components) == ["harness:single-turn"]


def test_builds_from_plan_keys():
    pm = PluginManager(load_entry_points=False, strict=True)
    pm.register(plugin, name="single-turn", distribution="rllm-harness-single-turn")
    harness = pm.get("harness", "single-turn").build({"system_prompt": "hi", "max_tokens": 64})
    assert isinstance(harness, SingleTurnHarness)
    assert (harness.config.system_prompt, harness.config.max_tokens) == ("hi", 64)
    with pytest.raises(pydantic.ValidationError):
        pm.get("harness", "single-turn").validate_config({"max_token": 64})
