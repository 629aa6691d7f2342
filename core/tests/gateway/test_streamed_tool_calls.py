"""Tool calls streamed as vLLM streams them, for a renderer that reads them while a reply is
sampled (``StreamsToolCalls``): each call's id and name first, then its arguments as they
arrive; the official ``openai`` client puts them back together, streamed or not. Without such
a renderer they go out whole at the end (test_chat.py); a malformed attempt flags the trace."""

from __future__ import annotations

import json
from collections.abc import Sequence

from reference.toy_renderer import ToyChatRenderer
from rllm_core.gateway import protocol
from rllm_core.kit.completions import parse_completion
from rllm_core.kit.toolformats.hermes import HERMES
from rllm_core.ports.rendering import StreamsToolCalls, ToolCallStream
from rllm_core.testing.samplers import ScriptedSampler
from rllm_core.types import ParsedResponse, SampleRequest

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
        },
    }
    for name in ("read_file", "list_dir")
]
REPLY = (
    "<think>\nThe notes first.\n</think>\n\nLet me look.\n"
    '<tool_call>\n{"name": "read_file", "arguments": {"path": "notes \\"ü\\".txt", "n": [1, {}]}}\n'
    '</tool_call>\n<tool_call>\n{"name": "list_dir", "arguments": {}}\n</tool_call>'
)


class HermesToy(ToyChatRenderer):
    """The toy template, read as the Hermes format reads it, streaming its tool calls."""

    def parse_response(self, token_ids: Sequence[int], tools=None) -> ParsedResponse:
        return parse_completion(token_ids, self.stop_token_ids(), self.decode, HERMES.split)

    def tool_call_stream(self, tools=None) -> ToolCallStream:
        return HERMES.stream()


class DrippingSampler(ScriptedSampler):
    """Streams its scripted completion one token at a time."""

    async def sample_stream(self, request: SampleRequest):
        result = await self.sample(request)
        for token, logprob in zip(result.completion_token_ids, result.logprobs, strict=True):
            yield [token], [logprob]
        yield result


def _ask(client, gateway, question="Notes?", **options):
    return client(gateway, "s").chat.completions.create(
        model="policy", messages=[{"role": "user", "content": question}], tools=TOOLS, **options
    )


def test_a_streamed_call_sends_its_name_first_then_its_arguments(serve, client, store, monkeypatch):
    # Every token earns a re-parse however long one took on a loaded machine, so the
    # arguments stream in as many pieces as the reply allows.
    monkeypatch.setattr(protocol, "PARSE_BUDGET_S", 1.0)
    renderer = HermesToy()
    assert isinstance(renderer, StreamsToolCalls)
    gateway = serve(DrippingSampler([REPLY, REPLY], renderer=renderer), renderer=renderer)
    whole = _ask(client, gateway)
    chunks = list(_ask(client, gateway, "Notes again?", stream=True))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [tc for d in deltas for tc in d.tool_calls or []]
    first = calls[0]
    assert (first.index, first.type, first.function.name, first.function.arguments) == (
        0,
        "function",
        "read_file",
        "",
    )
    assert first.id.startswith("call_")
    # The arguments came in several pieces, each after the call's name.
    pieces = [tc.function.arguments for tc in calls if tc.index == 0 and tc.function.arguments]
    assert len(pieces) > 3
    assert json.loads("".join(pieces)) == {"path": 'notes "ü".txt', "n": [1, {}]}
    assert "".join(d.content or "" for d in deltas) == "Let me look."
    reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert reasoning == "The notes first."
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    # Streamed or not, the client sees the same calls (ids are per trace).
    message = whole.choices[0].message
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("read_file", {"path": 'notes "ü".txt', "n": [1, {}]}),
        ("list_dir", {}),
    ]


def test_the_clients_stream_helper_accumulates_the_calls(serve, client):
    renderer = HermesToy()
    gateway = serve(DrippingSampler([REPLY], renderer=renderer), renderer=renderer)
    with client(gateway, "s").chat.completions.stream(
        model="policy", messages=[{"role": "user", "content": "Notes?"}], tools=TOOLS
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    message = final.choices[0].message
    assert message.content == "Let me look."
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
        ("read_file", {"path": 'notes "ü".txt', "n": [1, {}]}),
        ("list_dir", {}),
    ]
    assert [c.id for c in message.tool_calls] == [
        f"call_{final.id.removeprefix('chatcmpl-')[:12]}_{n}" for n in range(2)
    ]


def test_a_malformed_attempt_flags_the_trace_tool_call_invalid(serve, client, store):
    renderer = HermesToy()
    cut = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a'
    gateway = serve(DrippingSampler([cut, REPLY], renderer=renderer), renderer=renderer)
    chunks = list(_ask(client, gateway, stream=True))
    calls = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    # The call had started when the completion was cut; the reply holds no call.
    assert [tc.function.name for tc in calls if tc.function.name] == ["read_file"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] != "tool_calls"
    _ask(client, gateway, "Other notes?")
    flags = [r.flags for r in sorted(store.chain("s"), key=lambda r: r.created_at)]
    assert ["tool_call_invalid" in f for f in flags] == [True, False]
