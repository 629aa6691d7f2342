"""The entry module: what it registers and building from plan keys."""

from __future__ import annotations

import json

import pydantic
import pytest
from rllm_core.plugins import PluginManager
from rllm_task_source_jsonl import plugin
from rllm_task_source_jsonl.source import JsonlTaskSource


@pytest.fixture
def manager():
    pm = PluginManager(load_entry_points=False, strict=True)
    pm.register(plugin, name="jsonl", distribution="rllm-task-source-jsonl")
    return pm


def test_builds_from_plan_keys(manager, tmp_path):
    path = tmp_path / "qa.jsonl"
    path.write_text(json.dumps({"question": "What is 2 + 2?", "answer": 4}) + "\n")
    source = manager.get("task_source", "jsonl").build({"path": str(path), "reward": "numeric"})
    assert isinstance(source, JsonlTaskSource)
    assert source.config.reward == "numeric"
    assert [t.data["answer"] for t in source.tasks("train")] == ["4"]


def test_unknown_reward_is_rejected_by_the_schema(manager, tmp_path):
    with pytest.raises(pydantic.ValidationError, match="'exact', 'numeric' or 'boxed'"):
        manager.get("task_source", "jsonl").build({"path": str(tmp_path), "reward": "fuzzy"})
