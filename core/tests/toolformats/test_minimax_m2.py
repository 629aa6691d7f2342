"""MiniMax-M2 tool calls: written and read back (typed by the offered tools), streamed as
``split`` reads them, malformed completions kept as non-``ok`` attempts, and read as vLLM's
``minimax_m2`` parsers read them."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rllm_core.kit.toolformats import detect, get
from rllm_core.kit.toolformats.minimax_m2 import MINIMAX_M2
from rllm_core.types import ToolCall, ToolSpec
from toolformats.checks import assert_stream_matches_split, cuts_of
from toolformats.xmlchecks import assert_reads_back, differential, specs, xml_turns

FMT = MINIMAX_M2
# The format has no escape for its own markers, so no text may hold them.
MARKERS = (
    "<minimax:tool_call>",
    "</minimax:tool_call>",
    "<invoke name=",
    "</invoke>",
    "<parameter name=",
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
    assert get("minimax-m2") is FMT
    assert (FMT.vllm_tool_parser, FMT.vllm_reasoning_parser) == ("minimax_m2", "minimax_m2")


def test_a_turn_is_written_as_the_template_writes_it():
    calls = [
        ToolCall(id="call_0", name="read_file", arguments='{"path": "a.txt", "all": true}'),
        ToolCall(id="call_1", name="ls", arguments="{}"),
    ]
    assert FMT.write("Looking.", "plan", calls) == (
        "<think>\nplan\n</think>\n\nLooking.\n<minimax:tool_call>\n"
        '<invoke name="read_file">\n<parameter name="path">a.txt</parameter>\n'
        '<parameter name="all">true</parameter>\n</invoke>\n<invoke name="ls">\n</invoke>\n'
        "</minimax:tool_call>"
    )


def test_values_are_typed_by_the_offered_tool_and_names_read_in_any_quotes():
    text = (
        "<minimax:tool_call><invoke name='read_file'><parameter name=limit>7</parameter>"
        '<parameter name="path"> 7\n</parameter></invoke></minimax:tool_call>'
    )
    [call] = FMT.split(text, TOOLS)[2]
    assert call.call.name == "read_file"
    assert json.loads(call.call.arguments) == {"limit": 7, "path": " 7\n"}
    [untyped] = FMT.split(text)[2]
    assert json.loads(untyped.call.arguments) == {"limit": "7", "path": " 7\n"}


def test_reasoning_the_prompt_opened_ends_at_think_close():
    # MiniMax-M2's prompt ends in <think>: its completion starts inside the reasoning.
    assert FMT.split("plan it\n</think>\n\nAnswer.") == ("Answer.", "plan it", [])


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
        done = text[:end].count("</invoke>")
        assert [a.status for a in attempts[:done]] == ["ok"] * done, text[:end]
        assert all(a.status == "unterminated" for a in attempts[done:]), text[:end]
        stream = FMT.stream(specs(turn))
        stream.feed(text[:end])
        stream.finish()


@pytest.mark.parametrize(
    ("text", "status"),
    [
        ('<minimax:tool_call>\n<invoke name="f">\n<parameter name="a">1</par', "unterminated"),
        ('<minimax:tool_call>\n<invoke name="f', "unterminated"),
        ('<invoke name="f">\n<parameter name="a">1</parameter>', "unterminated"),
        ('<minimax:tool_call>\n<invoke name="">\n</invoke>\n', "missing_name"),
        ('<minimax:tool_call>\n{"name": "f"}\n</minimax:tool_call>', "missing_name"),
        ('<minimax:tool_call><invoke name="f">x</invoke></minimax:tool_call>', "invalid_json"),
        ('<invoke name="f"><parameter name="a">1</invoke>', "invalid_json"),
    ],
)
def test_a_malformed_call_is_kept_with_its_status(text, status):
    _, _, attempts = FMT.split(text, TOOLS)
    assert [a.status for a in attempts] == [status]
    assert attempts[0].raw and (attempts[0].error or status == "unterminated")


def test_a_broken_value_and_an_unknown_function_are_read_as_written():
    # A value its type cannot read stays text, as in vLLM. vLLM drops a call of a function
    # the request does not offer; the format keeps it and the caller judges the name.
    text = '<invoke name="nope"><parameter name="limit">ten</parameter></invoke>'
    [unknown] = FMT.split(text, TOOLS)[2]
    assert unknown.status == "ok" and unknown.call.name == "nope"
    [broken] = FMT.split(text.replace("nope", "read_file"), TOOLS)[2]
    assert json.loads(broken.call.arguments) == {"limit": "ten"}


def test_detects_minimax_templates_and_not_others():
    template = (
        "{%- set toolcall_begin_token = '<minimax:tool_call>' -%}"
        "{{- '<invoke name=\"' + tool_call.name + '\">\\n' }}"
    )
    assert FMT.detects(template) and detect(template) == "minimax-m2"
    assert not FMT.detects("<tool_call>\n<function=f>")


# Differential against vLLM's minimax_m2 tool and reasoning parsers, with the request's
# tools. MiniMax-M2 always thinks (its prompt opens the think block and vLLM's reasoning
# parser has no switch), so every turn has reasoning, empty or not.
@pytest.mark.vllm
def test_vllm_reads_what_we_write_as_we_do(vllm_oracle):
    assert differential(FMT, vllm_oracle, xml_turns(MARKERS, always_reasoning=True)) == 500
