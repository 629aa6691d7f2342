"""The renderer conformance suite, run on the corpus against the real tokenizers' templates."""

from __future__ import annotations

import pytest
from rllm_core.testing.conversations import Qwen25Reference, SmolLM2Reference
from rllm_core.testing.suites.renderers import RendererConformance
from rllm_renderer_chatml.plugin import ChatMLConfig
from rllm_renderer_chatml.renderer import ChatMLRenderer


class TestSmolLM2(SmolLM2Reference, RendererConformance):
    @pytest.fixture
    def renderer(self, smollm2_tokenizer_dir) -> ChatMLRenderer:
        return ChatMLRenderer.from_config(ChatMLConfig(tokenizer=str(smollm2_tokenizer_dir)))


class TestQwen25(Qwen25Reference, RendererConformance):
    @pytest.fixture
    def renderer(self, qwen25_tokenizer_dir) -> ChatMLRenderer:
        return ChatMLRenderer.from_config(ChatMLConfig(tokenizer=str(qwen25_tokenizer_dir)))
