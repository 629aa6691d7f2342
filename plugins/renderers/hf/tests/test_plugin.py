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
from rllm_renderer_hf import plugin

DISTRIBUTION = "rllm-renderer-hf"


def test_manager_collects_the_renderer(qwen25_tokenizer_dir):
    manager = PluginManager(load_entry_points=False)
    manager.register(plugin, name="hf", distribution=DISTRIBUTION)
    assert manager.names(Kind.RENDERER) == ["hf"]
    spec = manager.get(Kind.RENDERER, "hf")
    assert known_provider(spec.kind, spec.name) == DISTRIBUTION
    renderer = spec.build({"tokenizer": str(qwen25_tokenizer_dir)})
    assert isinstance(renderer, Renderer)


def test_entry_point_names_the_plugin_module():
    (entry_point,) = [
        ep for ep in importlib.metadata.entry_points(group="rllm_core") if ep.name == "hf"
    ]
    assert entry_point.value == "rllm_renderer_hf.plugin"
    assert entry_point.dist is not None and entry_point.dist.name == DISTRIBUTION


def test_config():
    config = plugin.HFConfig(tokenizer="/models/tok")
    assert (config.chat_template, config.template_kwargs, config.tool_arguments) == (
        None,
        {},
        "object",
    )
    assert (config.stop_tokens, config.history_size) == ([], 4096)
    for name, field in plugin.HFConfig.model_fields.items():
        assert field.description, f"{name} has no description"
    bad = (
        {},
        {"tokenizer": "x", "history_size": 0},
        {"tokenizer": "x", "tool_arguments": "dict"},
        {"tokenizer": "x", "extra": 1},
    )
    for values in bad:
        with pytest.raises(ValidationError):
            plugin.HFConfig(**values)


def test_entry_module_does_not_import_transformers():
    code = (
        "import sys, rllm_renderer_hf.plugin as p\n"
        "list(p.rllm_renderers())\n"
        "print(sorted(m for m in ('transformers', 'tokenizers', 'torch') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"


def test_tool_call_format_must_be_a_known_format():
    with pytest.raises(
        ValidationError, match=r"tool_call_format\n.*unknown tool_call_format 'qwen9'.*hermes"
    ):
        plugin.HFConfig(tokenizer="x", tool_call_format="qwen9")
    assert plugin.HFConfig(tokenizer="x", tool_call_format="gpt-oss").tool_call_format == "gpt-oss"


def test_the_tool_call_format_is_the_templates_unless_set(qwen25_tokenizer_dir):
    from rllm_core.ports.rendering import StreamsToolCalls
    from rllm_renderer_hf.renderer import HFRenderer

    detected = HFRenderer(plugin.HFConfig(tokenizer=str(qwen25_tokenizer_dir)))
    assert detected.tool_call_format.name == "hermes"
    assert isinstance(detected, StreamsToolCalls)
    text = 'Sure.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    parsed = detected.parse_response(detected.encode(text))
    assert [a.call.name for a in parsed.tool_calls if a.call] == ["f"]
    chosen = HFRenderer(
        plugin.HFConfig(tokenizer=str(qwen25_tokenizer_dir), tool_call_format="llama3-json")
    )
    assert chosen.tool_call_format.name == "llama3-json"
    plain = "I cannot call f."
    content, _, attempts = chosen.tool_call_format.split(plain)
    parsed = chosen.parse_response(chosen.encode(plain))
    assert (parsed.content, list(parsed.tool_calls)) == (content, attempts)


def test_a_template_whose_tool_calls_no_format_reads_needs_the_key(qwen25_tokenizer_dir):
    from rllm_renderer_hf.renderer import HFRenderer

    unknown = (
        "{% for m in messages %}{{ m.content }}{% for c in m.tool_calls or [] %}"
        "<<CALL {{ c.function.name }}>>{% endfor %}{% endfor %}"
    )
    config = plugin.HFConfig(tokenizer=str(qwen25_tokenizer_dir), chat_template=unknown)
    with pytest.raises(ValueError, match="renders tool calls in a format rllm-core does not"):
        HFRenderer(config)
    chosen = HFRenderer(config.model_copy(update={"tool_call_format": "mistral"}))
    assert chosen.tool_call_format.name == "mistral"
    no_tools = "{% for m in messages %}{{ m.content }}{% endfor %}"
    plain = HFRenderer(config.model_copy(update={"chat_template": no_tools}))
    assert plain.tool_call_format.name == "hermes"
