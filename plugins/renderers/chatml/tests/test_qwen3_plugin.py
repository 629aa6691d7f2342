"""The ``qwen3`` renderer as the entry module registers it, and its config."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from rllm_core.plugins import Kind, PluginManager
from rllm_core.plugins.catalog import known_provider
from rllm_core.ports import Renderer
from rllm_renderer_chatml import plugin

DISTRIBUTION = "rllm-renderer-chatml"


def test_manager_collects_the_renderer(qwen3_tokenizer_dir):
    manager = PluginManager(load_entry_points=False)
    manager.register(plugin, name="chatml", distribution=DISTRIBUTION)
    assert manager.names(Kind.RENDERER) == ["chatml", "qwen3"]
    spec = manager.get(Kind.RENDERER, "qwen3")
    assert known_provider(spec.kind, spec.name) == DISTRIBUTION
    renderer = spec.build({"tokenizer": str(qwen3_tokenizer_dir), "keep_reasoning": True})
    assert isinstance(renderer, Renderer)
    assert renderer.template.keep_reasoning and renderer.template.enable_thinking


def test_config():
    config = plugin.Qwen3Config(tokenizer="/models/qwen3")
    assert (config.keep_reasoning, config.enable_thinking) == (False, True)
    for name, field in plugin.Qwen3Config.model_fields.items():
        assert field.description, f"{name} has no description"
    for values in (
        {},
        {"tokenizer": "x", "keep_reasoning": "sometimes"},
        {"tokenizer": "x", "x": 1},
    ):
        with pytest.raises(ValidationError):
            plugin.Qwen3Config(**values)
