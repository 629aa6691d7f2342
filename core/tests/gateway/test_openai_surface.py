"""The OpenAI request fields beyond plain chat, driven by the official ``openai`` client over
real HTTP: ``response_format`` refusal, ``tool_choice`` (auto, none, required, a named
function), streaming that forwards tokens as the sampler produces them, and the async client."""

from __future__ import annotations

import asyncio
import json
import time

import openai
import pytest
from reference.toy_renderer import IM_END
from rllm_core.gateway.server import Gateway
from rllm_core.ports import StreamingSampler
from rllm_core.testing.samplers import ScriptedSampler
from rllm_core.types import SampleRequest

USER = [{"role": "user", "content": "Weather in Paris?"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


class DrippingSampler(ScriptedSampler):
    """A streaming sampler: the scripted completion, handed out one token every
    ``token_delay_s``, as a model server streaming its tokens would."""

    def __init__(self, script, *, renderer, token_delay_s: float) -> None:
        super().__init__(script, renderer=renderer)
        self.token_delay_s = token_delay_s
        self.closed_early = 0

    async def sample_stream(self, request: SampleRequest):
        result = await self.sample(request)
        try:
            for token, logprob in zip(result.completion_token_ids, result.logprobs, strict=True):
                await asyncio.sleep(self.token_delay_s)
                yield [token], [logprob]
        except GeneratorExit:
            self.closed_early += 1
            raise
        yield result


def test_the_dripping_sampler_is_a_streaming_sampler(toy):
    assert isinstance(DrippingSampler([], renderer=toy, token_delay_s=0), StreamingSampler)
    assert not isinstance(ScriptedSampler([], renderer=toy), StreamingSampler)


# ------------------------------------------------------------------------- response_format


@pytest.mark.parametrize(
    "fmt",
    [
        {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}}},
    ],
)
def test_response_format_asking_for_json_is_refused_with_a_400(serve, client, toy, fmt):
    sampler = ScriptedSampler(["{}"], renderer=toy)
    api = client(serve(sampler), "s")
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(model="policy", messages=USER, response_format=fmt)
    error = caught.value.body
    assert caught.value.status_code == 400
    assert error["param"] == "response_format"
    assert error["type"] == "invalid_request_error"
    assert f"response_format {{'type': '{fmt['type']}'}} is not supported" in error["message"]
    assert sampler.calls == 0


def test_response_format_text_asks_for_nothing_and_is_served(serve, client, toy):
    api = client(serve(ScriptedSampler(["plain"], renderer=toy)), "s")
    reply = api.chat.completions.create(
        model="policy", messages=USER, response_format={"type": "text"}
    )
    assert reply.choices[0].message.content == "plain"


# ------------------------------------------------------------------------- tool_choice


def test_tool_choice_auto_offers_the_tools_and_reports_nothing_required(serve, client, toy):
    sampler = ScriptedSampler([CALL_TEXT], renderer=toy)
    reply = client(serve(sampler), "s").chat.completions.create(
        model="policy", messages=USER, tools=[WEATHER_TOOL], tool_choice="auto"
    )
    assert reply.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert "tool_choice_met" not in reply.model_extra["rllm"]


def test_tool_choice_none_renders_no_tools_and_returns_the_reply(serve, client, toy):
    sampler = ScriptedSampler(["No tools."], renderer=toy)
    reply = client(serve(sampler), "s").chat.completions.create(
        model="policy", messages=USER, tools=[WEATHER_TOOL], tool_choice="none"
    )
    assert b"get_weather" not in bytes(t for t in sampler.requests[0].prompt_token_ids if t < 256)
    assert reply.choices[0].message.content == "No tools."


def test_tool_choice_required_met_returns_the_call(serve, client, toy):
    sampler = ScriptedSampler([CALL_TEXT], renderer=toy)
    reply = client(serve(sampler), "s").chat.completions.create(
        model="policy", messages=USER, tools=[WEATHER_TOOL], tool_choice="required"
    )
    assert reply.choices[0].finish_reason == "tool_calls"
    assert reply.model_extra["rllm"]["tool_choice_met"] is True
    assert b"get_weather" in bytes(t for t in sampler.requests[0].prompt_token_ids if t < 256)


def test_tool_choice_required_unmet_keeps_the_sampled_reply_and_says_so(serve, client, store, toy):
    gateway = serve(ScriptedSampler(["It is sunny."], renderer=toy))
    reply = client(gateway, "s").chat.completions.create(
        model="policy", messages=USER, tools=[WEATHER_TOOL], tool_choice="required"
    )
    assert reply.choices[0].message.content == "It is sunny."
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].finish_reason == "stop"
    assert reply.model_extra["rllm"]["tool_choice_met"] is False
    [trace] = store.session("s")
    assert trace.record.completion_token_ids == [*toy.encode("It is sunny."), IM_END]


def test_a_named_tool_choice_is_met_only_by_a_call_of_that_function(serve, client, toy):
    sampler = ScriptedSampler([CALL_TEXT, CALL_TEXT], renderer=toy)
    api = client(serve(sampler), "s")
    named = {"type": "function", "function": {"name": "get_weather"}}
    other = {"type": "function", "function": {"name": "get_time"}}
    met = api.chat.completions.create(
        model="policy", messages=USER, tools=[WEATHER_TOOL, TIME_TOOL], tool_choice=named
    )
    unmet = api.chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": "Time?"}],
        tools=[WEATHER_TOOL, TIME_TOOL],
        tool_choice=other,
    )
    assert met.model_extra["rllm"]["tool_choice_met"] is True
    assert unmet.model_extra["rllm"]["tool_choice_met"] is False
    assert unmet.choices[0].message.tool_calls[0].function.name == "get_weather"


def test_a_named_function_missing_from_tools_is_a_400_naming_it(serve, client, toy):
    sampler = ScriptedSampler([], renderer=toy)
    api = client(serve(sampler), "s")
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(
            model="policy",
            messages=USER,
            tools=[WEATHER_TOOL],
            tool_choice={"type": "function", "function": {"name": "search"}},
        )
    error = caught.value.body
    assert error["param"] == "tool_choice.function.name"
    assert "'search'" in error["message"] and "'get_weather'" in error["message"]
    assert sampler.calls == 0


# ------------------------------------------------------------------------- streaming


def _timed(stream) -> list[tuple[float, object]]:
    return [(time.perf_counter(), chunk) for chunk in stream]


def test_streaming_forwards_tokens_while_they_are_sampled(serve, client, store, toy):
    text = "Streaming, token by token."
    sampler = DrippingSampler([text, text], renderer=toy, token_delay_s=0.03)
    gateway = serve(sampler)
    api = client(gateway, "stream")
    started = time.perf_counter()
    chunks = _timed(
        api.chat.completions.create(
            model="policy",
            messages=USER,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    ended = chunks[-1][0]
    content = [(at, c.choices[0].delta.content) for at, c in chunks if c.choices]
    first_text = next(at for at, piece in content if piece)
    # 27 tokens at 30 ms: the first text arrives long before the completion is done.
    assert first_text - started < 0.4 * (ended - started)
    assert ended - started > 27 * 0.03
    assert sum(1 for _, piece in content if piece) > 10
    streamed = "".join(piece or "" for _, piece in content)

    whole = client(gateway, "whole").chat.completions.create(model="policy", messages=USER)
    assert streamed == whole.choices[0].message.content == text
    usage = chunks[-1][1].usage
    assert usage.completion_tokens == whole.usage.completion_tokens == len(toy.encode(text)) + 1
    assert usage.prompt_tokens == whole.usage.prompt_tokens

    [streamed_trace] = store.session("stream")
    [whole_trace] = store.session("whole")
    for field in (
        "prompt_delta_token_ids",
        "completion_token_ids",
        "logprobs",
        "finish_reason",
        "messages_delta",
        "lineage_id",
        "turn",
    ):
        assert getattr(streamed_trace.record, field) == getattr(whole_trace.record, field), field


def test_streamed_deltas_never_split_a_multibyte_character(serve, client, toy):
    text = "Café 日本 🙂 ok"
    sampler = DrippingSampler([text], renderer=toy, token_delay_s=0.0)
    stream = client(serve(sampler), "s").chat.completions.create(
        model="policy", messages=USER, stream=True
    )
    pieces = [c.choices[0].delta.content for c in stream if c.choices]
    assert "".join(p or "" for p in pieces) == text
    assert not any("\ufffd" in (p or "") for p in pieces)
    assert len([p for p in pieces if p]) > 3


def test_a_streamed_tool_call_tag_never_leaks_into_the_content(serve, client, store, toy):
    reply = f"Let me check.\n{CALL_TEXT}"
    sampler = DrippingSampler([reply, reply], renderer=toy, token_delay_s=0.0)
    gateway = serve(sampler)
    chunks = list(
        client(gateway, "s").chat.completions.create(
            model="policy", messages=USER, tools=[WEATHER_TOOL], stream=True, logprobs=True
        )
    )
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == "Let me check."
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert [(tc.index, tc.function.name) for tc in calls] == [(0, "get_weather")]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    logprobs = [
        e.logprob
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert logprobs == store.session("s")[0].record.logprobs


def test_a_stream_errors_before_sampling_keep_their_status(serve, client, toy):
    api = client(
        serve(DrippingSampler([], renderer=toy, token_delay_s=0), max_prompt_tokens=5), "s"
    )
    with pytest.raises(openai.BadRequestError) as caught:
        api.chat.completions.create(model="policy", messages=USER, stream=True)
    assert caught.value.body["code"] == "prompt_too_long"


def test_the_async_client_streams_and_completes(toy, store):
    text = "Async reply."

    async def main() -> tuple[str, str]:
        sampler = DrippingSampler([text, text], renderer=toy, token_delay_s=0.005)
        async with Gateway(renderer=toy, sampler=sampler, trace_store=store) as gateway:
            api = openai.AsyncOpenAI(
                base_url=gateway.session_url("a"), api_key=gateway.token, max_retries=0
            )
            whole = await api.chat.completions.create(model="policy", messages=USER)
            stream = await api.chat.completions.create(model="policy", messages=USER, stream=True)
            streamed = "".join(
                [c.choices[0].delta.content or "" async for c in stream if c.choices]
            )
            await api.close()
            return whole.choices[0].message.content, streamed

    assert asyncio.run(main()) == (text, text)
