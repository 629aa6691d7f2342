"""Reading sampled completion tokens back, for renderers: where the turn stops, the ``<think>``
block, the :class:`~rllm_core.types.ParsedResponse`, and the assistant message it stands for.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from rllm_core.types import Message, ParsedResponse, ParsedToolCall, ToolCall

__all__ = [
    "THINK_CLOSE",
    "THINK_OPEN",
    "assistant_message",
    "parse_completion",
    "split_at_stop",
    "split_think",
]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

TextParser = Callable[[str], tuple[str, "str | None", Sequence[ParsedToolCall]]]
"""Reads decoded completion text as ``(content, reasoning, tool calls)``."""


def split_at_stop(token_ids: Sequence[int], stops: Collection[int]) -> tuple[list[int], int | None]:
    """The ids before the first of ``stops``, and that token's position (``None``: no stop
    token, the completion was cut before closing its turn)."""
    ids = list(token_ids)
    stop_set = set(stops)
    end = next((n for n, token in enumerate(ids) if token in stop_set), None)
    return (ids if end is None else ids[:end]), end


def parse_completion(
    token_ids: Sequence[int],
    stops: Collection[int],
    decode: Callable[[list[int]], str],
    parse: TextParser,
) -> ParsedResponse:
    """Decode the tokens before the first stop token and read them with ``parse``;
    ``stopped`` says whether a stop token closed the turn."""
    body, stop = split_at_stop(token_ids, stops)
    content, reasoning, calls = parse(decode(body))
    return ParsedResponse(
        content=content, reasoning=reasoning, tool_calls=tuple(calls), stopped=stop is not None
    )


def split_think(text: str) -> tuple[str | None, str]:
    """``(reasoning, rest)`` of completion text that may open with a think block.

    Reasoning is the text before the first ``</think>`` (after a leading ``<think>``), stripped
    of newlines as templates write it; a ``<think>`` never closed (a completion cut inside its
    thinking) is all reasoning. Without a think block the reasoning is ``None``.
    """
    if THINK_CLOSE in text:
        before, _, rest = text.partition(THINK_CLOSE)
        return before.split(THINK_OPEN)[-1].strip("\n"), rest.lstrip("\n")
    if text.startswith(THINK_OPEN):
        return text.removeprefix(THINK_OPEN).lstrip("\n"), ""
    return None, text


def assistant_message(parsed: ParsedResponse) -> Message | None:
    """The assistant message a parsed completion says, to render it again in the next turn;
    ``None`` when one of its tool calls did not parse (no message renders it back)."""
    if any(attempt.call is None for attempt in parsed.tool_calls):
        return None
    return Message(
        role="assistant",
        content=parsed.content,
        reasoning=parsed.reasoning,
        tool_calls=tuple(a.call for a in parsed.tool_calls if isinstance(a.call, ToolCall)),
    )
