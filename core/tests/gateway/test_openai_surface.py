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
from rllm_core.gateway import protocol
from rllm_core.gateway.protocol import PARSE_BUDGET_S, PARSE_SHARE_OF_WAIT, TextDeltas
from rllm_core.gateway.server import Gateway
from rllm_core.ports import StreamingSampler
from rllm_core.testing.samplers import ScriptedSampler
from rllm_core.types import Message, SampleRequest

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
        self.last_token_at: list[float] = []

    async def sample_stream(self, request: SampleRequest):
        result = await self.sample(request)
        try:
            for token, logprob in zip(result.completion_token_ids, result.logprobs, strict=True):
                await asyncio.sleep(self.token_delay_s)
                yield [token], [logprob]
            self.last_token_at.append(time.perf_counter())
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
    assert trace.record.flags == ("tool_choice_unmet",)


def test_a_named_tool_choice_is_met_only_by_a_call_of_that_function(serve, client, store, toy):
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
    flags = {t.record.messages_delta[0].content: t.record.flags for t in store.session("s")}
    assert flags == {"Weather in Paris?": (), "Time?": ("tool_choice_unmet",)}


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
    # 27 tokens at 30 ms: the first text reaches the client before the sampler has handed out
    # its last token. How many deltas the tokens arrive in depends on how busy the machine is
    # (a gateway that falls behind sends what has queued up as one delta), so only more than
    # one is required.
    [last_token] = sampler.last_token_at
    assert first_text < last_token
    assert ended - started > 27 * 0.03
    assert sum(1 for _, piece in content if piece) > 1
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

    async def main() -> list[str]:
        sampler = DrippingSampler([text] * 4, renderer=toy, token_delay_s=0.005)
        async with Gateway(renderer=toy, sampler=sampler, trace_store=store) as gateway:
            api = openai.AsyncOpenAI(
                base_url=gateway.session_url("a"), api_key=gateway.token, max_retries=0
            )
            whole = await api.chat.completions.create(model="policy", messages=USER)
            stream = await api.chat.completions.create(model="policy", messages=USER, stream=True)
            streamed = "".join(
                [c.choices[0].delta.content or "" async for c in stream if c.choices]
            )
            response = await api.responses.create(model="policy", input="Again?")
            events = await api.responses.create(model="policy", input="Once more?", stream=True)
            deltas = "".join(
                [e.delta async for e in events if e.type == "response.output_text.delta"]
            )
            await api.close()
            return [whole.choices[0].message.content, streamed, response.output_text, deltas]

    assert asyncio.run(main()) == [text] * 4


# ------------------------------------------------------------------------- Responses API

RESPONSES_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def test_a_text_input_gets_a_message_output_and_usage(serve, client, toy):
    sampler = ScriptedSampler(["Bonjour."], renderer=toy)
    api = client(serve(sampler), "r")
    reply = api.responses.create(
        model="policy",
        input="Say hello in French.",
        instructions="Be brief.",
        max_output_tokens=32,
        temperature=0.5,
    )
    assert reply.object == "response"
    assert reply.status == "completed"
    assert reply.output_text == "Bonjour."
    [item] = reply.output
    assert (item.type, item.role, item.content[0].type) == ("message", "assistant", "output_text")
    prompt = toy.render(
        [
            Message(role="system", content="Be brief."),
            Message(role="user", content="Say hello in French."),
        ],
        add_generation_prompt=True,
    ).token_ids
    assert sampler.requests[0].prompt_token_ids == prompt
    params = sampler.requests[0].params
    assert (params.max_tokens, params.temperature) == (32, 0.5)
    assert reply.usage.input_tokens == len(prompt)
    assert reply.usage.output_tokens == len(toy.encode("Bonjour.")) + 1
    assert reply.usage.total_tokens == reply.usage.input_tokens + reply.usage.output_tokens
    assert reply.id == f"resp_{reply.model_extra['rllm']['trace_id']}"


def test_a_reply_cut_at_max_output_tokens_is_incomplete(serve, client, toy):
    cut = toy.encode("Too long")[:3]
    api = client(serve(ScriptedSampler([cut], renderer=toy)), "r")
    reply = api.responses.create(model="policy", input="Talk.", max_output_tokens=3)
    assert reply.status == "incomplete"
    assert reply.incomplete_details.reason == "max_output_tokens"


def _chat_conversation(api) -> list:
    messages = [{"role": "system", "content": "Be brief."}, *USER]
    first = api.chat.completions.create(model="policy", messages=messages, tools=[WEATHER_TOOL])
    call = first.choices[0].message.tool_calls[0]
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18C"},
    ]
    second = api.chat.completions.create(model="policy", messages=messages, tools=[WEATHER_TOOL])
    return [first, second]


def _responses_conversation(api) -> list:
    first = api.responses.create(
        model="policy", instructions="Be brief.", input=USER, tools=[RESPONSES_TOOL]
    )
    [call] = first.output
    assert call.type == "function_call"
    items = [
        *USER,
        *[item.model_dump(exclude_none=True) for item in first.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "18C"},
    ]
    second = api.responses.create(
        model="policy", instructions="Be brief.", input=items, tools=[RESPONSES_TOOL]
    )
    return [first, second]


def test_function_tools_round_trip_and_extend_the_same_lineage_as_chat(serve, client, store, toy):
    chat_sampler = ScriptedSampler([CALL_TEXT, "It is 18C."], renderer=toy)
    resp_sampler = ScriptedSampler([CALL_TEXT, "It is 18C."], renderer=toy)
    chat = _chat_conversation(client(serve(chat_sampler, cumulative=True), "chat"))
    resp = _responses_conversation(client(serve(resp_sampler, cumulative=True), "resp"))

    [call] = resp[0].output
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    assert call.call_id == chat[0].choices[0].message.tool_calls[0].id.replace(
        chat[0].model_extra["rllm"]["trace_id"][:12], resp[0].model_extra["rllm"]["trace_id"][:12]
    )
    assert resp[1].output_text == "It is 18C."
    assert [r.model_extra["rllm"]["mode"] for r in resp] == ["root", "extend"]
    assert [r.model_extra["rllm"]["mode"] for r in chat] == ["root", "extend"]
    assert [r.prompt_token_ids for r in resp_sampler.requests] == [
        r.prompt_token_ids for r in chat_sampler.requests
    ]
    resp_traces, chat_traces = store.session("resp"), store.session("chat")
    assert [t.record.lineage_id for t in resp_traces] == ["main", "main"]
    assert [(t.prompt_token_ids, t.record.completion_token_ids) for t in resp_traces] == [
        (t.prompt_token_ids, t.record.completion_token_ids) for t in chat_traces
    ]


def test_a_chat_conversation_continued_through_responses_stays_in_its_lineage(serve, client, toy):
    sampler = ScriptedSampler([CALL_TEXT, "It is 18C."], renderer=toy)
    api = client(serve(sampler, cumulative=True), "mixed")
    messages = [{"role": "system", "content": "Be brief."}, *USER]
    first = api.chat.completions.create(model="policy", messages=messages, tools=[WEATHER_TOOL])
    call = first.choices[0].message.tool_calls[0]
    second = api.responses.create(
        model="policy",
        instructions="Be brief.",
        input=[
            *USER,
            {
                "type": "function_call",
                "call_id": call.id,
                "name": call.function.name,
                "arguments": call.function.arguments,
            },
            {"type": "function_call_output", "call_id": call.id, "output": "18C"},
        ],
        tools=[RESPONSES_TOOL],
    )
    info = second.model_extra["rllm"]
    assert (info["mode"], info["lineage_id"], info["turn"]) == ("extend", "main", 1)


def test_responses_tool_choice_required_and_named(serve, client, toy):
    api = client(serve(ScriptedSampler(["No call.", CALL_TEXT], renderer=toy)), "r")
    unmet = api.responses.create(
        model="policy", input="Weather?", tools=[RESPONSES_TOOL], tool_choice="required"
    )
    met = api.responses.create(
        model="policy",
        input="Weather now?",
        tools=[RESPONSES_TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
    )
    assert unmet.output_text == "No call."
    assert unmet.model_extra["rllm"]["tool_choice_met"] is False
    assert met.model_extra["rllm"]["tool_choice_met"] is True
    assert met.output[0].type == "function_call"


def test_a_streamed_response_sends_the_event_sequence(serve, client, toy):
    api = client(serve(ScriptedSampler(["Hello!"], renderer=toy)), "r")
    events = list(api.responses.create(model="policy", input="hi", stream=True))
    kinds = [e.type for e in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == "Hello!"
    assert events[-1].response.output_text == "Hello!"
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_a_streamed_response_arrives_while_it_is_sampled(serve, client, store, toy):
    reply = "<think>\nWeather needs a tool.\n</think>\n\nLet me check the weather.\n" + CALL_TEXT
    sampler = DrippingSampler([reply, reply], renderer=toy, token_delay_s=0.02)
    gateway = serve(sampler)
    api = client(gateway, "stream")
    with api.responses.stream(model="policy", input=USER, tools=[RESPONSES_TOOL]) as stream:
        arrivals = [(time.perf_counter(), event) for event in stream]
        final = stream.get_final_response()
    first_text = next(at for at, e in arrivals if e.type == "response.output_text.delta")
    # The text reaches the client while the tool call after it is still being sampled; the
    # number of deltas depends on how busy the machine is, so only more than one is required.
    [last_token] = sampler.last_token_at
    assert first_text < last_token
    text_deltas = [e.delta for _, e in arrivals if e.type == "response.output_text.delta"]
    assert len(text_deltas) > 1
    assert "".join(text_deltas) == "Let me check the weather."

    whole = client(gateway, "whole").responses.create(
        model="policy", input=USER, tools=[RESPONSES_TOOL]
    )
    assert _items(final.output) == _items(whole.output)
    assert [i.type for i in final.output] == ["reasoning", "message", "function_call"]
    assert final.output[0].content[0].text == "Weather needs a tool."
    assert final.output_text == whole.output_text == "Let me check the weather."
    assert final.usage.output_tokens == whole.usage.output_tokens
    [streamed] = store.session("stream")
    [served] = store.session("whole")
    assert streamed.prompt_token_ids == served.prompt_token_ids
    assert streamed.record.completion_token_ids == served.record.completion_token_ids


def _items(output) -> list[tuple]:
    """Output items as the agent reads them, without ids unique to a trace."""
    shown = []
    for item in output:
        if item.type == "function_call":
            shown.append((item.type, item.name, item.arguments, item.status))
        else:
            shown.append((item.type, [part.text for part in item.content], item.status))
    return shown


@pytest.mark.parametrize(
    ("extra", "param", "fragment"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id", "keeps no response"),
        ({"text": {"format": {"type": "json_object"}}}, "text.format", "not supported"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type", "'web_search'"),
        (
            {"tools": [RESPONSES_TOOL], "tool_choice": {"type": "function", "name": "nope"}},
            "tool_choice.name",
            "'nope'",
        ),
        ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0].type", "input_image"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
            "input[0].content[0]",
            "only text parts",
        ),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id", ""),
        ({"input": []}, "input", "no items"),
        ({"input": 3}, "input", "expected `str | array`"),
        ({"max_output_tokens": 0}, "max_output_tokens", "at least 1"),
    ],
)
def test_a_responses_request_the_gateway_cannot_honour_is_a_400(
    serve, raw, toy, extra, param, fragment
):
    sampler = ScriptedSampler([], renderer=toy)
    server = serve(sampler)
    body = {"model": "policy", "input": "hi", **extra}
    response = raw(server)("POST", "/sessions/s/v1/responses", body)
    assert response.status == 400, response.body
    assert response.error["param"] == param
    assert fragment in response.error["message"]
    assert sampler.calls == 0


def test_a_malformed_responses_body_is_a_400_not_a_500(serve, raw, toy):
    server = serve(ScriptedSampler([], renderer=toy))
    for body in ("{", "[]", '{"input": {"a": 1}}', '{"model": "policy"}'):
        response = raw(server)("POST", "/sessions/s/v1/responses", body)
        assert response.status == 400, (body, response.body)
    assert raw(server)("GET", "/sessions/s/v1/responses").status == 405


def test_a_client_leaving_mid_stream_abandons_the_call_and_records_nothing(
    serve, client, store, toy
):
    sampler = DrippingSampler(["x" * 200, "after"], renderer=toy, token_delay_s=0.01)
    gateway = serve(sampler)
    api = client(gateway, "s")
    stream = api.chat.completions.create(model="policy", messages=USER, stream=True)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            break
    stream.close()
    deadline = time.monotonic() + 5
    while not sampler.closed_early and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sampler.closed_early == 1
    assert store.session("s") == []
    again = api.chat.completions.create(model="policy", messages=USER)
    assert again.choices[0].message.content == "after"


def test_re_parsing_a_growing_reply_stays_within_its_cpu_budget(toy):
    calls = []

    def slow_parse(ids):
        calls.append(len(ids))
        time.sleep(0.001)
        return toy.parse_response(ids)

    deltas = TextDeltas(slow_parse)
    text = "".join(piece for t in toy.encode("a b " * 100) for piece in deltas.feed([t]).values())
    # Each parse costs at least 1 ms, so the next waits for 1 ms / PARSE_BUDGET_S tokens.
    assert len(calls) <= 400 * PARSE_BUDGET_S / 0.001 + 1
    assert text == ("a b " * 100).rstrip()[: len(text)] and len(text) > 300


def test_tokens_that_arrive_slowly_are_each_parsed_however_long_the_reply(toy, monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(protocol.time, "perf_counter", lambda: clock[0])
    parse_s = 0.002
    calls = []

    def slow_parse(ids):
        calls.append(len(ids))
        clock[0] += parse_s
        return toy.parse_response(ids)

    deltas = TextDeltas(slow_parse)
    tokens = toy.encode("a b " * 50)
    for gap_s, expect_every_token in ((2 * parse_s / PARSE_SHARE_OF_WAIT, True), (parse_s, False)):
        calls.clear()
        for token in tokens:
            clock[0] += gap_s
            deltas.feed([token])
        assert (len(calls) == len(tokens)) is expect_every_token, (gap_s, len(calls))
