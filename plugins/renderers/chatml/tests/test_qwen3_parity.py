"""``render`` equals Qwen3's own chat template (shipped with its tokenizer) token for token,
over the shared corpus, on Qwen3's vocabulary and on Qwen2.5's (where ``<think>`` is text),
with thinking on and off."""

from __future__ import annotations

import pytest
from rllm_core.testing.conversations import corpus
from rllm_core.testing.tokenizers import hf_tokenizer, reference_render
from rllm_renderer_chatml.plugin import Qwen3Config
from rllm_renderer_chatml.qwen3 import Qwen3Renderer

CASES = corpus()


def test_the_corpus_is_large_and_varied():
    assert len(CASES) >= 50
    tags = set().union(*(c.tags for c in CASES))
    assert {"reasoning", "raw_think", "tool_response_text", "tool_calls", "long"} <= tags


@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "no-thinking"])
@pytest.mark.parametrize("vocabulary", ["qwen3", "qwen2.5"])
def test_parity(vocabulary, thinking, qwen3_tokenizer_dir, qwen25_tokenizer_dir):
    folder = qwen3_tokenizer_dir if vocabulary == "qwen3" else qwen25_tokenizer_dir
    renderer = Qwen3Renderer.from_config(
        Qwen3Config(tokenizer=str(folder), enable_thinking=thinking)
    )
    template = hf_tokenizer(str(qwen3_tokenizer_dir)).chat_template
    kwargs = {} if thinking else {"enable_thinking": False}
    reference = reference_render(folder, chat_template=template, arguments="string", **kwargs)
    failures = []
    for case in CASES:
        messages, tools = case.conversation
        for generation in (False, True):
            if renderer.render(messages, tools, generation).token_ids != reference(
                messages, tools, generation
            ):
                failures.append(f"{case.id} (generation={generation})")
    assert failures == []


def test_the_vocabularies_differ_where_expected(qwen3_tokenizer_dir, qwen25_tokenizer_dir):
    q3 = Qwen3Renderer.from_config(Qwen3Config(tokenizer=str(qwen3_tokenizer_dir)))
    q25 = Qwen3Renderer.from_config(Qwen3Config(tokenizer=str(qwen25_tokenizer_dir)))
    assert q3.encode("<think>") == [151667]
    assert [q25.decode([t]) for t in q25.encode("<think>")] == ["<th", "ink", ">"]
    assert q3.encode("plain words") == q25.encode("plain words")
