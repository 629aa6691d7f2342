# ruff: noqa: RUF001  (DeepSeek's tokens are spelled with fullwidth bars)
"""DeepSeek-V3.1's format: written turns read back, streams read as split does, malformed
calls are kept, and vLLM's ``deepseek_v31`` / ``deepseek_v3`` parsers read what we write
as we do."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rllm_core.kit.toolformats import detect, get
from rllm_core.kit.toolformats.deepseek_v31 import _MARKERS, DEEPSEEK_V31
from rllm_core.types import ToolCall
from toolformats.checks import (
    assert_reads_back,
    assert_stream_matches_split,
    cuts_of,
    oracle_view,
    our_view,
)
from toolformats.strategies import Turn, disagreements, generate, turns

FMT = DEEPSEEK_V31
TURNS = turns(forbidden=_MARKERS)
READ = ToolCall(id="call_0", name="read_file", arguments='{"path": "ü \\"a\\".txt"}')
TEXT = (
    "I should look.</think>Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>read_file"
    '<｜tool▁sep｜>{"path": "ü \\"a\\".txt"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
)


def test_it_is_registered_and_writes_the_family_syntax():
    assert get("deepseek-v3.1") is FMT
    assert FMT.write("Let me look.", "I should look.", [READ]) == TEXT
    assert FMT.split(TEXT) == (
        "Let me look.",
        "I should look.",
        [FMT.split(TEXT)[2][0]],
    )
    assert FMT.split(TEXT)[2][0].call == READ


def test_it_detects_its_template_and_not_deepseek_v3s():
    v31 = (
        "{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['function']['name'] + "
        "'<｜tool▁sep｜>' + tool['function']['arguments'] + '<｜tool▁call▁end｜>'}}"
    )
    v3 = v31.replace("'<｜tool▁sep｜>' +", "'<｜tool▁sep｜>' + '\\n```json\\n' +")
    assert FMT.detects(v31)
    assert detect(v31) == "deepseek-v3.1"
    assert not FMT.detects(v3)
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


def test_a_completion_without_think_close_streams_as_content_only_at_the_end():
    stream = FMT.stream()
    assert stream.feed("Hello there") == []
    assert [e.text for e in stream.finish()] == ["Hello there"]
    stream = FMT.stream()
    assert [e.text for e in stream.feed("<think>hmm")] == ["hmm"]


@pytest.mark.parametrize(
    ("text", "statuses"),
    [
        (TEXT[: TEXT.index("a\\")], ["unterminated"]),
        (TEXT[: TEXT.index("<｜tool▁sep｜>")], ["unterminated"]),
        (TEXT.replace('"}<｜tool▁call▁end', '"<｜tool▁call▁end'), ["invalid_json"]),
        (TEXT.replace('{"path": "ü \\"a\\".txt"}', "[1]"), ["invalid_json"]),
        (TEXT.replace("read_file", " "), ["missing_name"]),
        (TEXT.replace("read_file<｜tool▁sep｜>", "read_file"), ["missing_name"]),
        (TEXT.replace("read_file", "no_such_tool"), ["ok"]),
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


def test_vllm_reads_what_we_write_as_we_do(vllm_oracle):
    examples = generate(TURNS, 500)
    found: list[str] = []
    # vLLM reads reasoning only when the request turns thinking on (deepseek_v3 delegates
    # to deepseek_r1 then); a turn without reasoning is a non-thinking completion.
    for thinking in (True, False):
        batch = [t for t in examples if (t.reasoning is not None) is thinking]
        texts = [FMT.write(t.content, t.reasoning, t.calls) for t in batch]
        tools = list({tool.name: tool.openai() for t in batch for tool in t.tools}.values())
        results = vllm_oracle.parse(
            FMT.vllm_tool_parser,
            texts,
            tools,
            reasoning_parser=FMT.vllm_reasoning_parser,
            chat_template_kwargs={"thinking": thinking},
        )
        by_text = dict(zip(texts, results, strict=True))

        def check(text: str, by_text=by_text) -> None:
            assert our_view(FMT, text) == oracle_view(by_text[text])

        found += disagreements(texts, check)
    assert not found, "\n".join(found)
