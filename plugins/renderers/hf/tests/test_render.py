"""Attribution by incremental rendering, checked against the Python ChatML renderer."""

from __future__ import annotations

import json

import pytest
from rllm_core.testing.conversations import corpus
from rllm_core.types import Message
from rllm_renderer_chatml.plugin import ChatMLConfig
from rllm_renderer_chatml.renderer import ChatMLRenderer
from rllm_renderer_hf.plugin import HFConfig
from rllm_renderer_hf.renderer import HFRenderer


@pytest.mark.parametrize("folder", ["qwen25_tokenizer_dir", "smollm2_tokenizer_dir"])
def test_attribution_matches_the_chatml_renderer(folder, request):
    """Same ids, same sampled tokens; the only difference: a default system message the
    template writes is scaffold (-1) for chatml and part of message 0 for hf."""
    path = str(request.getfixturevalue(folder))
    hf = HFRenderer(HFConfig(tokenizer=path))
    chatml = ChatMLRenderer.from_config(ChatMLConfig(tokenizer=path))
    skip = ["reasoning", "raw_think"] + (["tools", "tool_calls"] if "smol" in folder else [])
    for case in corpus(exclude=skip):
        messages, tools = case.conversation
        for generation in (False, True):
            a = hf.render(messages, tools, generation)
            b = chatml.render(messages, tools, generation)
            assert a.token_ids == b.token_ids
            assert a.sampled_mask == b.sampled_mask, case.id
            lead = next(i for i, m in enumerate(b.message_indices) if m != -1)
            assert a.message_indices[lead:] == b.message_indices[lead:], case.id
            assert a.message_indices[:lead] == [0] * lead


def test_errors(qwen25_tokenizer_dir, tmp_path):
    with pytest.raises(ValueError, match="'<\\|nope\\|>' is not in the vocabulary"):
        HFRenderer(HFConfig(tokenizer=str(qwen25_tokenizer_dir), stop_tokens=["<|nope|>"]))
    renderer = HFRenderer(HFConfig(tokenizer=str(qwen25_tokenizer_dir)))
    with pytest.raises(ValueError, match="at least one message"):
        renderer.render([])


def test_no_chat_template(smollm2_tokenizer_dir, tmp_path):
    (tmp_path / "tokenizer.json").write_bytes(
        (smollm2_tokenizer_dir / "tokenizer.json").read_bytes()
    )
    config = json.loads((smollm2_tokenizer_dir / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="has no chat template"):
        HFRenderer(HFConfig(tokenizer=str(tmp_path)))
    given = HFRenderer(
        HFConfig(tokenizer=str(tmp_path), chat_template="{{ messages[0]['content'] }}")
    )
    assert given.decode(given.render([Message(role="user", content="hi")]).token_ids) == "hi"


def test_stop_tokens_and_parse(qwen25_tokenizer_dir, smollm2_tokenizer_dir):
    qwen = HFRenderer(HFConfig(tokenizer=str(qwen25_tokenizer_dir)))
    assert qwen.stop_token_ids() == [151645, 151643]
    smol = HFRenderer(HFConfig(tokenizer=str(smollm2_tokenizer_dir), stop_tokens=["<repo_name>"]))
    assert smol.stop_token_ids() == [2, 0, 3]
    got = qwen.parse_response(
        [
            *qwen.encode('<think>\nr\n</think>\n\nA\n<tool_call>\n{"name": "f"}\n</tool_call>'),
            151645,
        ]
    )
    assert (got.reasoning, got.content, got.stopped) == ("r", "A", True)
    assert got.tool_calls[0].call.name == "f"
    assert qwen.parse_response(qwen.encode("<think>\nhal")).reasoning == "hal"
