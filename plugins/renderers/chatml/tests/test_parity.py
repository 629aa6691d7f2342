"""``render`` equals ``apply_chat_template(..., tokenize=True)`` of the real tokenizers, case by
case over the shared corpus, with and without the generation prompt."""

from __future__ import annotations

import pytest
from rllm_core.testing.conversations import corpus
from rllm_core.testing.tokenizers import reference_render
from rllm_renderer_chatml.plugin import ChatMLConfig
from rllm_renderer_chatml.renderer import ChatMLRenderer

SMOL = corpus(exclude=("tools", "tool_calls", "reasoning", "raw_think"))
QWEN = corpus(exclude=("reasoning", "raw_think"))


def test_the_corpora_are_large_and_varied():
    assert len(SMOL) >= 50 and len(QWEN) >= 50
    tags = set().union(*(c.tags for c in QWEN))
    assert {"tools", "tool_calls", "unicode", "long", "empty", "mid_system"} <= tags
    assert {m.role for c in QWEN for m in c.messages} == {"system", "user", "assistant", "tool"}


def _first_difference(got: list[int], want: list[int]) -> int:
    return next(
        (i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
        min(len(got), len(want)),
    )


@pytest.mark.parametrize("case", SMOL, ids=lambda c: c.id)
def test_smollm2(case, smollm2_tokenizer_dir):
    renderer = ChatMLRenderer.from_config(ChatMLConfig(tokenizer=str(smollm2_tokenizer_dir)))
    reference = reference_render(smollm2_tokenizer_dir)
    messages, tools = case.conversation
    for generation in (False, True):
        got = renderer.render(messages, tools, generation).token_ids
        want = reference(messages, tools, generation)
        assert got == want, f"differs at {_first_difference(got, want)} (generation={generation})"


@pytest.mark.parametrize("case", QWEN, ids=lambda c: c.id)
def test_qwen25(case, qwen25_tokenizer_dir):
    renderer = ChatMLRenderer.from_config(ChatMLConfig(tokenizer=str(qwen25_tokenizer_dir)))
    reference = reference_render(qwen25_tokenizer_dir)
    messages, tools = case.conversation
    for generation in (False, True):
        got = renderer.render(messages, tools, generation).token_ids
        want = reference(messages, tools, generation)
        assert got == want, f"differs at {_first_difference(got, want)} (generation={generation})"
