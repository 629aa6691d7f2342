"""The gateway driven by the official ``openai`` client: multi-turn chat, streaming, tool calls,
logprobs, sampling parameters, completions, models, and many sessions at once."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from reference.toy_renderer import IM_END
from rllm_core.testing.samplers import ScriptedSampler, scripted_logprob
from rllm_core.types import Message, SamplingParams, ToolSpec

SYSTEM = {"role": "system", "content": "Be brief."}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
WEATHER_SPEC = ToolSpec(
    name="get_weather",
    description="Current weather of a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def as_message(choice_message) -> dict:
    """What an agent sends back: the assistant message as the client returned it."""
    return choice_message.model_dump(exclude_none=True)


def test_multi_turn_chat_samples_exact_prompts_and_reports_usage(serve, client, toy):
    sampler = ScriptedSampler(["Hello there", "Paris."], renderer=toy)
    gateway = serve(sampler, cumulative=True)
    api = client(gateway, "s1")
    messages = [SYSTEM, {"role": "user", "content": "hi"}]

    first = api.chat.completions.create(model="policy", messages=messages)

    prompt0 = toy.render(
        [Message(role="system", content="Be brief."), Message(role="user", content="hi")],
        add_generation_prompt=True,
    ).token_ids
    completion0 = [*toy.encode("Hello there"), IM_END]
    assert sampler.requests[0].prompt_token_ids == prompt0
    assert first.object == "chat.completion"
    assert first.model == "policy"
    assert first.choices[0].message.role == "assistant"
    assert first.choices[0].message.content == "Hello there"
    assert first.choices[0].finish_reason == "stop"
    assert first.choices[0].logprobs is None
    assert first.usage.prompt_tokens == len(prompt0)
    assert first.usage.completion_tokens == len(completion0) == 12
    assert first.usage.total_tokens == len(prompt0) + 12
    assert first.model_extra["rllm"]["mode"] == "root"
    assert first.id == f"chatcmpl-{first.model_extra['rllm']['trace_id']}"

    messages += [as_message(first.choices[0].message), {"role": "user", "content": "Capital?"}]
    second = api.chat.completions.create(model="policy", messages=messages)

    assert second.choices[0].message.content == "Paris."
    assert second.model_extra["rllm"]["mode"] == "extend"
    assert second.model_extra["rllm"]["turn"] == 1
    expected = toy.bridge_to_next_turn(
        prompt0, completion0, [Message(role="user", content="Capital?")]
    )
    assert sampler.requests[1].prompt_token_ids == expected
    assert second.usage.prompt_tokens == len(expected)


def test_streaming_chat_sends_openai_chunks_and_ends_with_done(serve, client, raw, toy):
    sampler = ScriptedSampler(["Hello there", "Again"], renderer=toy)
    gateway = serve(sampler)
    stream = client(gateway, "s").chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)

    assert {c.object for c in chunks} == {"chat.completion.chunk"}
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello there"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == len(sampler.requests[0].prompt_token_ids)

    response = raw(gateway)(
        "POST",
        "/sessions/t/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "stream": True},
    )
    assert response.status == 200
    assert response.headers["content-type"] == "text/event-stream"
    events = response.body.decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    assert all(event.startswith("data: ") for event in events[:-1])


def test_tool_calls_come_back_as_openai_tool_calls_and_the_result_extends(serve, client, toy):
    sampler = ScriptedSampler([CALL_TEXT, "It is 18C in Paris."], renderer=toy)
    gateway = serve(sampler, cumulative=True)
    api = client(gateway, "agent")
    messages = [{"role": "user", "content": "Weather in Paris?"}]

    first = api.chat.completions.create(model="policy", messages=messages, tools=[WEATHER_TOOL])

    assert sampler.requests[0].prompt_token_ids == (
        toy.render(
            [Message(role="user", content="Weather in Paris?")],
            tools=[WEATHER_SPEC],
            add_generation_prompt=True,
        ).token_ids
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert call.id.startswith("call_")

    messages += [
        as_message(choice.message),
        {"role": "tool", "tool_call_id": call.id, "content": "18C"},
    ]
    second = api.chat.completions.create(model="policy", messages=messages, tools=[WEATHER_TOOL])

    assert second.choices[0].message.content == "It is 18C in Paris."
    assert second.choices[0].finish_reason == "stop"
    assert second.model_extra["rllm"]["mode"] == "extend"
    previous = [*sampler.requests[0].prompt_token_ids, *toy.encode(CALL_TEXT), IM_END]
    assert sampler.requests[1].prompt_token_ids[: len(previous)] == previous


def test_streamed_tool_calls_arrive_whole_with_their_index(serve, client, toy):
    gateway = serve(ScriptedSampler([CALL_TEXT], renderer=toy))
    chunks = list(
        client(gateway, "s").chat.completions.create(
            model="policy",
            messages=[{"role": "user", "content": "Weather?"}],
            tools=[WEATHER_TOOL],
            stream=True,
        )
    )
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(tc.index, tc.function.name) for tc in calls] == [(0, "get_weather")]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_a_malformed_tool_call_is_reported_not_returned(serve, client, toy):
    bad = '<tool_call>\n{"name": "get_weather", "arguments": {city}\n</tool_call>'
    gateway = serve(ScriptedSampler([bad], renderer=toy))
    reply = client(gateway, "s").chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "?"}], tools=[WEATHER_TOOL]
    )
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].finish_reason == "stop"
    [dropped] = reply.model_extra["rllm"]["malformed_tool_calls"]
    assert dropped["status"] == "invalid_json"
    assert dropped["raw"] == '{"name": "get_weather", "arguments": {city}'


def test_tool_choice_none_offers_no_tools(serve, client, toy):
    sampler = ScriptedSampler(["ok"], renderer=toy)
    gateway = serve(sampler)
    client(gateway, "s").chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": "hi"}],
        tools=[WEATHER_TOOL],
        tool_choice="none",
    )
    plain = toy.render([Message(role="user", content="hi")], add_generation_prompt=True)
    assert sampler.requests[0].prompt_token_ids == plain.token_ids


def test_logprobs_are_the_samplers_per_token(serve, client, toy):
    gateway = serve(ScriptedSampler(["Hi"], renderer=toy))
    reply = client(gateway, "s").chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "hi"}], logprobs=True
    )
    content = reply.choices[0].logprobs.content
    assert [c.token for c in content] == ["H", "i", "<|im_end|>"]
    assert [c.logprob for c in content] == [
        scripted_logprob(72, 0),
        scripted_logprob(105, 1),
        scripted_logprob(IM_END, 2),
    ]
    assert content[0].bytes == [72]
    assert [c.top_logprobs for c in content] == [[], [], []]


def test_return_token_ids_adds_the_exact_ids(serve, client, toy):
    sampler = ScriptedSampler(["Hi"], renderer=toy)
    gateway = serve(sampler)
    reply = client(gateway, "s").chat.completions.create(
        model="policy",
        messages=[{"role": "user", "content": "hi"}],
        extra_body={"return_token_ids": True},
    )
    assert reply.model_extra["prompt_token_ids"] == sampler.requests[0].prompt_token_ids
    assert reply.choices[0].model_extra["token_ids"] == [72, 105, IM_END]


def test_text_content_parts_render_like_a_string(serve, client, toy):
    sampler = ScriptedSampler(["a", "b"], renderer=toy)
    gateway = serve(sampler)
    api = client(gateway, "s")
    parts = [{"type": "text", "text": "hel"}, {"type": "text", "text": "lo"}]
    api.chat.completions.create(model="policy", messages=[{"role": "user", "content": parts}])
    api.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hello"}])
    assert sampler.requests[0].prompt_token_ids == sampler.requests[1].prompt_token_ids


def test_sampling_fields_reach_the_sampler(serve, client, toy):
    sampler = ScriptedSampler(["a", "b", "c"], renderer=toy)
    gateway = serve(sampler, default_params=SamplingParams(max_tokens=40, temperature=0.7))
    api = client(gateway, "s")
    hi = [{"role": "user", "content": "hi"}]
    api.chat.completions.create(
        model="policy", messages=hi, max_tokens=5, temperature=0.5, top_p=0.9, seed=7
    )
    api.chat.completions.create(
        model="policy", messages=hi, max_tokens=5, max_completion_tokens=9, user="u1"
    )
    client(gateway, "t").chat.completions.create(model="policy", messages=hi)

    stops = (IM_END, 258)
    assert [r.params for r in sampler.requests] == [
        SamplingParams(max_tokens=5, temperature=0.5, top_p=0.9, seed=7, stop_token_ids=stops),
        SamplingParams(max_tokens=9, temperature=0.7, stop_token_ids=stops),
        SamplingParams(max_tokens=40, temperature=0.7, stop_token_ids=stops),
    ]


def test_enforced_session_parameters_override_the_request(serve, client, toy):
    sampler = ScriptedSampler(["abcdefgh"], renderer=toy)
    gateway = serve(sampler)
    gateway.configure_session("locked", enforced=SamplingParams(max_tokens=3, temperature=0.0))
    reply = client(gateway, "locked").chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=100
    )
    assert sampler.requests[0].params == SamplingParams(
        max_tokens=3, temperature=0.0, stop_token_ids=(IM_END, 258)
    )
    assert reply.choices[0].message.content == "abc"
    assert reply.choices[0].finish_reason == "length"


def test_completions_take_text_or_token_ids(serve, client, toy):
    sampler = ScriptedSampler([" there", [7, 8, 9], " streamed"], renderer=toy)
    gateway = serve(sampler)
    api = client(gateway, "c")

    text = api.completions.create(model="policy", prompt="Hello", max_tokens=20, logprobs=0)
    assert sampler.requests[0].prompt_token_ids == toy.encode("Hello")
    assert text.object == "text_completion"
    assert text.choices[0].text == " there"
    assert text.choices[0].finish_reason == "stop"
    ids = [*toy.encode(" there"), IM_END]
    assert text.choices[0].logprobs.token_logprobs == [
        scripted_logprob(t, i) for i, t in enumerate(ids)
    ]
    assert text.choices[0].logprobs.tokens[-1] == "<|im_end|>"
    assert text.usage.prompt_tokens == 5
    assert text.usage.completion_tokens == 7

    by_ids = api.completions.create(model="policy", prompt=[1, 2, 3], max_tokens=20)
    assert sampler.requests[1].prompt_token_ids == [1, 2, 3]
    assert by_ids.choices[0].text == toy.decode([7, 8, 9])
    assert by_ids.choices[0].finish_reason == "length"
    assert by_ids.choices[0].logprobs is None

    chunks = list(api.completions.create(model="policy", prompt="x", stream=True))
    assert "".join(c.choices[0].text for c in chunks) == " streamed"


def test_models_are_listed_globally_and_per_session(serve, client, raw, toy):
    gateway = serve(ScriptedSampler([], renderer=toy), model="my-policy")
    assert [m.id for m in client(gateway, "s").models.list()] == ["my-policy"]
    assert raw(gateway)("GET", "/v1/models").json()["data"][0]["id"] == "my-policy"


def test_sessions_traces_and_delete(serve, client, raw, toy):
    sampler = ScriptedSampler(["one", "two", "three"], renderer=toy)
    gateway = serve(sampler, cumulative=True)
    api = client(gateway, "s1")
    messages = [{"role": "user", "content": "a"}]
    first = api.chat.completions.create(model="policy", messages=messages)
    messages += [as_message(first.choices[0].message), {"role": "user", "content": "b"}]
    api.chat.completions.create(model="policy", messages=messages)
    client(gateway, "s2").chat.completions.create(model="policy", messages=messages[:1])
    http = raw(gateway)

    assert http("GET", "/sessions").json() == {"object": "list", "data": ["s1", "s2"]}
    stats = http("GET", "/sessions/s1").json()
    assert (stats["turns"], stats["lineages"], stats["resets"]) == (2, ["main"], {})

    full = http("GET", "/sessions/s1/traces").json()
    assert full["format"] == "full"
    traces = full["traces"]
    assert [t["turn"] for t in traces] == [0, 1]
    assert [t["prompt_token_ids"] for t in traces] == [
        r.prompt_token_ids for r in sampler.requests[:2]
    ]
    assert traces[0]["completion_token_ids"] == [*toy.encode("one"), IM_END]
    assert [t["chain_complete"] for t in traces] == [True, True]
    assert "prompt_delta_token_ids" not in traces[0]

    chain = http("GET", "/sessions/s1/traces?format=chain").json()["records"]
    assert chain[0]["prompt_delta_token_ids"] == sampler.requests[0].prompt_token_ids
    assert chain[1]["parent_trace_id"] == chain[0]["trace_id"]
    prefix = len(traces[0]["prompt_token_ids"]) + len(traces[0]["completion_token_ids"])
    assert chain[1]["prompt_delta_token_ids"] == sampler.requests[1].prompt_token_ids[prefix:]

    deleted = http("DELETE", "/sessions/s1")
    assert (deleted.status, deleted.json()["deleted"]) == (200, True)
    assert http("GET", "/sessions/s1/traces").status == 404
    assert http("GET", "/sessions").json()["data"] == ["s2"]


def test_many_sessions_at_once_keep_separate_exact_chains(serve, client, raw, toy, store):
    in_flight = {"now": 0, "max": 0}

    async def reply(request):
        in_flight["now"] += 1
        in_flight["max"] = max(in_flight["max"], in_flight["now"])
        await asyncio.sleep(0.02)
        in_flight["now"] -= 1
        return f"reply {len(request.prompt_token_ids)}"

    sampler = ScriptedSampler(reply, renderer=toy)
    gateway = serve(sampler, cumulative=True)

    def conversation(n: int) -> list[str]:
        api = client(gateway, f"session-{n}")
        messages = [{"role": "system", "content": f"agent {n}"}]
        replies = []
        for turn in range(3):
            messages.append({"role": "user", "content": f"turn {turn} of {n}"})
            out = api.chat.completions.create(model="policy", messages=messages)
            messages.append(as_message(out.choices[0].message))
            replies.append(out.model_extra["rllm"]["mode"])
        return replies

    with ThreadPoolExecutor(max_workers=12) as pool:
        modes = list(pool.map(conversation, range(12)))

    assert modes == [["root", "extend", "extend"]] * 12
    assert in_flight["max"] > 1
    received = {r.request_id: r.prompt_token_ids for r in sampler.requests}
    assert len(received) == 36
    for n in range(12):
        traces = store.session(f"session-{n}")
        assert [t.record.turn for t in traces] == [0, 1, 2]
        for trace in traces:
            assert trace.chain_complete
            assert trace.prompt_token_ids == received[trace.record.trace_id]
    metrics = raw(gateway)("GET", "/metrics").json()
    assert metrics["status_counts"]["200"] == 36
    assert metrics["sessions"] == 12


def test_health_needs_no_token_and_reports_load(serve, raw, toy):
    gateway = serve(ScriptedSampler([], renderer=toy))
    health = raw(gateway)("GET", "/health", token=None)
    assert health.status == 200
    data = health.json()
    assert data["status"] == "ok"
    assert data["in_flight"] == 1
    assert set(data["event_loop_lag"]) == {"p50_ms", "p99_ms", "max_ms", "samples"}
    metrics = raw(gateway)("GET", "/metrics").json()
    assert metrics["requests_served"] == 1
    assert metrics["in_flight"] == 1


@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_can_run_on_the_callers_event_loop(stream, toy, store):
    """``astart`` serves on the running loop: a sampler bound to that loop works."""
    import openai
    from rllm_core.gateway.server import Gateway

    async def main() -> str:
        loop = asyncio.get_running_loop()

        async def reply(request):
            assert asyncio.get_running_loop() is loop
            return "same loop"

        async with Gateway(
            renderer=toy, sampler=ScriptedSampler(reply, renderer=toy), trace_store=store
        ) as gateway:
            api = openai.AsyncOpenAI(
                base_url=gateway.session_url("s"), api_key=gateway.token, max_retries=0
            )
            messages = [{"role": "user", "content": "hi"}]
            if stream:
                chunks = await api.chat.completions.create(
                    model="policy", messages=messages, stream=True
                )
                text = "".join(
                    [c.choices[0].delta.content or "" async for c in chunks if c.choices]
                )
            else:
                out = await api.chat.completions.create(model="policy", messages=messages)
                text = out.choices[0].message.content
            await api.close()
            return text

    assert asyncio.run(main()) == "same loop"


def test_an_edited_history_is_reported_as_a_reset_with_its_divergent_message(
    serve, client, raw, toy
):
    gateway = serve(ScriptedSampler(["first", "second"], renderer=toy), cumulative=True)
    api = client(gateway, "edit")
    messages = [SYSTEM, {"role": "user", "content": "original question"}]
    first = api.chat.completions.create(model="policy", messages=messages)
    edited = [
        SYSTEM,
        {"role": "user", "content": "edited question"},
        as_message(first.choices[0].message),
        {"role": "user", "content": "follow-up"},
    ]
    second = api.chat.completions.create(model="policy", messages=edited)

    info = second.model_extra["rllm"]
    assert (info["mode"], info["reset_reason"], info["divergent_message"]) == (
        "reset",
        "history_edited",
        1,
    )
    assert info["history_break"] == {
        "reason": "history_edited",
        "at": 1,
        "kept": 2,
        "dropped": 1,
        "inserted": 1,
        "source": None,
    }
    stats = raw(gateway)("GET", "/sessions/edit").json()
    assert stats["resets"] == {"history_edited": 1}
    assert raw(gateway)("GET", "/metrics").json()["resets"] == {"history_edited": 1}
