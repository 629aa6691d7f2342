"""The renderer conformance suite, with Qwen3's own Jinja template as the reference."""

from __future__ import annotations

import pytest
from rllm_core.testing.conversations import conversations, corpus
from rllm_core.testing.suites.renderers import Conversation, ReferenceRender, RendererConformance
from rllm_core.testing.tokenizers import hf_tokenizer, reference_render
from rllm_renderer_chatml.plugin import Qwen3Config
from rllm_renderer_chatml.qwen3 import Qwen3Renderer

CASES = conversations(corpus(exclude=("parity_only",)))
# With thinking disabled the prompt closes an empty think block, so no sampled turn can hold
# reasoning.
UNTHINKING = conversations(corpus(exclude=("parity_only", "reasoning", "raw_think")))


def _qwen3_reference(folder, qwen3_tokenizer_dir, **kwargs) -> ReferenceRender:
    template = hf_tokenizer(str(qwen3_tokenizer_dir)).chat_template
    return reference_render(folder, chat_template=template, arguments="string", **kwargs)


class TestStripReasoning(RendererConformance):
    """The template's own policy: earlier turns are rewritten, so the bridge may refuse."""

    prefix_stable = False
    bridge_supported = False

    @pytest.fixture
    def renderer(self, qwen3_tokenizer_dir) -> Qwen3Renderer:
        return Qwen3Renderer.from_config(Qwen3Config(tokenizer=str(qwen3_tokenizer_dir)))

    @pytest.fixture
    def conversations(self) -> list[Conversation]:
        return CASES

    @pytest.fixture
    def reference_render(self, qwen3_tokenizer_dir) -> ReferenceRender:
        return _qwen3_reference(qwen3_tokenizer_dir, qwen3_tokenizer_dir)


class TestStripReasoningQwen25Vocabulary(TestStripReasoning):
    """``<think>`` as plain text: the same template over Qwen2.5's vocabulary."""

    @pytest.fixture
    def renderer(self, qwen25_tokenizer_dir) -> Qwen3Renderer:
        return Qwen3Renderer.from_config(Qwen3Config(tokenizer=str(qwen25_tokenizer_dir)))

    @pytest.fixture
    def reference_render(self, qwen25_tokenizer_dir, qwen3_tokenizer_dir) -> ReferenceRender:
        return _qwen3_reference(qwen25_tokenizer_dir, qwen3_tokenizer_dir)


class TestThinkingDisabled(TestStripReasoning):
    @pytest.fixture
    def conversations(self) -> list[Conversation]:
        return UNTHINKING

    @pytest.fixture
    def renderer(self, qwen3_tokenizer_dir) -> Qwen3Renderer:
        config = Qwen3Config(tokenizer=str(qwen3_tokenizer_dir), enable_thinking=False)
        return Qwen3Renderer.from_config(config)

    @pytest.fixture
    def reference_render(self, qwen3_tokenizer_dir) -> ReferenceRender:
        return _qwen3_reference(qwen3_tokenizer_dir, qwen3_tokenizer_dir, enable_thinking=False)


class TestKeepReasoning(RendererConformance):
    """Every turn keeps its think block: prefix stable, the bridge always extends."""

    @pytest.fixture
    def renderer(self, qwen3_tokenizer_dir) -> Qwen3Renderer:
        config = Qwen3Config(tokenizer=str(qwen3_tokenizer_dir), keep_reasoning=True)
        return Qwen3Renderer.from_config(config)

    @pytest.fixture
    def conversations(self) -> list[Conversation]:
        return CASES


class TestKeepReasoningThinkingDisabled(TestKeepReasoning):
    @pytest.fixture
    def conversations(self) -> list[Conversation]:
        return UNTHINKING

    @pytest.fixture
    def renderer(self, qwen3_tokenizer_dir) -> Qwen3Renderer:
        config = Qwen3Config(
            tokenizer=str(qwen3_tokenizer_dir), keep_reasoning=True, enable_thinking=False
        )
        return Qwen3Renderer.from_config(config)
