"""GLM-4.5/4.6 and GLM-4.7 tool calls: written and read back (typed by the offered tools),
streamed as ``split`` reads them, malformed completions kept as non-``ok`` attempts, and read
as vLLM's ``glm45``/``glm47`` parsers read them."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rllm_core.kit.toolformats import detect, get
from rllm_core.kit.toolformats.glm import GLM45, GLM47
from rllm_core.types import ToolCall, ToolSpec
from toolformats.checks import assert_stream_matches_split, cuts_of
from toolformats.xmlchecks import assert_reads_back, differential, specs, xml_turns

FORMATS = [GLM45, GLM47]
# The format has no escape for its own markers, so no text may hold them.
MARKERS = (
    "<tool_call>",
    "</tool_call>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
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
CALLS = [
    ToolCall(id="call_0", name="read_file", arguments='{"path": "a.txt", "all": true}'),
    ToolCall(id="call_1", name="ls", arguments="{}"),
]


def test_the_registry_gives_these_formats():
    assert get("glm-4.5") is GLM45 and get("glm-4.7") is GLM47
    assert (GLM45.vllm_tool_parser, GLM45.vllm_reasoning_parser) == ("glm45", "glm45")
    assert (GLM47.vllm_tool_parser, GLM47.vllm_reasoning_parser) == ("glm47", "glm47")


def test_glm45_writes_a_tag_a_line_as_its_template_does():
    assert GLM45.write("Looking.", "plan", CALLS) == (
        "<think>plan</think>\nLooking.\n<tool_call>read_file\n<arg_key>path</arg_key>\n"
        "<arg_value>a.txt</arg_value>\n<arg_key>all</arg_key>\n<arg_value>true</arg_value>\n"
        "</tool_call>\n<tool_call>ls\n</tool_call>"
    )


def test_glm47_writes_the_tags_back_to_back_as_its_template_does():
    assert GLM47.write("Looking.", "plan", CALLS) == (
        "<think>plan</think>Looking.<tool_call>read_file<arg_key>path</arg_key>"
        "<arg_value>a.txt</arg_value><arg_key>all</arg_key><arg_value>true</arg_value>"
        "</tool_call><tool_call>ls</tool_call>"
    )


def test_values_are_typed_by_the_offered_tool_and_kept_exactly():
    text = (
        "<tool_call> read_file \n<arg_key> limit </arg_key>\n<arg_value>7</arg_value>"
        "<arg_key>path</arg_key><arg_value> 7\n</arg_value></tool_call>"
    )
    [call] = GLM47.split(text, TOOLS)[2]
    assert call.call.name == "read_file"
    assert json.loads(call.call.arguments) == {"limit": 7, "path": " 7\n"}
    [untyped] = GLM47.split(text)[2]
    assert json.loads(untyped.call.arguments) == {"limit": "7", "path": " 7\n"}


def test_reasoning_the_prompt_opened_ends_at_think_close():
    # GLM-4.7's prompt ends in <think>: its completion starts inside the reasoning.
    assert GLM47.split("plan it</think>Answer.") == ("Answer.", "plan it", [])


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@settings(max_examples=100, deadline=None)
@given(turn=TURNS)
def test_a_written_turn_reads_back(fmt, turn):
    assert_reads_back(fmt, turn)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@settings(max_examples=60, deadline=None)
@given(turn=TURNS, data=st.data())
def test_a_stream_reads_as_split_does(fmt, turn, data):
    text = fmt.write(turn.content, turn.reasoning, turn.calls)
    assert_stream_matches_split(fmt, text, data.draw(cuts_of(len(text))))


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
@settings(max_examples=10, deadline=None)
@given(turn=xml_turns(MARKERS, reasoning=False).filter(lambda t: bool(t.calls)))
def test_a_completion_cut_anywhere_never_raises_and_a_cut_call_is_not_ok(fmt, turn):
    text = fmt.write(turn.content, None, turn.calls)
    for end in range(len(text)):
        _, _, attempts = fmt.split(text[:end], specs(turn))
        done = text[:end].count("</tool_call>")
        assert [a.status for a in attempts[:done]] == ["ok"] * done, text[:end]
        assert all(a.status == "unterminated" for a in attempts[done:]), text[:end]
        stream = fmt.stream(specs(turn))
        stream.feed(text[:end])
        stream.finish()


@pytest.mark.parametrize(
    ("text", "status"),
    [
        ("<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_va", "unterminated"),
        ("<tool_call>read_fi", "unterminated"),
        ("<tool_call>", "unterminated"),
        ("<tool_call>\n<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>", "missing_name"),
        ("<tool_call></tool_call>", "missing_name"),
        (
            "<tool_call>f<arg_key>a</arg_key>stray<arg_value>1</arg_value></tool_call>",
            "invalid_json",
        ),
        ("<tool_call>f<arg_key>a</arg_key></tool_call>", "invalid_json"),
        ("<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value>x</tool_call>", "invalid_json"),
    ],
)
def test_a_malformed_call_is_kept_with_its_status(text, status):
    _, _, attempts = GLM47.split(text, TOOLS)
    assert [a.status for a in attempts] == [status]
    assert attempts[0].raw and (attempts[0].error or status == "unterminated")


def test_a_broken_value_and_an_unknown_function_are_read_as_written():
    # A value its type cannot read stays text, as in vLLM. vLLM drops a call of a function
    # the request does not offer; the format keeps it and the caller judges the name.
    text = "<tool_call>nope<arg_key>limit</arg_key><arg_value>ten</arg_value></tool_call>"
    [unknown] = GLM45.split(text, TOOLS)[2]
    assert unknown.status == "ok" and unknown.call.name == "nope"
    [broken] = GLM45.split(text.replace("nope", "read_file"), TOOLS)[2]
    assert json.loads(broken.call.arguments) == {"limit": "ten"}


def test_detects_each_generation_by_its_layout():
    glm46 = (
        "{{ '\\n<tool_call>' + tc.name }}\n{% for k, v in _args.items() %}\n"
        "<arg_key>{{ k }}</arg_key>\n<arg_value>{{ v }}</arg_value>\n{% endfor %}"
    )
    glm47 = (
        "{{- '<tool_call>' + tc.name -}}{% for k, v in _args.items() %}<arg_key>{{ k }}"
        "</arg_key><arg_value>{{ v }}</arg_value>{% endfor %}</tool_call>"
    )
    assert detect(glm46) == "glm-4.5" and detect(glm47) == "glm-4.7"
    assert not GLM45.detects(glm47) and not GLM47.detects(glm46)
    assert not GLM45.detects("<tool_call>\n<function=f>")


# Differential against vLLM's glm45/glm47 parsers (the same parser in vLLM), with the
# request's tools; a turn without reasoning goes as a prompt without thinking.
@pytest.mark.vllm
@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_vllm_reads_what_we_write_as_we_do(vllm_oracle, fmt):
    assert differential(fmt, vllm_oracle, TURNS) == 500
