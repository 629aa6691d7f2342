"""Llama 3 JSON tool calls: written and read back, streamed as ``split`` reads them,
malformed completions kept as non-``ok`` attempts, and read as vLLM's ``llama3_json`` does."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rllm_core.kit.toolformats import detect, get
from rllm_core.kit.toolformats.llama3_json import LLAMA3_JSON, PYTHON_TAG
from rllm_core.types import ToolCall
from toolformats.checks import (
    assert_reads_back,
    assert_stream_matches_split,
    cuts_of,
    oracle_view,
    our_view,
)
from toolformats.strategies import disagreements, generate, texts, turns

FMT = LLAMA3_JSON
# Text before the calls must not itself open a call.
CONTENT = texts(forbidden=('"name"', PYTHON_TAG))
TURNS = turns(reasoning=False, content=CONTENT)


def test_the_registry_gives_this_format():
    assert get("llama3-json") is FMT
    assert (FMT.vllm_tool_parser, FMT.vllm_reasoning_parser) == ("llama3_json", None)


def test_a_call_is_written_as_the_template_writes_it():
    calls = [
        ToolCall(id="call_0", name="read_file", arguments='{"path": "a.txt"}'),
        ToolCall(id="call_1", name="ls", arguments="{}"),
    ]
    assert FMT.write("", None, calls) == (
        '{"name": "read_file", "parameters": {"path": "a.txt"}}; {"name": "ls", "parameters": {}}'
    )


def test_python_tag_arguments_key_and_text_around_are_read():
    text = 'Looking.<|python_tag|>{"name": "f", "arguments": {"a": [1, "}"]}}\n\nDone.'
    content, reasoning, [attempt] = FMT.split(text)
    assert (content, reasoning) == ("Looking.\nDone.", None)
    assert attempt.status == "ok"
    assert attempt.call == ToolCall(id="call_0", name="f", arguments='{"a": [1, "}"]}')


@settings(max_examples=150, deadline=None)
@given(TURNS)
def test_a_written_turn_reads_back(turn):
    assert_reads_back(FMT, turn.content, None, turn.calls)


@settings(max_examples=100, deadline=None)
@given(TURNS, texts(forbidden=('"name"', PYTHON_TAG, ";")), st.data())
def test_a_stream_reads_as_split_does(turn, after, data):
    text = FMT.write(turn.content, None, turn.calls) + (after if turn.calls else "")
    assert_stream_matches_split(FMT, text, data.draw(cuts_of(len(text))))


@settings(max_examples=30, deadline=None)
@given(turns(reasoning=False, content=CONTENT, min_calls=1))
def test_a_completion_cut_anywhere_never_raises_and_a_cut_call_is_not_ok(turn):
    text = FMT.write(turn.content, None, turn.calls)
    for end in range(len(turn.content), len(text)):
        FMT.split(text[:end])
        stream = FMT.stream()
        stream.feed(text[:end])
        stream.finish()
    _, _, attempts = FMT.split(text[:-1])
    assert [a.status for a in attempts] == ["ok"] * (len(turn.calls) - 1) + ["unterminated"]
    assert attempts[-1].raw == text[:-1].rpartition("; ")[2].strip() or len(turn.calls) == 1


@pytest.mark.parametrize(
    ("text", "status"),
    [
        ('{"name": "f", "parameters": {"a": 1,}}', "invalid_json"),
        ('{"name": "f", "parameters": {"a": ', "unterminated"),
        ('{"name": "f", "parameters": [1]}', "invalid_json"),
        ('{"name": "", "parameters": {}}', "missing_name"),
        ('{"name": 7, "parameters": {}}', "missing_name"),
        ('<|python_tag|>brave_search.call(query="x")', "invalid_json"),
        ("<|python_tag|>", "unterminated"),
    ],
)
def test_a_malformed_call_is_kept_with_its_status(text, status):
    _, _, attempts = FMT.split(text)
    assert [a.status for a in attempts] == [status]
    assert attempts[0].error


def test_a_call_of_a_function_no_tool_offers_is_read_as_written():
    # The format does not know the offered tools; the caller judges the name.
    _, _, [attempt] = FMT.split('{"name": "no_such_tool", "parameters": {}}')
    assert attempt.status == "ok" and attempt.call.name == "no_such_tool"


def test_detects_llama3_templates_and_not_others():
    assert FMT.detects("{{- '<|python_tag|>' + tool_call.name + '.call(' }}")
    assert not FMT.detects("<|im_start|>assistant\n<tool_call>")
    assert detect("<|start_header_id|>ipython<|end_header_id|> <|python_tag|>") == "llama3-json"


def test_writing_reasoning_or_non_object_arguments_is_refused():
    with pytest.raises(ValueError, match="reasoning"):
        FMT.write("", "thought", [])
    with pytest.raises(ValueError, match="not a JSON object"):
        FMT.write("", None, [ToolCall(id="call_0", name="f", arguments="[1]")])


# Differential against vLLM's llama3_json parser. Where vLLM reads differently by design
# (docs/gateway.md lists these): it returns no content beside calls (llama_tool_parser.py,
# extract_tool_calls: content=None), and it decodes every "{" in the text, so text holding a
# "{" that opens no JSON object makes it read no calls at all. The differential content
# therefore holds no "{", and content is compared only for turns without calls.
ORACLE_TURNS = turns(reasoning=False, content=texts(forbidden=("{", PYTHON_TAG)))


def offered(examples):
    """Every tool the examples offer, once by name: one request carries them all."""
    return list({t.name: t.openai() for turn in examples for t in turn.tools}.values())


@pytest.mark.vllm
def test_vllm_reads_what_we_write_as_we_do(vllm_oracle):
    examples = generate(ORACLE_TURNS, 500)
    texts_ = [FMT.write(t.content, None, t.calls) for t in examples]
    results = vllm_oracle.parse("llama3_json", texts_, offered(examples))

    def check(pair):
        text, result = pair
        theirs, ours = oracle_view(result), our_view(FMT, text)
        assert theirs["calls"] == ours["calls"], (theirs, ours)
        if not ours["calls"]:
            assert theirs["content"] == ours["content"], (theirs, ours)

    assert disagreements(list(zip(texts_, results, strict=True)), check) == []
    assert sum(bool(t.calls) for t in examples) > 300
