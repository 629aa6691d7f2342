"""Checks every format's tests run: a written turn reads back, a stream reads as ``split``
does however the text is cut, and the oracle's reading compared with ours."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st
from rllm_core.kit.toolformats import ToolCallFormat
from rllm_core.ports.rendering import ArgumentsDelta, ContentDelta, ReasoningDelta, ToolCallStart
from rllm_core.types import ToolCall


def streamed(fmt: ToolCallFormat, text: str, cuts: Sequence[int]) -> dict[str, Any]:
    """What a stream of ``fmt`` gives for ``text`` fed in pieces cut at ``cuts``: content,
    reasoning (``None`` when no reasoning delta came), and the calls started, each with its
    id, name and the concatenated argument deltas."""
    stream = fmt.stream()
    events = []
    last = 0
    for cut in sorted({c for c in cuts if 0 < c < len(text)}):
        events += stream.feed(text[last:cut])
        last = cut
    events += stream.feed(text[last:])
    events += stream.finish()
    content, reasoning = [], []
    calls: list[dict[str, str]] = []
    for event in events:
        if isinstance(event, ContentDelta):
            content.append(event.text)
        elif isinstance(event, ReasoningDelta):
            reasoning.append(event.text)
        elif isinstance(event, ToolCallStart):
            assert event.index == len(calls), f"call {event.index} started out of order"
            calls.append({"id": event.id, "name": event.name, "arguments": ""})
        elif isinstance(event, ArgumentsDelta):
            assert event.index == len(calls) - 1, f"arguments for call {event.index} out of order"
            calls[event.index]["arguments"] += event.text
        else:
            raise AssertionError(f"not a stream event: {event!r}")
    return {
        "content": "".join(content),
        "reasoning": "".join(reasoning) if reasoning else None,
        "calls": calls,
    }


def split_view(fmt: ToolCallFormat, text: str) -> dict[str, Any]:
    """``split``'s reading of ``text`` in the shape :func:`streamed` gives."""
    content, reasoning, attempts = fmt.split(text)
    return {
        "content": content,
        "reasoning": reasoning,
        "calls": [
            {"id": a.call.id, "name": a.call.name, "arguments": a.call.arguments}
            for a in attempts
            if a.status == "ok" and a.call is not None
        ],
    }


def assert_stream_matches_split(
    fmt: ToolCallFormat, text: str, cuts: Sequence[int], complete: bool = True
) -> None:
    """A stream gives the content and reasoning ``split`` does, and starts exactly its ``ok``
    calls with their arguments. A stream cannot know that a call it started will never end,
    so for a cut-off text (``complete=False``) it may start more: its other calls are then
    ``split``'s attempts that are not ``ok``."""
    got = streamed(fmt, text, cuts)
    want = split_view(fmt, text)
    # A stream says nothing of reasoning it never saw text of; split may say "".
    if got["reasoning"] is None and want["reasoning"] == "":
        got["reasoning"] = ""
    where = f"text {text!r} cut at {sorted(cuts)}"
    if not complete:
        ok = {call["id"] for call in want["calls"]}
        extra = [call for call in got["calls"] if call["id"] not in ok]
        got["calls"] = [call for call in got["calls"] if call["id"] in ok]
        not_ok = [a for a in fmt.split(text)[2] if a.status != "ok"]
        assert len(extra) <= len(not_ok), where
    assert got == want, where


def cuts_of(text_length: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(min_value=1, max_value=max(1, text_length - 1)), max_size=12)


def assert_reads_back(
    fmt: ToolCallFormat,
    content: str,
    reasoning: str | None,
    calls: Sequence[ToolCall],
    ids: Sequence[str] | None = None,
) -> None:
    """``split(write(...))`` gives back the turn: same content and reasoning, every call
    ``ok`` with the same name and arguments text, ids ``ids`` (``call_0``, ... by default)."""
    text = fmt.write(content, reasoning, calls)
    got_content, got_reasoning, attempts = fmt.split(text)
    assert (got_content, got_reasoning) == (content, reasoning), text
    assert [a.status for a in attempts] == ["ok"] * len(calls), (text, attempts)
    want_ids = list(ids) if ids is not None else [f"call_{n}" for n in range(len(calls))]
    assert [a.call for a in attempts] == [
        ToolCall(id=i, name=c.name, arguments=c.arguments)
        for i, c in zip(want_ids, calls, strict=True)
    ], text


def oracle_view(result: dict[str, Any]) -> dict[str, Any]:
    """The oracle's reading with vLLM's empty content (``None``) as ``""``."""
    assert "error" not in result, result
    return {
        "content": result["content"] or "",
        "reasoning": result["reasoning"],
        "calls": [(c["name"], c["arguments"]) for c in result["calls"]],
    }


def our_view(fmt: ToolCallFormat, text: str, drop_blank_content: bool = True) -> dict[str, Any]:
    """Our reading in the oracle's shape. vLLM's chat completions endpoint drops a blank
    content beside tool calls (``parse`` in vllm/parser/abstract_parser.py; its harmony
    parser does not), so with ``drop_blank_content`` ours does too here; ``split`` keeps it,
    for the turn to render again as it was written."""
    content, reasoning, attempts = fmt.split(text)
    calls = [
        (a.call.name, json.loads(a.call.arguments))
        for a in attempts
        if a.status == "ok" and a.call is not None
    ]
    if drop_blank_content and calls and not content.strip():
        content = ""
    return {"content": content, "reasoning": reasoning, "calls": calls}
