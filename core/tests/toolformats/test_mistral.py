"""Mistral tool calls and reasoning: written and read back, streamed as ``split`` reads them,
malformed completions kept as non-``ok`` attempts, and read as vLLM's ``mistral`` tool and
reasoning parsers do."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rllm_core.kit.toolformats import detect, get
from rllm_core.kit.toolformats.mistral import (
    ARGS,
    CALL_ID,
    MISTRAL,
    THINK_END,
    THINK_START,
    TOOL_CALLS,
)
from rllm_core.types import ToolCall
from toolformats.checks import (
    assert_reads_back,
    assert_stream_matches_split,
    cuts_of,
    oracle_view,
    our_view,
)
from toolformats.strategies import disagreements, generate, texts, turns

FMT = MISTRAL
MARKERS = (TOOL_CALLS, ARGS, CALL_ID, THINK_START, THINK_END)
TURNS = turns(forbidden=MARKERS)


def test_the_registry_gives_this_format():
    assert get("mistral") is FMT
    assert (FMT.vllm_tool_parser, FMT.vllm_reasoning_parser) == ("mistral", "mistral")


def test_a_turn_is_written_as_v13_tokenizers_write_it():
    calls = [
        ToolCall(id="call_0", name="read_file", arguments='{"path": "a.txt"}'),
        ToolCall(id="call_1", name="ls", arguments="{}"),
    ]
    assert FMT.write("Reading.", "small file", calls) == (
        '[THINK]small file[/THINK]Reading.[TOOL_CALLS]read_file[ARGS]{"path": "a.txt"}'
        "[TOOL_CALLS]ls[ARGS]{}"
    )


@pytest.mark.parametrize(
    "text",
    [
        '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]',
        '[TOOL_CALLS] {"name": "f", "arguments": {"a": 1}}[TOOL_CALLS]g[ARGS]{}',
        '[TOOL_CALLS]f[CALL_ID]a1b2c3d4e[ARGS]{"a": 1}[TOOL_CALLS]g{}',
    ],
)
def test_older_tokenizers_syntaxes_are_read(text):
    content, reasoning, attempts = FMT.split(text)
    assert (content, reasoning) == ("", None)
    assert [(a.status, a.call.name) for a in attempts] == [("ok", "f"), ("ok", "g")]
    assert [a.call.arguments.replace(" ", "") for a in attempts] == ['{"a":1}', "{}"]


def test_text_after_a_call_is_added_to_the_content():
    content, _, [attempt] = FMT.split('Sure.[TOOL_CALLS]f[ARGS]{"a": 1}\nDone.')
    assert content == "Sure.\nDone."
    assert attempt.call.arguments == '{"a": 1}'


@settings(max_examples=150, deadline=None)
@given(TURNS)
def test_a_written_turn_reads_back(turn):
    assert_reads_back(FMT, turn.content, turn.reasoning, turn.calls)


@settings(max_examples=100, deadline=None)
@given(TURNS, texts(forbidden=MARKERS), st.data())
def test_a_stream_reads_as_split_does(turn, after, data):
    text = FMT.write(turn.content, turn.reasoning, turn.calls) + (after if turn.calls else "")
    assert_stream_matches_split(FMT, text, data.draw(cuts_of(len(text))))


@settings(max_examples=30, deadline=None)
@given(turns(forbidden=MARKERS, min_calls=1))
def test_a_completion_cut_anywhere_never_raises_and_a_cut_call_is_unterminated(turn):
    text = FMT.write(turn.content, turn.reasoning, turn.calls)
    for end in range(len(text)):
        FMT.split(text[:end])
        stream = FMT.stream()
        stream.feed(text[:end])
        stream.finish()
    _, _, attempts = FMT.split(text[:-1])
    assert [a.status for a in attempts] == ["ok"] * (len(turn.calls) - 1) + ["unterminated"]


@pytest.mark.parametrize(
    ("text", "status"),
    [
        ('[TOOL_CALLS]f[ARGS]{"a": 1,}', "invalid_json"),
        ("[TOOL_CALLS]f[ARGS][1, 2]", "invalid_json"),
        ("[TOOL_CALLS]f[ARGS]null", "invalid_json"),
        ('[TOOL_CALLS]f[ARGS]{"a": ', "unterminated"),
        ("[TOOL_CALLS]read_fi", "unterminated"),
        ("[TOOL_CALLS]", "unterminated"),
        ("[TOOL_CALLS][ARGS]{}", "missing_name"),
        ('[TOOL_CALLS][{"arguments": {}}]', "missing_name"),
        ('[TOOL_CALLS][{"name": "f", "arguments": {', "unterminated"),
        ("[TOOL_CALLS]f[CALL_ID]abc", "unterminated"),
    ],
)
def test_a_malformed_call_is_kept_with_its_status(text, status):
    _, _, attempts = FMT.split(text)
    assert [a.status for a in attempts] == [status]
    assert attempts[0].error


def test_a_call_of_a_function_no_tool_offers_is_read_as_written():
    _, _, [attempt] = FMT.split("[TOOL_CALLS]no_such_tool[ARGS]{}")
    assert attempt.status == "ok" and attempt.call.name == "no_such_tool"


def test_reasoning_cut_off_before_its_close_is_all_reasoning():
    assert FMT.split("[THINK]still thinking") == ("", "still thinking", [])


def test_detects_mistral_templates():
    assert detect("{{- '[TOOL_CALLS]' + tool_call.name + '[ARGS]' }}") == "mistral"
    assert not FMT.detects("<|im_start|>assistant")


def test_a_name_the_syntax_cannot_frame_is_refused_on_writing():
    with pytest.raises(ValueError, match="'my tool'"):
        FMT.write("", None, [ToolCall(id="c", name="my tool", arguments="{}")])


# Differential against vLLM's mistral parsers with a v13 vocabulary ([ARGS] and [THINK] are
# special tokens). vLLM strips trailing whitespace from reasoning and drops reasoning that is
# then empty (parser/mistral.py, strip_trailing_reasoning_whitespace=True), and strips the
# content beside calls (parser/engine/parser_engine.py, _strip_content_whitespace); the
# comparison does the same to ours. It drops text after a call's arguments (parser/mistral.py,
# _extract_args_json), which write never puts there (docs/gateway.md lists it).
def offered(examples):
    """Every tool the examples offer, once by name: one request carries them all."""
    return list({t.name: t.openai() for turn in examples for t in turn.tools}.values())


@pytest.mark.vllm
def test_vllm_reads_what_we_write_as_we_do(vllm_oracle):
    examples = generate(TURNS, 500)
    written = [FMT.write(t.content, t.reasoning, t.calls) for t in examples]
    results = vllm_oracle.parse("mistral", written, offered(examples), reasoning_parser="mistral")

    def check(pair):
        text, result = pair
        ours = our_view(FMT, text)
        ours["reasoning"] = (ours["reasoning"] or "").rstrip() or None
        if ours["calls"]:
            ours["content"] = ours["content"].strip()
        assert oracle_view(result) == ours

    assert disagreements(list(zip(written, results, strict=True)), check) == []
    assert sum(bool(t.calls) for t in examples) > 300
    assert sum(t.reasoning is not None for t in examples) > 100
