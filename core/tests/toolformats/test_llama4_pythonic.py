"""Llama 4 pythonic tool calls: written and read back, streamed as ``split`` reads them,
malformed completions kept as non-``ok`` attempts, and read as vLLM's ``llama4_pythonic``
parser does."""

from __future__ import annotations

import keyword
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rllm_core.kit.toolformats import detect, get
from rllm_core.kit.toolformats.llama4_pythonic import LLAMA4_PYTHONIC, PYTHON_START
from rllm_core.types import ToolCall
from toolformats.checks import (
    assert_reads_back,
    assert_stream_matches_split,
    cuts_of,
    oracle_view,
    our_view,
)
from toolformats.strategies import disagreements, generate, texts, turns

FMT = LLAMA4_PYTHONIC
CALL_START = re.compile(r"\[\s*[^\W\d]\w*\s*\(")


def _writable(turn) -> bool:
    """Tool and argument names this syntax can write: Python identifiers, not keywords."""
    names = [t.name for t in turn.tools] + [p for t in turn.tools for p in t.parameters]
    return not any(keyword.iskeyword(n) for n in names)


CONTENT = texts(forbidden=(PYTHON_START,)).filter(lambda text: not CALL_START.search(text + "("))
TURNS = turns(reasoning=False, content=CONTENT).filter(_writable)


def test_the_registry_gives_this_format():
    assert get("llama4-pythonic") is FMT
    assert (FMT.vllm_tool_parser, FMT.vllm_reasoning_parser) == ("llama4_pythonic", None)


def test_calls_are_written_as_a_python_list_of_literals():
    calls = [
        ToolCall(
            id="call_0", name="search", arguments='{"q": "a\\"b", "n": -3, "x": [true, null]}'
        ),
        ToolCall(id="call_1", name="ls", arguments="{}"),
    ]
    assert FMT.write("", None, calls) == '[search(q="a\\"b", n=-3, x=[True, None]), ls()]'


def test_python_start_python_literals_and_text_around_are_read():
    text = (
        "Checking.<|python_start|>[f(a='x', b=(1, 2.5), c=False, d={'k': None})]<|python_end|> ok"
    )
    content, reasoning, [attempt] = FMT.split(text)
    assert (content, reasoning) == ("Checking.\nok", None)
    assert attempt.call == ToolCall(
        id="call_0", name="f", arguments='{"a": "x", "b": [1, 2.5], "c": false, "d": {"k": null}}'
    )


@settings(max_examples=150, deadline=None)
@given(TURNS)
def test_a_written_turn_reads_back_as_json_values(turn):
    assert_reads_back(FMT, turn.content, None, turn.calls)


@settings(max_examples=100, deadline=None)
@given(TURNS, texts(forbidden=(PYTHON_START,)), st.data())
def test_a_stream_reads_as_split_does(turn, after, data):
    text = FMT.write(turn.content, None, turn.calls) + (after if turn.calls else "")
    assert_stream_matches_split(FMT, text, data.draw(cuts_of(len(text))))


@settings(max_examples=30, deadline=None)
@given(turns(reasoning=False, content=CONTENT, min_calls=1).filter(_writable))
def test_a_completion_cut_anywhere_never_raises_and_a_cut_list_is_unterminated(turn):
    text = FMT.write(turn.content, None, turn.calls)
    for end in range(len(turn.content), len(text)):
        FMT.split(text[:end])
        stream = FMT.stream()
        stream.feed(text[:end])
        stream.finish()
    _, _, attempts = FMT.split(text[:-1])
    assert [a.status for a in attempts] == ["unterminated"]


@pytest.mark.parametrize(
    ("text", "status"),
    [
        ("[f(a=1e999)]", "invalid_json"),
        ("[f(a={1, 2})]", "invalid_json"),
        ("[f(a=x + 1)]", "invalid_json"),
        ("[f(1, a=2)]", "invalid_json"),
        ("[f(**kw)]", "invalid_json"),
        ("[f(a={1: 2})]", "invalid_json"),
        ("[f(a=1, a=2)]", "invalid_json"),
        ('[f(a="x\ny")]', "invalid_json"),
        ("[f(a=1))]", "invalid_json"),
        ("[f(a=1), g(b=", "unterminated"),
        ('[f(a="open', "unterminated"),
        ("<|python_start|>", "unterminated"),
    ],
)
def test_a_malformed_call_is_kept_with_its_status(text, status):
    _, _, attempts = FMT.split(text)
    assert [a.status for a in attempts] == [status]
    assert attempts[0].error


def test_one_bad_call_spoils_only_itself():
    _, _, attempts = FMT.split("[f(a=1), g(b=float('nan')), h()]")
    assert [a.status for a in attempts] == ["ok", "invalid_json", "ok"]
    assert [a.call.id for a in attempts if a.call] == ["call_0", "call_2"]


def test_a_call_of_a_function_no_tool_offers_is_read_as_written():
    _, _, [attempt] = FMT.split("[no_such_tool()]")
    assert attempt.status == "ok" and attempt.call.name == "no_such_tool"


def test_detects_pythonic_llama4_templates_and_leaves_json_ones_to_llama3_json():
    assert FMT.detects("{{- '<|python_start|>' }}")
    assert detect("<|header_start|>assistant<|header_end|> [func(arg=...)]") == "llama4-pythonic"
    assert detect('<|header_start|>{"name": "f", "parameters": ...}') == "llama3-json"


def test_what_this_syntax_cannot_carry_is_refused_on_writing():
    with pytest.raises(ValueError, match="identifier"):
        FMT.write("", None, [ToolCall(id="c", name="my-tool", arguments="{}")])
    with pytest.raises(ValueError, match="'class'"):
        FMT.write("", None, [ToolCall(id="c", name="f", arguments='{"class": 1}')])
    with pytest.raises(ValueError, match="reasoning"):
        FMT.write("", "thought", [])


# Differential against vLLM's llama4_pythonic parser. Where vLLM reads differently by design
# (docs/gateway.md lists these): it reads calls only when the whole turn is the list
# (llama4_pythonic_tool_parser.py, extract_tool_calls: TOOL_CALL_REGEX.match and ast.parse of
# the whole text), so turns with calls have no content here; and its regex wants names that
# start with an ASCII letter, so a parameter named "_x" makes it read the turn as text.
def _vllm_readable(turn) -> bool:
    names = [t.name for t in turn.tools] + [p for t in turn.tools for p in t.parameters]
    return _writable(turn) and all(re.match(r"[A-Za-z]", n) for n in names)


ORACLE_TURNS = st.one_of(
    turns(reasoning=False, content=st.just(""), min_calls=1),
    turns(reasoning=False, content=texts(forbidden=("[",)), max_calls=0),
).filter(_vllm_readable)


def offered(examples):
    """Every tool the examples offer, once by name: one request carries them all."""
    return list({t.name: t.openai() for turn in examples for t in turn.tools}.values())


@pytest.mark.vllm
def test_vllm_reads_what_we_write_as_we_do(vllm_oracle):
    examples = generate(ORACLE_TURNS, 500)
    written = [FMT.write(t.content, None, t.calls) for t in examples]
    results = vllm_oracle.parse("llama4_pythonic", written, offered(examples))

    def check(pair):
        text, result = pair
        assert oracle_view(result) == our_view(FMT, text)

    assert disagreements(list(zip(written, results, strict=True)), check) == []
    assert sum(bool(t.calls) for t in examples) > 200
