"""Checks the XML-style formats' tests share (qwen3-coder, glm-4.5, glm-4.7, minimax-m2).

These formats write argument values as bare text, so reading a call back needs the offered
tools' schemas (``split(text, tools)``), as vLLM's parsers need the request's tools.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st
from rllm_core.kit.toolformats import ToolCallFormat
from rllm_core.types import ToolCall, ToolSpec
from toolformats.strategies import Tool, Turn, disagreements, generate, turns

EXAMPLES = 500


def specs(turn: Turn) -> list[ToolSpec]:
    return [
        ToolSpec(name=t["function"]["name"], parameters=t["function"]["parameters"])
        for t in turn.openai_tools()
    ]


def xml_turns(
    forbidden: Sequence[str], *, reasoning: bool = True, always_reasoning: bool = False
) -> st.SearchStrategy[Turn]:
    """Turns as these formats can carry them: content without surrounding whitespace (read
    back without it) and reasoning without surrounding newlines (the think block's own)."""

    def tidy(turn: Turn) -> Turn:
        thought = turn.reasoning
        if always_reasoning and thought is None:
            thought = ""
        return Turn(
            content=turn.content.strip(),
            reasoning=None if thought is None else thought.strip("\n"),
            calls=turn.calls,
            tools=turn.tools,
        )

    return turns(forbidden=forbidden, reasoning=reasoning).map(tidy)


def assert_reads_back(fmt: ToolCallFormat, turn: Turn) -> None:
    """``split(write(turn), tools)`` gives back the turn, every call ``ok`` with its name
    and arguments (as JSON values), ids ``call_0``, ..."""
    text = fmt.write(turn.content, turn.reasoning, turn.calls)
    content, reasoning, attempts = fmt.split(text, specs(turn))
    assert (content, reasoning) == (turn.content, turn.reasoning), text
    assert [a.status for a in attempts] == ["ok"] * len(turn.calls), (text, attempts)
    got = [(a.call.id, a.call.name, json.loads(a.call.arguments)) for a in attempts if a.call]
    want = [(f"call_{n}", c.name, json.loads(c.arguments)) for n, c in enumerate(turn.calls)]
    assert got == want, text


def _ours(fmt: ToolCallFormat, text: str, tools: list[ToolSpec]) -> dict[str, Any]:
    content, reasoning, attempts = fmt.split(text, tools)
    return {
        "content": content,
        "reasoning": (reasoning or "").rstrip() or None,
        "calls": [
            (a.call.name, json.loads(a.call.arguments))
            for a in attempts
            if a.status == "ok" and a.call is not None
        ],
    }


def _theirs(result: dict[str, Any]) -> dict[str, Any]:
    """vLLM's reading, less what only differs by convention: content around which vLLM
    keeps whitespace when no call follows, reasoning with the think block's newlines, and
    reasoning without trailing whitespace (vLLM removes it for all but Qwen3, so both sides
    are compared without it)."""
    assert "error" not in result, result
    return {
        "content": (result["content"] or "").strip(),
        "reasoning": (result["reasoning"] or "").strip("\n").rstrip() or None,
        "calls": [(c["name"], c["arguments"]) for c in result["calls"]],
    }


def _own_names(turn: Turn, n: int) -> Turn:
    """``turn`` with its tools renamed apart from every other example's (``<name>_<n>``), so
    that one request can offer several examples' tools at once."""
    tools = tuple(Tool(name=f"{t.name}_{n}", parameters=t.parameters) for t in turn.tools)
    calls = tuple(
        ToolCall(id=c.id, name=f"{c.name}_{n}", arguments=c.arguments) for c in turn.calls
    )
    return Turn(content=turn.content, reasoning=turn.reasoning, calls=calls, tools=tools)


def differential(
    fmt: ToolCallFormat, oracle: Any, strategy: st.SearchStrategy[Turn], count: int = EXAMPLES
) -> int:
    """Write ``count`` turns, read each with ours and with vLLM's parsers (a turn without
    reasoning as the family's prompt without thinking gives it), and assert they agree."""
    examples = [_own_names(t, n) for n, t in enumerate(generate(strategy, count))]
    texts = [fmt.write(t.content, t.reasoning, t.calls) for t in examples]
    results: list[dict[str, Any] | None] = [None] * len(examples)
    for thinking in (True, False):
        chosen = [n for n, t in enumerate(examples) if (t.reasoning is not None) == thinking]
        # vLLM's parsers take longer the more tools a request offers: a few dozen at a time.
        for at in range(0, len(chosen), 25):
            batch = chosen[at : at + 25]
            answers = oracle.parse(
                fmt.vllm_tool_parser,
                [texts[n] for n in batch],
                [tool for n in batch for tool in examples[n].openai_tools()],
                reasoning_parser=fmt.vllm_reasoning_parser,
                chat_template_kwargs={} if thinking else {"enable_thinking": False},
            )
            for n, answer in zip(batch, answers, strict=True):
                results[n] = answer

    def check(n: int) -> None:
        ours = _ours(fmt, texts[n], specs(examples[n]))
        theirs = _theirs(results[n] or {"error": "no answer"})
        assert ours == theirs, f"text {texts[n]!r}\n  ours  {ours}\n  vLLM  {theirs}"

    found = disagreements(range(len(examples)), check)
    assert not found, "\n".join(found)
    return len(examples)
