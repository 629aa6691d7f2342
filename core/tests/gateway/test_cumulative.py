"""Acceptance: an ``openai``-client agent in cumulative token mode. Every turn's stored prompt is
the previous prompt + completion + its delta, and the prompts rebuilt from the trace store (read
over HTTP) are exactly what the sampler received.

Runs with the toy renderer always, and with the real ``chatml`` renderer over the Qwen2.5
tokenizer (its template has tools) when that plugin is installed.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
from rllm_core.errors import UnknownComponentError
from rllm_core.plugins.manager import PluginManager
from rllm_core.ports import Renderer
from rllm_core.testing.samplers import ScriptedSampler
from rllm_core.types import Message, SampleRequest, ToolCall, ToolSpec

TOOL = {
    "type": "function",
    "function": {
        "name": "run",
        "description": "Run a shell command",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    },
}
TOOL_SPEC = ToolSpec(
    name="run",
    description="Run a shell command",
    parameters={"type": "object", "properties": {"cmd": {"type": "string"}}},
)


@pytest.fixture(params=["toy", "chatml-qwen2.5"])
def renderer(request, toy) -> Renderer:
    if request.param == "toy":
        return toy
    try:
        spec = PluginManager(strict=False).get("renderer", "chatml")
    except UnknownComponentError:
        pytest.skip("rllm-renderer-chatml is not installed")
    folder = request.getfixturevalue("qwen25_tokenizer_dir")
    return spec.build({"tokenizer": str(folder)})


def sampled(renderer: Renderer, history: Sequence[Message], reply: Message) -> list[int]:
    """The ids a model would sample to produce ``reply`` after ``history``: the rendered reply,
    through its first stop token."""
    prompt = renderer.render(history, tools=[TOOL_SPEC], add_generation_prompt=True).token_ids
    full = renderer.render([*history, reply], tools=[TOOL_SPEC]).token_ids
    assert full[: len(prompt)] == prompt, "the template must put the reply after the prompt"
    body = full[len(prompt) :]
    stops = set(renderer.stop_token_ids())
    end = next(i for i, t in enumerate(body) if t in stops)
    return body[: end + 1]


def test_every_turn_extends_the_last_and_the_store_rebuilds_what_was_sampled(
    serve, client, raw, renderer
):
    user = Message(role="user", content="List the files, then summarise them. ünïcödé ✓")
    call = Message(
        role="assistant",
        content="",
        tool_calls=(ToolCall(id="x", name="run", arguments='{"cmd": "ls"}'),),
    )
    call_ids = sampled(renderer, [user], call)
    long_text = "The folder holds three files: a README, a setup script and a test. " * 3

    def reply(request: SampleRequest):
        turn = len(sampler.requests) - 1
        if turn == 0:
            return call_ids
        if turn == 2:
            return renderer.encode(long_text)  # no stop token: cut by max_tokens
        return f"Reply number {turn}."

    sampler = ScriptedSampler(reply, renderer=renderer)
    gateway = serve(sampler, renderer=renderer, cumulative=True)
    api = client(gateway, "agent-1")

    messages: list[dict] = [{"role": "user", "content": user.content}]
    first = api.chat.completions.create(model="policy", messages=messages, tools=[TOOL])
    [tool_call] = first.choices[0].message.tool_calls
    assert first.choices[0].finish_reason == "tool_calls"
    assert (tool_call.function.name, json.loads(tool_call.function.arguments)) == (
        "run",
        {"cmd": "ls"},
    )
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": tool_call.id, "content": "README\nsetup.sh"})

    second = api.chat.completions.create(model="policy", messages=messages, tools=[TOOL])
    messages.append(second.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "user", "content": "Now describe them at length."})

    truncated = api.chat.completions.create(
        model="policy", messages=messages, tools=[TOOL], max_tokens=12
    )
    assert truncated.choices[0].finish_reason == "length"
    messages.append(truncated.choices[0].message.model_dump(exclude_none=True))
    messages.append({"role": "user", "content": "Go on."})

    chunks = api.chat.completions.create(
        model="policy", messages=messages, tools=[TOOL], stream=True
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == "Reply number 3."
    messages.append({"role": "assistant", "content": streamed})
    messages.append({"role": "user", "content": "Thanks."})
    last = api.chat.completions.create(model="policy", messages=messages, tools=[TOOL])
    assert last.model_extra["rllm"]["mode"] == "extend"

    http = raw(gateway)
    traces = http("GET", "/sessions/agent-1/traces").json()["traces"]
    chain = http("GET", "/sessions/agent-1/traces?format=chain").json()["records"]
    assert [t["turn"] for t in traces] == [0, 1, 2, 3, 4]
    assert [t["reset_reason"] for t in traces] == [None] * 5
    assert all(t["chain_complete"] for t in traces)
    assert [t["finish_reason"] for t in traces] == ["stop", "stop", "length", "stop", "stop"]

    # The delta-chain contract, turn by turn.
    assert chain[0]["parent_trace_id"] is None
    assert chain[0]["prompt_delta_token_ids"] == traces[0]["prompt_token_ids"]
    for k in range(1, 5):
        assert chain[k]["parent_trace_id"] == chain[k - 1]["trace_id"]
        assert traces[k]["prompt_token_ids"] == (
            traces[k - 1]["prompt_token_ids"]
            + traces[k - 1]["completion_token_ids"]
            + chain[k]["prompt_delta_token_ids"]
        )

    # The rebuilt prompts and the completions are exactly what the sampler saw and produced.
    assert [t["trace_id"] for t in traces] == [r.request_id for r in sampler.requests]
    assert [t["prompt_token_ids"] for t in traces] == [r.prompt_token_ids for r in sampler.requests]
    assert traces[0]["completion_token_ids"] == call_ids
    assert traces[2]["completion_token_ids"] == renderer.encode(long_text)[:12]

    # The first prompt is the template's render of the first request, token for token.
    assert traces[0]["prompt_token_ids"] == (
        renderer.render([user], tools=[TOOL_SPEC], add_generation_prompt=True).token_ids
    )
