"""Streamed chat deltas over a real tokenizer: the Qwen3 renderer's byte-level BPE splits
multi-byte characters across tokens, and its ``<think>`` and ``<tool_call>`` tags must never
leak into the content. Each reply is streamed one token at a time and compared with the same
reply served whole."""

from __future__ import annotations

import asyncio

import pytest
from reference_stores import MemoryTraceStore
from rllm_core.gateway import protocol
from rllm_core.gateway.server import Gateway
from rllm_core.plugins import Kind, PluginManager
from rllm_core.testing.samplers import ScriptedSampler
from rllm_core.types import SampleRequest
from rllm_renderer_chatml import plugin

openai = pytest.importorskip("openai")

TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a word up",
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
    },
}
REPLIES = [
    "Grüße aus 東京 🙂🎉, naïve café — done.",
    "<think>\nThe user wants 日本語. Think → answer.\n</think>\n\nこんにちは 👋 world",
    'I will look it up.\n<tool_call>\n{"name": "lookup", "arguments": {"word": "Straße"}}\n'
    "</tool_call>",
]


class OneTokenAtATime(ScriptedSampler):
    async def sample_stream(self, request: SampleRequest):
        result = await self.sample(request)
        for token, logprob in zip(result.completion_token_ids, result.logprobs, strict=True):
            await asyncio.sleep(0)
            yield [token], [logprob]
        yield result


@pytest.fixture(scope="module")
def qwen3(qwen3_tokenizer_dir):
    manager = PluginManager(load_entry_points=False)
    manager.register(plugin, name="chatml", distribution="rllm-renderer-chatml")
    return manager.get(Kind.RENDERER, "qwen3").build({"tokenizer": str(qwen3_tokenizer_dir)})


@pytest.mark.parametrize("reply", REPLIES)
def test_streamed_deltas_rebuild_the_whole_reply(qwen3, reply, monkeypatch):
    # Every token earns a re-parse whatever one costs on a loaded machine, so the reply streams
    # in as many pieces as its text allows (the budget has tests of its own).
    monkeypatch.setattr(protocol, "PARSE_BUDGET_S", 1.0)
    store = MemoryTraceStore()
    sampler = OneTokenAtATime([reply, reply], renderer=qwen3)
    messages = [{"role": "user", "content": "Go."}]
    with Gateway(renderer=qwen3, sampler=sampler, trace_store=store) as gateway:
        streaming, plain = (
            openai.OpenAI(base_url=gateway.session_url(s), api_key=gateway.token, max_retries=0)
            for s in ("stream", "whole")
        )
        chunks = list(
            streaming.chat.completions.create(
                model="policy", messages=messages, tools=[TOOL], stream=True
            )
        )
        whole = plain.chat.completions.create(model="policy", messages=messages, tools=[TOOL])
        [streamed] = store.session("stream")
        [served] = store.session("whole")
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    content = [d.content for d in deltas if d.content]
    reasoning = [d.model_extra.get("reasoning_content") for d in deltas]
    reasoning = [r for r in reasoning if r]
    message = whole.choices[0].message

    assert "".join(content) == (message.content or "")
    assert "".join(reasoning) == (message.model_extra.get("reasoning_content") or "")
    assert len(content) >= 3
    for piece in content + reasoning:
        assert "\ufffd" not in piece
        assert "<tool_call>" not in piece and "<think>" not in piece and "</think>" not in piece
    # A call streams as its name first, then its arguments in pieces, keyed by index.
    streamed_calls: dict[int, list[str]] = {}
    for tc in (tc for d in deltas for tc in (d.tool_calls or [])):
        if tc.function.name:
            streamed_calls[tc.index] = [tc.function.name, ""]
        streamed_calls[tc.index][1] += tc.function.arguments or ""
    assert [tuple(call) for call in streamed_calls.values()] == [
        (tc.function.name, tc.function.arguments) for tc in message.tool_calls or []
    ]
    assert streamed.prompt_token_ids == served.prompt_token_ids
    assert streamed.record.completion_token_ids == served.record.completion_token_ids
    assert _shown(streamed.record.messages_delta) == _shown(served.record.messages_delta)


def _shown(messages):
    """Messages without the per-trace tool call ids."""
    return [
        (m.role, m.content, m.reasoning, [(c.name, c.arguments) for c in m.tool_calls])
        for m in messages
    ]
