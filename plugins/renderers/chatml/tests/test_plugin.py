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
from rllm_renderer_chatml import plugin

DISTRIBUTION = "rllm-renderer-chatml"


def test_manager_collects_the_renderer(qwen25_tokenizer_dir):
    manager = PluginManager(load_entry_points=False)
    manager.register(plugin, name="chatml", distribution=DISTRIBUTION)
    assert manager.names(Kind.RENDERER) == ["chatml", "qwen3"]
    spec = manager.get(Kind.RENDERER, "chatml")
    assert known_provider(spec.kind, spec.name) == DISTRIBUTION
    renderer = spec.build({"tokenizer": str(qwen25_tokenizer_dir), "template": "qwen2.5"})
    assert isinstance(renderer, Renderer)
    assert renderer.decode(renderer.encode("ok")) == "ok"


def test_entry_point_names_the_plugin_module():
    (entry_point,) = [
        ep for ep in importlib.metadata.entry_points(group="rllm_core") if ep.name == "chatml"
    ]
    assert entry_point.value == "rllm_renderer_chatml.plugin"
    assert entry_point.dist is not None and entry_point.dist.name == DISTRIBUTION


def test_config():
    config = plugin.ChatMLConfig(tokenizer="/models/tok")
    assert (config.template, config.default_system) == ("auto", None)
    for name, field in plugin.ChatMLConfig.model_fields.items():
        assert field.description, f"{name} has no description"
    for values in ({}, {"tokenizer": "x", "template": "llama"}, {"tokenizer": "x", "extra": 1}):
        with pytest.raises(ValidationError):
            plugin.ChatMLConfig(**values)


def test_entry_module_does_not_import_the_tokenizers_library():
    code = (
        "import sys, rllm_renderer_chatml.plugin as p\n"
        "list(p.rllm_renderers())\n"
        "print(sorted(m for m in ('tokenizers', 'transformers') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"


def test_tool_call_format_must_be_a_known_format():
    for config in (plugin.ChatMLConfig, plugin.Qwen3Config):
        assert config(tokenizer="x").tool_call_format == "hermes"
        with pytest.raises(
            ValidationError, match=r"tool_call_format\n.*unknown tool_call_format 'nope'.*hermes"
        ):
            config(tokenizer="x", tool_call_format="nope")
