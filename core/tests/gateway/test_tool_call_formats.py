"""Tool calls in formats other than Hermes reach the official ``openai`` client through a real
gateway: the ``chatml`` renderer over Qwen2.5's tokenizer, set to ``tool_call_format =
"gpt-oss"`` or ``"qwen3-coder"``, samples the format's own text for known calls, and the
client gets those calls, non-streamed, streamed, and through its stream helper. qwen3-coder
writes argument values as bare text: they arrive typed by the tools the request offered."""

from __future__ import annotations

import json

import pytest
from rllm_core.kit import toolformats
from rllm_core.ports.rendering import ArgumentsDelta
from rllm_core.testing.samplers import ScriptedSampler
from rllm_core.types import SampleRequest, ToolCall, ToolSpec

chatml = pytest.importorskip("rllm_renderer_chatml.renderer")
ChatMLConfig = pytest.importorskip("rllm_renderer_chatml.plugin").ChatMLConfig

FORMATS = ("gpt-oss", "qwen3-coder")

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "options": {"type": "object"}},
            },
        },
    },
]
# "42" is a string by its schema and 20 an integer: only the schema tells them apart in
# qwen3-coder's text.
CALLS = [
    ("read_file", {"path": "42", "limit": 20}),
    ("search", {"query": 'café "ü"', "options": {"depth": 2, "tags": ["a"]}}),
]
# Each format's malformed call, closed with the turn: arguments broken after the name.
MALFORMED = {
    "gpt-oss": "<|start|>assistant<|channel|>commentary to=functions.read_file"
    ' <|constrain|>json<|message|>{"path": <|call|>',
    "qwen3-coder": "<tool_call>\n<function=read_file>\n<parameter=path>\n42\n</parameter>\n"
    "stray\n</function>\n</tool_call>",
}


def _reply(name: str) -> str:
    calls = [
        ToolCall(id=f"call_{n}", name=function, arguments=json.dumps(arguments))
        for n, (function, arguments) in enumerate(CALLS)
    ]
    form = toolformats.get(name)
    return form.write("Looking.", "Files first." if form.vllm_reasoning_parser else None, calls)


@pytest.fixture(scope="module")
def renderers(qwen25_tokenizer_dir) -> dict:
    """The chatml renderer over Qwen2.5's tokenizer for each format, built once."""
    return {
        name: chatml.ChatMLRenderer.from_config(
            ChatMLConfig(tokenizer=str(qwen25_tokenizer_dir), tool_call_format=name)
        )
        for name in FORMATS
    }


@pytest.fixture(params=FORMATS)
def renderer(request, renderers):
    return renderers[request.param]


class DrippingSampler(ScriptedSampler):
    """Streams its scripted completion one token at a time."""

    async def sample_stream(self, request: SampleRequest):
        result = await self.sample(request)
        for token, logprob in zip(result.completion_token_ids, result.logprobs, strict=True):
            yield [token], [logprob]
        yield result


def _ask(api, **options):
    return api.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "Find it."}], tools=TOOLS, **options
    )


def _calls(tool_calls) -> list[tuple[str, dict]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in tool_calls or []]


def _typed(calls: list[tuple[str, dict]]) -> None:
    assert calls == CALLS
    (_, read), _ = calls
    assert type(read["limit"]) is int and type(read["path"]) is str


def test_the_official_client_gets_the_formats_calls(renderer, serve, client):
    text = _reply(renderer.tool_call_format.name)
    gateway = serve(DrippingSampler(lambda _: text, renderer=renderer), renderer=renderer)
    api = client(gateway, "s")

    whole = _ask(api)
    choice = whole.choices[0]
    _typed(_calls(choice.message.tool_calls))
    assert (choice.message.content, choice.finish_reason) == ("Looking.", "tool_calls")
    assert (choice.message.model_extra or {}).get("reasoning_content") == "Files first."

    chunks = list(_ask(api, stream=True))
    deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    starts = [tc for n, tc in enumerate(deltas) if tc.index not in {d.index for d in deltas[:n]}]
    # Each call's first delta is its name, with empty arguments; its arguments follow.
    assert [(tc.index, tc.function.arguments) for tc in starts] == [(0, ""), (1, "")]
    assert [tc.function.name for tc in deltas if tc.function.name] == [n for n, _ in CALLS]
    streamed = [
        (
            start.function.name,
            "".join(tc.function.arguments or "" for tc in deltas if tc.index == start.index),
        )
        for start in starts
    ]
    _typed([(name, json.loads(arguments)) for name, arguments in streamed])
    trace = chunks[0].id.removeprefix("chatcmpl-")
    assert [tc.id for tc in starts] == [f"call_{trace[:12]}_{n}" for n in range(2)]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"

    with api.chat.completions.stream(
        model="policy", messages=[{"role": "user", "content": "Find it."}], tools=TOOLS
    ) as stream:
        final = stream.get_final_completion()
    _typed(_calls(final.choices[0].message.tool_calls))
    assert final.choices[0].message.content == "Looking."


def test_without_the_offered_tools_qwen3_coder_values_stay_text(renderers):
    qwen3_coder = renderers["qwen3-coder"]
    ids = qwen3_coder.encode(_reply("qwen3-coder"))
    bare = qwen3_coder.parse_response(ids).tool_calls[0].call
    assert json.loads(bare.arguments) == {"path": "42", "limit": "20"}
    offered = [
        ToolSpec(name=t["function"]["name"], parameters=t["function"]["parameters"]) for t in TOOLS
    ]
    typed = qwen3_coder.parse_response(ids, tools=offered).tool_calls[0].call
    assert json.loads(typed.arguments) == CALLS[0][1]
    stream = qwen3_coder.tool_call_stream(tools=offered)
    events = stream.feed(_reply("qwen3-coder")) + stream.finish()
    first = "".join(e.text for e in events if isinstance(e, ArgumentsDelta) and e.index == 0)
    assert json.loads(first) == CALLS[0][1]


@pytest.mark.parametrize("name", toolformats.names())
def test_every_format_reads_a_reply_with_the_offered_tools(renderers, name):
    base = renderers["gpt-oss"]
    renderer = chatml.ChatMLRenderer(base.tokenizer, base.template, tool_call_format=name)
    offered = [
        ToolSpec(name=t["function"]["name"], parameters=t["function"]["parameters"]) for t in TOOLS
    ]
    text = _reply(name)
    parsed = renderer.parse_response(renderer.encode(text), tools=offered)
    _typed([(a.call.name, json.loads(a.call.arguments)) for a in parsed.tool_calls if a.call])
    stream = renderer.tool_call_stream(tools=offered)
    events = stream.feed(text) + stream.finish()
    streamed = [
        "".join(e.text for e in events if isinstance(e, ArgumentsDelta) and e.index == n)
        for n in range(len(CALLS))
    ]
    assert [json.loads(arguments) for arguments in streamed] == [a for _, a in CALLS]


def test_a_malformed_call_is_no_call_and_flags_the_trace(renderer, serve, client, store):
    name = renderer.tool_call_format.name
    text = "Looking." + MALFORMED[name]
    (attempt,) = renderer.tool_call_format.split(text)[2]
    assert attempt.status == "invalid_json"
    gateway = serve(ScriptedSampler([text], renderer=renderer), renderer=renderer)
    whole = _ask(client(gateway, "s"))
    choice = whole.choices[0]
    assert not choice.message.tool_calls
    assert choice.finish_reason == "stop"
    (malformed,) = whole.model_extra["rllm"]["malformed_tool_calls"]
    assert malformed["status"] == "invalid_json"
    (record,) = store.chain("s")
    assert "tool_call_invalid" in record.flags
