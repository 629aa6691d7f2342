"""Qwen3 template rules checked on the rendered text, and reading think blocks back."""

from __future__ import annotations

import pytest
from rllm_core.types import Message, ToolCall
from rllm_renderer_chatml.plugin import Qwen3Config
from rllm_renderer_chatml.qwen3 import Qwen3Renderer


def _m(role: str, content: str = "", **kw) -> Message:
    return Message(role=role, content=content, **kw)


def _text(renderer: Qwen3Renderer, messages, generation=False) -> str:
    return renderer.decode(renderer.render(messages, add_generation_prompt=generation).token_ids)


@pytest.fixture(scope="module")
def strip(qwen3_tokenizer_dir) -> Qwen3Renderer:
    return Qwen3Renderer.from_config(Qwen3Config(tokenizer=str(qwen3_tokenizer_dir)))


@pytest.fixture(scope="module")
def keep(qwen3_tokenizer_dir) -> Qwen3Renderer:
    config = Qwen3Config(tokenizer=str(qwen3_tokenizer_dir), keep_reasoning=True)
    return Qwen3Renderer.from_config(config)


def test_reasoning_shows_only_after_the_last_query(strip, keep):
    messages = [
        _m("user", "a"),
        _m("assistant", "A", reasoning="ra"),
        _m("user", "b"),
        _m("assistant", "B", reasoning="rb"),
        _m("tool", "T", tool_call_id="x"),
        _m("assistant", "C"),
    ]
    a = "<|im_start|>user\na<|im_end|>\n"
    b = "<|im_start|>user\nb<|im_end|>\n"
    tool = "<|im_start|>user\n<tool_response>\nT\n</tool_response><|im_end|>\n"
    assert _text(strip, messages) == (
        a
        + "<|im_start|>assistant\nA<|im_end|>\n"
        + b
        + "<|im_start|>assistant\n<think>\nrb\n</think>\n\nB<|im_end|>\n"
        + tool
        + "<|im_start|>assistant\n<think>\n\n</think>\n\nC<|im_end|>\n"
    )
    assert _text(keep, messages) == (
        a
        + "<|im_start|>assistant\n<think>\nra\n</think>\n\nA<|im_end|>\n"
        + b
        + "<|im_start|>assistant\n<think>\nrb\n</think>\n\nB<|im_end|>\n"
        + tool
        + "<|im_start|>assistant\n<think>\n\n</think>\n\nC<|im_end|>\n"
    )


def test_no_default_system_and_tools_after_the_system_text(strip):
    assert _text(strip, [_m("user", "hi")], True) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    from rllm_core.types import ToolSpec

    r = strip.render([_m("system", "S"), _m("user", "hi")], [ToolSpec(name="f")])
    text = strip.decode(r.token_ids)
    assert text.startswith("<|im_start|>system\nS\n\n# Tools\n\n")
    assert (
        '{"type": "function", "function": {"name": "f", "description": "", "parameters": {}}}'
        in text
    )
    assert r.message_indices[0] == 0


def test_think_tokens_and_sampled_mask(strip, qwen3_tokenizer_dir):
    r = strip.render([_m("user", "q"), _m("assistant", "ok", reasoning="r")])
    sampled = [t for t, s in zip(r.token_ids, r.sampled_mask, strict=True) if s]
    # <think> \n r \n </think> \n\n ok <|im_end|>
    assert sampled == [151667, 198, 81, 198, 151668, 271, 562, 151645]
    off = Qwen3Renderer.from_config(
        Qwen3Config(tokenizer=str(qwen3_tokenizer_dir), enable_thinking=False)
    )
    r = off.render([_m("user", "q"), _m("assistant", "ok")])
    sampled = [t for t, s in zip(r.token_ids, r.sampled_mask, strict=True) if s]
    assert sampled == [562, 151645], "the empty think block after the prompt is not sampled"
    assert off.decode(off.render([_m("user", "q")], add_generation_prompt=True).token_ids).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )


def test_content_with_a_think_block_is_split_by_the_template(strip):
    messages = [
        _m("user", "q"),
        _m("assistant", "<think>\nhidden\n</think>\n\nshown"),
        _m("user", "z"),
    ]
    assert "hidden" not in _text(strip, messages)
    assert _text(strip, messages[:2]).endswith("<think>\nhidden\n</think>\n\nshown<|im_end|>\n")


def test_parse_response(strip, qwen3_tokenizer_dir):
    def parse(text: str, close=True):
        return strip.parse_response(strip.encode(text) + ([strip.im_end] if close else []))

    got = parse(
        "<think>\n\nplan\n\n</think>\n\nDo it.\n<tool_call>\n"
        '{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    )
    assert (got.reasoning, got.content, got.stopped) == ("plan", "Do it.", True)
    assert got.tool_calls[0].call == ToolCall(id="call_0", name="f", arguments='{"a": 1}')
    assert (parse("plain").reasoning, parse("plain").content) == (None, "plain")
    assert parse("<think>\n\n</think>\n\nhi").reasoning == ""
    cut = parse("<think>\nhalf a tho", close=False)
    assert (cut.reasoning, cut.content, cut.stopped) == ("half a tho", "", False)
    off = Qwen3Renderer.from_config(
        Qwen3Config(tokenizer=str(qwen3_tokenizer_dir), enable_thinking=False)
    )
    assert off.parse_response(off.encode("hi")).reasoning == ""
