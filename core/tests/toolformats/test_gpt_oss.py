"""gpt-oss's harmony format: written turns read back, streams read as split does, malformed
calls are kept, and vLLM's harmony parser (tool parser ``openai``, on gpt-oss's real token
ids) reads what we write, and the other header layouts the model uses, as we do."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rllm_core.kit.toolformats import detect, get
from rllm_core.kit.toolformats.gpt_oss import _MARKERS, GPT_OSS
from rllm_core.types import ToolCall
from toolformats.checks import (
    assert_reads_back,
    assert_stream_matches_split,
    cuts_of,
    oracle_view,
    our_view,
)
from toolformats.strategies import Turn, disagreements, generate, turns

FMT = GPT_OSS
TURNS = turns(forbidden=_MARKERS)
READ = ToolCall(id="call_0", name="read_file", arguments='{"path": "ü \\"a\\".txt"}')
TEXT = (
    "<|channel|>analysis<|message|>I should look.<|end|>"
    "<|start|>assistant<|channel|>commentary<|message|>Let me look.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.read_file <|constrain|>json"
    '<|message|>{"path": "ü \\"a\\".txt"}<|call|>'
)
TOOLS = [
    {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
    for n in ("read_file", "no_such_tool")
]


def test_it_is_registered_and_writes_the_family_syntax():
    assert get("gpt-oss") is FMT
    assert FMT.write("Let me look.", "I should look.", [READ]) == TEXT
    content, reasoning, [attempt] = FMT.split(TEXT)
    assert (content, reasoning, attempt.status, attempt.call) == (
        "Let me look.",
        "I should look.",
        "ok",
        READ,
    )
    assert FMT.write("Done.", None, []) == "<|channel|>final<|message|>Done.<|return|>"


def test_it_detects_its_template():
    template = (
        '{{- "<|start|>assistant to=" + "functions." + tool_call.name + "<|channel|>commentary '
        '" + "json<|message|>" + tool_call.arguments + "<|call|>" }}'
    )
    assert FMT.detects(template)
    assert detect(template) == "gpt-oss"
    assert not FMT.detects("{{ '<|im_start|>' }}")


@given(TURNS)
def test_a_written_turn_reads_back(turn: Turn):
    assert_reads_back(FMT, turn.content, turn.reasoning, turn.calls)


@given(st.data())
def test_a_stream_reads_as_split_however_the_text_is_cut(data):
    turn = data.draw(TURNS)
    text = FMT.write(turn.content, turn.reasoning, turn.calls)
    end = data.draw(st.integers(min_value=0, max_value=len(text)))
    cuts = data.draw(cuts_of(end))
    assert_stream_matches_split(FMT, text[:end], cuts, complete=end == len(text))


def test_a_call_cut_before_its_stop_token_is_read():
    # <|call|> is a stop token: a renderer that cuts at the stop token leaves it out.
    content, reasoning, [attempt] = FMT.split(TEXT.removesuffix("<|call|>"))
    assert (content, reasoning, attempt.status, attempt.call) == (
        "Let me look.",
        "I should look.",
        "ok",
        READ,
    )


@pytest.mark.parametrize(
    ("text", "statuses"),
    [
        (TEXT[: TEXT.index("a\\")], ["unterminated"]),
        (TEXT[: TEXT.index("<|message|>{")], ["unterminated"]),
        (TEXT.replace('"}<|call|>', '"<|call|>'), ["invalid_json"]),
        (TEXT.replace('{"path": "ü \\"a\\".txt"}', "[1]"), ["invalid_json"]),
        (TEXT.replace("to=functions.read_file", "to=functions."), ["missing_name"]),
        (TEXT.replace("read_file", "no_such_tool"), ["ok"]),
        (
            TEXT.replace("<|call|>", "<|start|>assistant<|channel|>final<|message|>"),
            ["unterminated"],
        ),
    ],
)
def test_a_malformed_call_is_kept_not_raised(text, statuses):
    content, reasoning, attempts = FMT.split(text)
    assert (content, reasoning) == ("Let me look.", "I should look.")
    assert [a.status for a in attempts] == statuses
    assert all(a.raw for a in attempts)
    assert all((a.call is None) == (a.status != "ok") for a in attempts)
    assert_stream_matches_split(FMT, text, range(1, len(text), 3), complete=False)


def test_every_prefix_of_a_turn_is_read_without_raising():
    text = FMT.write("c", "r", [READ, READ])
    for n in range(len(text) + 1):
        FMT.split(text[:n])
        assert_stream_matches_split(FMT, text[:n], [n // 2], complete=n == len(text))


# Other ways the model lays out a message: the recipient in the role header, a bare content
# type, no space before <|constrain|>, several analysis and final messages, a built-in
# tool's message, and plain text with no harmony markers at all.
LAYOUTS = [
    "<|channel|>analysis<|message|>r<|end|><|start|>assistant to=functions.read_file<|channel|>"
    'commentary json<|message|>{"path": "x"}<|call|>',
    '<|channel|>commentary to=functions.read_file<|constrain|>json<|message|>{"a": [1, {}]}'
    "<|call|>",
    " to=functions.read_file<|channel|>commentary <|constrain|>json<|message|>{}<|call|>",
    "<|channel|>analysis<|message|>one<|end|><|start|>assistant<|channel|>analysis<|message|>"
    "two<|end|><|start|>assistant<|channel|>final<|message|>done<|return|>",
    "<|channel|>commentary<|message|>a<|end|><|start|>assistant<|channel|>final<|message|>b"
    "<|return|>",
    "<|channel|>analysis<|message|>r<|end|><|start|>assistant<|channel|>analysis to=browser.search"
    ' code<|message|>{"q": 1}<|call|>',
    "<|channel|>final<|message|>done",
    "just text",
]


def test_vllm_reads_what_we_write_as_we_do(vllm_oracle):
    examples = generate(TURNS, 500)
    texts = [FMT.write(t.content, t.reasoning, t.calls) for t in examples]
    tools = list({tool.name: tool.openai() for t in examples for tool in t.tools}.values())
    results = vllm_oracle.parse(
        FMT.vllm_tool_parser, texts + LAYOUTS, tools + TOOLS, FMT.vllm_reasoning_parser
    )
    by_text = dict(zip(texts + LAYOUTS, results, strict=True))

    def check(text: str) -> None:
        assert our_view(FMT, text, drop_blank_content=False) == oracle_view(by_text[text])

    found = disagreements(texts + LAYOUTS, check)
    assert not found, "\n".join(found)
