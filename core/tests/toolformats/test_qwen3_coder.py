"""Qwen3-Coder / Qwen3.5 XML tool calls: written and read back (typed by the offered tools),
streamed as ``split`` reads them, malformed completions kept as non-``ok`` attempts, and read
as vLLM's ``qwen3_coder`` and ``qwen3`` parsers read them."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rllm_core.kit.toolformats import detect, get
from rllm_core.kit.toolformats.qwen3_coder import QWEN3_CODER
from rllm_core.types import ToolCall, ToolSpec
from toolformats.checks import assert_stream_matches_split, cuts_of
from toolformats.xmlchecks import assert_reads_back, differential, specs, xml_turns

FMT = QWEN3_CODER
# The format has no escape for its own markers, so no text may hold them.
MARKERS = (
    "<tool_call>",
    "</tool_call>",
    "<function=",
    "</function>",
    "<parameter=",
    "</parameter>",
    "<think>",
    "</think>",
)
TURNS = xml_turns(MARKERS)
TOOLS = [
    ToolSpec(
        name="read_file",
        parameters={
            "type": "object",
            "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
        },
    )
]


def test_the_registry_gives_this_format():
    assert get("qwen3-coder") is FMT
    assert (FMT.vllm_tool_parser, FMT.vllm_reasoning_parser) == ("qwen3_coder", "qwen3")


def test_a_turn_is_written_as_the_qwen35_template_writes_it():
    calls = [
        ToolCall(id="call_0", name="read_file", arguments='{"path": "a.txt", "all": true}'),
        ToolCall(id="call_1", name="ls", arguments="{}"),
    ]
    assert FMT.write("Looking.", "plan", calls) == (
        "<think>\nplan\n</think>\n\nLooking.\n\n<tool_call>\n<function=read_file>\n"
        "<parameter=path>\na.txt\n</parameter>\n<parameter=all>\nTrue\n</parameter>\n"
        "</function>\n</tool_call>\n<tool_call>\n<function=ls>\n</function>\n</tool_call>"
    )


def test_values_are_typed_by_the_offered_tool_and_strings_without_it():
    text = (
        "<tool_call>\n<function=read_file>\n<parameter=path>\n7\n</parameter>\n"
        "<parameter=limit>\n7\n</parameter>\n<parameter=other>\n7\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    [typed] = FMT.split(text, TOOLS)[2]
    assert json.loads(typed.call.arguments) == {"path": "7", "limit": 7, "other": "7"}
    [untyped] = FMT.split(text)[2]
    assert json.loads(untyped.call.arguments) == {"path": "7", "limit": "7", "other": "7"}


def test_a_function_block_without_tool_call_and_a_missing_close_are_read():
    # vLLM reads both: Qwen3-Coder models sometimes leave out the wrapper.
    text = "Go.\n<function=ls>\n<parameter=dir>\n/\n</parameter>\n</function>\nDone."
    content, reasoning, [attempt] = FMT.split(text)
    assert (content, reasoning, attempt.status) == ("Go.\n\nDone.", None, "ok")
    assert attempt.call == ToolCall(id="call_0", name="ls", arguments='{"dir": "/"}')


def test_reasoning_the_prompt_opened_ends_at_think_close():
    content, reasoning, calls = FMT.split("plan it\n</think>\n\nAnswer.")
    assert (content, reasoning, calls) == ("Answer.", "plan it", [])


@settings(max_examples=150, deadline=None)
@given(TURNS)
def test_a_written_turn_reads_back(turn):
    assert_reads_back(FMT, turn)


@settings(max_examples=100, deadline=None)
@given(TURNS, st.data())
def test_a_stream_reads_as_split_does(turn, data):
    text = FMT.write(turn.content, turn.reasoning, turn.calls)
    assert_stream_matches_split(FMT, text, data.draw(cuts_of(len(text))))


@settings(max_examples=15, deadline=None)
@given(xml_turns(MARKERS, reasoning=False).filter(lambda t: bool(t.calls)))
def test_a_completion_cut_anywhere_never_raises_and_a_cut_call_is_not_ok(turn):
    text = FMT.write(turn.content, None, turn.calls)
    for end in range(len(text)):
        _, _, attempts = FMT.split(text[:end], specs(turn))
        done = text[:end].count("</function>")
        assert [a.status for a in attempts[:done]] == ["ok"] * done, text[:end]
        assert all(a.status == "unterminated" for a in attempts[done:]), text[:end]
        stream = FMT.stream(specs(turn))
        stream.feed(text[:end])
        stream.finish()


@pytest.mark.parametrize(
    ("text", "status"),
    [
        ("<tool_call>\n<function=f>\n<parameter=a>\n1\n</para", "unterminated"),
        ("<tool_call>\n<function=f", "unterminated"),
        ("<tool_call>\n", "unterminated"),
        ('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', "missing_name"),
        ("<tool_call>\n<function=>\n</function>\n</tool_call>", "missing_name"),
        ("<tool_call>\n<function=f>\nstray\n</function>\n</tool_call>", "invalid_json"),
        ("<tool_call>\n<function=f>\n<parameter=a>\n1\n</function>", "invalid_json"),
    ],
)
def test_a_malformed_call_is_kept_with_its_status(text, status):
    _, _, attempts = FMT.split(text, TOOLS)
    assert [a.status for a in attempts] == [status]
    assert attempts[0].raw or status == "unterminated"
    assert attempts[0].error or status == "unterminated"


def test_a_broken_value_and_an_unknown_function_are_read_as_written():
    # As in vLLM: a value its type cannot read stays text, and the caller judges the name.
    text = "<tool_call>\n<function=nope>\n<parameter=limit>\nten\n</parameter>\n</function>"
    [unknown] = FMT.split(text, TOOLS)[2]
    assert unknown.status == "ok" and unknown.call.name == "nope"
    [broken] = FMT.split(text.replace("nope", "read_file"), TOOLS)[2]
    assert json.loads(broken.call.arguments) == {"limit": "ten"}


def test_detects_qwen3_coder_templates_and_not_others():
    template = "{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}{{- '<parameter=' }}"
    assert FMT.detects(template) and detect(template) == "qwen3-coder"
    assert not FMT.detects('<tool_call>\n{"name": <function-name>}\n</tool_call>')


# Differential against vLLM's qwen3_coder tool parser and qwen3 reasoning parser, with the
# request's tools. A turn without reasoning goes as a prompt without thinking
# (enable_thinking=False), where vLLM reads no reasoning; with thinking on it reads the text
# before a call as reasoning, which a prompt that opened the think block means.
@pytest.mark.vllm
def test_vllm_reads_what_we_write_as_we_do(vllm_oracle):
    assert differential(FMT, vllm_oracle, TURNS) == 500
