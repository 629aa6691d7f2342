"""The Hermes format (``<tool_call>`` JSON blocks, Qwen3 ``<think>`` reasoning): written turns
read back, streams read as ``split`` does, malformed calls are kept, and vLLM's ``hermes``
parser (after its ``qwen3`` reasoning parser) reads 500 written turns as ours does."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st
from rllm_core.kit import toolformats
from rllm_core.kit.toolformats.hermes import HERMES
from rllm_core.types import ToolCall
from toolformats.checks import (
    assert_reads_back,
    assert_stream_matches_split,
    cuts_of,
    oracle_view,
    our_view,
)
from toolformats.strategies import Turn, disagreements, generate, texts, turns

MARKERS = ("<tool_call>", "</tool_call>", "<think>", "</think>")


def _fits(turn: Turn) -> bool:
    """What the syntax carries: reasoning and content are read with the newlines around the
    think block stripped, as Qwen3's template writes them."""
    if turn.reasoning is None:
        return True
    return turn.reasoning.strip("\n") == turn.reasoning and not turn.content.startswith("\n")


TURNS = turns(forbidden=MARKERS).filter(_fits)


def test_hermes_is_registered_and_detected():
    assert toolformats.get("hermes") is HERMES
    # As Qwen2.5's and Qwen3's templates write a call.
    template = """{{- '<tool_call>\\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}"""
    assert HERMES.detects(template)
    assert not HERMES.detects("{{ message.content }}")


@settings(max_examples=150, deadline=None)
@given(turn=TURNS, data=st.data())
def test_written_turns_read_back_and_stream_as_split(turn, data):
    assert_reads_back(HERMES, turn.content, turn.reasoning, turn.calls)
    text = HERMES.write(turn.content, turn.reasoning, turn.calls)
    assert_stream_matches_split(HERMES, text, data.draw(cuts_of(len(text))))


@settings(max_examples=150, deadline=None)
@given(
    text=texts(max_size=60) | st.builds(str.__add__, texts(max_size=30), texts(max_size=30)),
    data=st.data(),
)
def test_any_text_is_read_without_raising_and_streams_as_split(text, data):
    for candidate in (text, f"<think>{text}", f"a<tool_call>{text}", f"{text}</tool_call>"):
        HERMES.split(candidate)
        assert_stream_matches_split(
            HERMES, candidate, data.draw(cuts_of(len(candidate))), complete=False
        )


def test_malformed_calls_are_kept_with_their_status():
    good = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    text = (
        f'{good}\n<tool_call>\n{{"name": "g", "arguments": {{"a": </tool_call>\n'
        '<tool_call>\n{"arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "h", "argu'
    )
    content, reasoning, attempts = HERMES.split(text)
    assert (content, reasoning) == ("", None)
    assert [a.status for a in attempts] == ["ok", "invalid_json", "missing_name", "unterminated"]
    assert attempts[0].call == ToolCall(id="call_0", name="f", arguments='{"a": 1}')
    assert attempts[3].raw == '{"name": "h", "argu'


def test_a_call_streams_its_name_first_then_its_arguments_as_they_arrive():
    stream = HERMES.stream()
    events = []
    for piece in [
        "<think>\nhm\n</think>\n\nI'll ",
        'look.\n<tool_call>\n{"name": "read',
        '_file", ',
        '"arguments": {"path": "a',
        'b"}}\n</tool_call>',
    ]:
        events.append(stream.feed(piece))
    events.append(stream.finish())
    names = [[type(e).__name__ for e in batch] for batch in events]
    assert names == [
        ["ReasoningDelta", "ContentDelta"],
        ["ContentDelta"],
        [],
        ["ToolCallStart", "ArgumentsDelta"],
        ["ArgumentsDelta"],
        [],
    ]
    assert events[3][0].name == "read_file" and events[3][0].id == "call_0"
    assert events[3][1].text + events[4][0].text == '{"path": "ab"}'


def test_vllm_reads_500_written_turns_as_ours_do(vllm_oracle, fuzz_counts):
    examples = generate(TURNS, 500)
    fuzz_counts["hermes turns compared with vLLM"] += len(examples)
    texts_ = [HERMES.write(t.content, t.reasoning, t.calls) for t in examples]
    tools = {
        json.dumps(tool.openai(), sort_keys=True): tool.openai()
        for t in examples
        for tool in t.tools
    }
    # vLLM's qwen3 reasoning parser reads text with no think block as reasoning unless the
    # request turns thinking off; those turns are asked with enable_thinking=False.
    thinking = [n for n, t in enumerate(examples) if t.reasoning is not None]
    plain = [n for n, t in enumerate(examples) if t.reasoning is None]
    results: dict[int, dict] = {}
    for group, kwargs in ((thinking, {}), (plain, {"enable_thinking": False})):
        answers = vllm_oracle.parse(
            "hermes",
            [texts_[n] for n in group],
            list(tools.values()),
            reasoning_parser="qwen3",
            chat_template_kwargs=kwargs,
        )
        results.update(zip(group, answers, strict=True))

    def check(n: int) -> None:
        theirs = oracle_view(results[n])
        ours = our_view(HERMES, texts_[n])
        # vLLM keeps the newlines the template writes around the think block and between the
        # content and the first block; they are separators, so ours drops them.
        if theirs["reasoning"] is not None:
            theirs["reasoning"] = theirs["reasoning"].strip("\n")
            theirs["content"] = theirs["content"].lstrip("\n")
        if ours["calls"] and theirs["content"].endswith("\n"):
            theirs["content"] = theirs["content"].removesuffix("\n")
        assert ours == theirs, texts_[n]

    found = disagreements(range(len(examples)), check)
    assert not found, "\n".join(found)
