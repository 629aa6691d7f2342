"""The entry module: what it registers, its config, and that it imports light."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest
from pydantic import ValidationError
from rllm_core.plugins import Kind, PluginManager
from rllm_core.plugins.catalog import known_provider
from rllm_core.ports import Renderer
from rllm_renderer_qwen3 import plugin

DISTRIBUTION = "rllm-renderer-qwen3"


def test_manager_collects_the_renderer(qwen3_tokenizer_dir):
    manager = PluginManager(load_entry_points=False)
    manager.register(plugin, name="qwen3", distribution=DISTRIBUTION)
    assert manager.names(Kind.RENDERER) == ["qwen3"]
    spec = manager.get(Kind.RENDERER, "qwen3")
    assert known_provider(spec.kind, spec.name) == DISTRIBUTION
    renderer = spec.build({"tokenizer": str(qwen3_tokenizer_dir), "keep_reasoning": True})
    assert isinstance(renderer, Renderer)
    assert renderer.template.keep_reasoning and renderer.template.enable_thinking


def test_entry_point_names_the_plugin_module():
    (entry_point,) = [
        ep for ep in importlib.metadata.entry_points(group="rllm_core") if ep.name == "qwen3"
    ]
    assert entry_point.value == "rllm_renderer_qwen3.plugin"
    assert entry_point.dist is not None and entry_point.dist.name == DISTRIBUTION


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


def test_entry_module_imports_nothing_heavy():
    code = (
        "import sys, rllm_renderer_qwen3.plugin as p\n"
        "list(p.rllm_renderers())\n"
        "print(sorted(m for m in ('tokenizers', 'rllm_renderer_chatml') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"
