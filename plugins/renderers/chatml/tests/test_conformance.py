"""The renderer conformance suite, run on the corpus against the real tokenizers' templates."""

from __future__ import annotations

import pytest
from rllm_core.testing.conversations import conversations, corpus
from rllm_core.testing.suites.renderers import Conversation, ReferenceRender, RendererConformance
from rllm_core.testing.tokenizers import reference_render
from rllm_renderer_chatml.plugin import ChatMLConfig
from rllm_renderer_chatml.renderer import ChatMLRenderer

NO_TOOLS = ("tools", "tool_calls", "reasoning", "raw_think", "parity_only")


class TestSmolLM2(RendererConformance):
    supports_tools = False

    @pytest.fixture
    def renderer(self, smollm2_tokenizer_dir) -> ChatMLRenderer:
        return ChatMLRenderer.from_config(ChatMLConfig(tokenizer=str(smollm2_tokenizer_dir)))

    @pytest.fixture
    def conversations(self) -> list[Conversation]:
        return conversations(corpus(exclude=NO_TOOLS))

    @pytest.fixture
    def reference_render(self, smollm2_tokenizer_dir) -> ReferenceRender:
        return reference_render(smollm2_tokenizer_dir)


class TestQwen25(RendererConformance):
    @pytest.fixture
    def renderer(self, qwen25_tokenizer_dir) -> ChatMLRenderer:
        return ChatMLRenderer.from_config(ChatMLConfig(tokenizer=str(qwen25_tokenizer_dir)))

    @pytest.fixture
    def conversations(self) -> list[Conversation]:
        return conversations(corpus(exclude=("reasoning", "raw_think", "parity_only")))

    @pytest.fixture
    def reference_render(self, qwen25_tokenizer_dir) -> ReferenceRender:
        return reference_render(qwen25_tokenizer_dir)
