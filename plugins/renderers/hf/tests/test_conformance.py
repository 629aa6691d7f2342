"""The renderer conformance suite over three real chat templates."""

from __future__ import annotations

import pytest
from rllm_core.testing.conversations import (
    Qwen25Reference,
    SmolLM2Reference,
    conversations,
    corpus,
)
from rllm_core.testing.suites.renderers import (
    READ_FILE_TOOL,
    Conversation,
    ReferenceRender,
    RendererConformance,
    sampled_span,
)
from rllm_core.testing.tokenizers import reference_render
from rllm_core.types import Message, ToolCall
from rllm_renderer_hf.plugin import HFConfig
from rllm_renderer_hf.renderer import HFRenderer


class TestSmolLM2(SmolLM2Reference, RendererConformance):
    @pytest.fixture
    def renderer(self, smollm2_tokenizer_dir) -> HFRenderer:
        return HFRenderer(HFConfig(tokenizer=str(smollm2_tokenizer_dir)))


class TestQwen25(Qwen25Reference, RendererConformance):
    @pytest.fixture
    def renderer(self, qwen25_tokenizer_dir) -> HFRenderer:
        return HFRenderer(HFConfig(tokenizer=str(qwen25_tokenizer_dir)))

    def test_parse_response_keeps_malformed_tool_calls(self, renderer: HFRenderer) -> None:
        """Qwen2.5's template prints arguments with ``tojson``: arguments that are not JSON come
        out as a JSON string, so a malformed call renders as a well-formed call whose
        arguments are that text. (The chatml renderer writes such arguments verbatim.)"""
        good = ToolCall(id="call_1", name="read_file", arguments='{"path": "a.txt"}')
        bad = ToolCall(id="call_2", name="read_file", arguments='{"path": "b.txt"')
        messages = [
            Message(role="user", content="Read a.txt and b.txt."),
            Message(role="assistant", tool_calls=(good, bad)),
        ]
        span = sampled_span(renderer.render(messages, [READ_FILE_TOOL]), 1)
        assert renderer.decode(span).split("\n")[4] == (
            '{"name": "read_file", "arguments": "{\\"path\\": \\"b.txt\\""}'
        )
        first, second = renderer.parse_response(span).tool_calls
        assert (first.status, first.call.arguments) == ("ok", '{"path": "a.txt"}')
        assert (second.status, second.call.arguments) == ("ok", '{"path": "b.txt"')


class TestQwen3(RendererConformance):
    """A template that drops past reasoning: the checked bridge refuses where it does."""

    prefix_stable = False
    bridge_supported = False

    @pytest.fixture
    def renderer(self, qwen3_tokenizer_dir) -> HFRenderer:
        return HFRenderer(HFConfig(tokenizer=str(qwen3_tokenizer_dir), tool_arguments="string"))

    @pytest.fixture
    def conversations(self) -> list[Conversation]:
        return conversations(corpus(exclude=("parity_only",)))

    @pytest.fixture
    def reference_render(self, qwen3_tokenizer_dir) -> ReferenceRender:
        return reference_render(qwen3_tokenizer_dir, arguments="string")
