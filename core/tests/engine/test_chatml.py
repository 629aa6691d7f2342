"""The engine over the real ``chatml`` renderer and real tokenizers (SmolLM2, Qwen2.5).

ChatML templates render each turn independently of what follows, so a bridged prompt must
equal the full render of the conversation, token for token, whenever the client sends back
the reply the gateway produced.
"""

from __future__ import annotations

import asyncio

import pytest
from rllm_core.gateway.engine import ChatRequest, GatewayEngine
from rllm_core.testing.samplers import ScriptedSampler
from rllm_core.types import Message, SamplingParams, ToolCall, ToolSpec

chatml = pytest.importorskip("rllm_renderer_chatml.renderer")
ChatMLConfig = pytest.importorskip("rllm_renderer_chatml.plugin").ChatMLConfig


@pytest.fixture(scope="module")
def smol(smollm2_tokenizer_dir):
    return chatml.ChatMLRenderer.from_config(ChatMLConfig(tokenizer=str(smollm2_tokenizer_dir)))


@pytest.fixture(scope="module")
def qwen(qwen25_tokenizer_dir):
    return chatml.ChatMLRenderer.from_config(ChatMLConfig(tokenizer=str(qwen25_tokenizer_dir)))


def user(text: str) -> Message:
    return Message(role="user", content=text)


def chat(engine: GatewayEngine, messages, **kwargs):
    return asyncio.run(engine.chat("s", ChatRequest(messages=tuple(messages), **kwargs)))


@pytest.mark.parametrize("cumulative", [True, False])
def test_smollm2_multi_turn(smol, store, chain_checker, cumulative) -> None:
    replies = ["Paris is the capital of France.", "About 2.1 million people.", "Bonjour ! 🙂"]
    sampler = ScriptedSampler(replies, renderer=smol)
    engine = GatewayEngine(renderer=smol, sampler=sampler, trace_store=store, cumulative=cumulative)
    messages = [Message(role="system", content="Answer briefly."), user("Capital of France?")]
    results = []
    for question in ("How many people live there?", "Say hello in French."):
        result = chat(engine, messages)
        results.append(result)
        messages += [result.message, user(question)]
    results.append(chat(engine, messages))

    im_end = smol.stop_token_ids()[0]
    assert [r.mode for r in results] == ["root", "extend", "extend"]
    for n, result in enumerate(results):
        assert result.message.content == replies[n]
        assert result.completion_token_ids == [*smol.encode(replies[n]), im_end]
        full = smol.render(messages[: 2 * n + 2], add_generation_prompt=True).token_ids
        assert result.prompt_token_ids == full
        assert sampler.requests[n].prompt_token_ids == full
    chain = chain_checker(store.session("s"), sampler.requests)
    assert [t.record.parent_trace_id for t in chain][1:] == [r.trace_id for r in results[:2]]
    delta = chain[1].record.prompt_delta_token_ids
    prefix = len(results[0].prompt_token_ids) + len(results[0].completion_token_ids)
    assert delta == results[1].prompt_token_ids[prefix:]
    assert smol.decode(delta) == (
        "\n<|im_start|>user\nHow many people live there?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_smollm2_truncated_completion_then_a_new_user_turn(smol, store, chain_checker) -> None:
    sampler = ScriptedSampler(["The answer is forty-two, as everyone knows.", "No."], renderer=smol)
    engine = GatewayEngine(renderer=smol, sampler=sampler, trace_store=store)
    first = chat(engine, [user("What is the answer?")], params=SamplingParams(max_tokens=4))
    assert first.finish_reason == "length"
    assert len(first.completion_token_ids) == 4
    messages = [user("What is the answer?"), first.message, user("You were cut off.")]
    second = chat(engine, messages)
    assert second.mode == "extend"
    im_end = smol.stop_token_ids()[0]
    prefix = first.prompt_token_ids + first.completion_token_ids
    assert second.prompt_token_ids[: len(prefix)] == prefix
    assert second.prompt_token_ids[len(prefix)] == im_end
    chain_checker(store.session("s"), sampler.requests)


WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather of a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
)


def test_qwen25_tool_call_turn(qwen, store, chain_checker) -> None:
    call_text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    sampler = ScriptedSampler([call_text, "It is 3 °C in Oslo."], renderer=qwen)
    engine = GatewayEngine(renderer=qwen, sampler=sampler, trace_store=store)
    messages = [user("Weather in Oslo?")]
    first = chat(engine, messages, tools=(WEATHER,))
    assert first.finish_reason == "tool_calls"
    [call] = first.message.tool_calls
    assert (call.name, call.arguments) == ("get_weather", '{"city": "Oslo"}')
    assert first.prompt_token_ids == qwen.render(messages, [WEATHER], True).token_ids

    echoed = Message(
        role="assistant",
        content=first.message.content,
        tool_calls=(ToolCall(id=call.id, name=call.name, arguments='{"city":"Oslo"}'),),
    )
    messages += [echoed, Message(role="tool", content="3 °C, cloudy", tool_call_id=call.id)]
    second = chat(engine, messages, tools=(WEATHER,))
    assert second.mode == "extend"
    assert second.message.content == "It is 3 °C in Oslo."
    assert second.prompt_token_ids == qwen.render(messages, [WEATHER], True).token_ids
    chain_checker(store.session("s"), sampler.requests)
