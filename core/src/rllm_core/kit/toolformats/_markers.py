"""Reading text that special tokens (spelled as text) divide into parts, as it arrives.

The formats whose calls are framed by special tokens (gpt-oss, Kimi-K2, DeepSeek-V3.1) read
a completion as a sequence of markers and the text between them. :class:`MarkerLexer` cuts
decoded text into those pieces as it streams: it holds back only a tail that could still
become a marker, so text is released as soon as it cannot be part of one. Each of those
formats then runs one state machine over the pieces, for ``split`` and ``stream`` alike, so
that a streamed completion reads exactly as the whole text does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable

from rllm_core.ports.rendering import ContentDelta, ReasoningDelta, StreamEvent
from rllm_core.types import ParsedToolCall, ToolCall

__all__ = ["Marker", "MarkerLexer", "check_arguments", "fold"]


class Marker(str):
    """A piece of text that is one of the format's markers (a special token)."""

    __slots__ = ()


class MarkerLexer:
    """Cuts text into markers and the text between them, holding back a possible marker."""

    def __init__(self, markers: Iterable[str]) -> None:
        spelled = sorted(set(markers), key=len, reverse=True)
        self._pattern = re.compile("|".join(re.escape(m) for m in spelled))
        self._prefixes = {m[:n] for m in spelled for n in range(1, len(m))}
        self._longest = max(len(m) for m in spelled)
        self._pending = ""

    def feed(self, text: str) -> list[str]:
        """The pieces (``str`` for text, :class:`Marker` for a marker) now certain."""
        data = self._pending + text
        pieces: list[str] = []
        start = 0
        for match in self._pattern.finditer(data):
            if match.start() > start:
                pieces.append(data[start : match.start()])
            pieces.append(Marker(match.group()))
            start = match.end()
        rest = data[start:]
        held = 0
        for n in range(min(len(rest), self._longest - 1), 0, -1):
            if rest[-n:] in self._prefixes:
                held = n
                break
        if len(rest) > held:
            pieces.append(rest[: len(rest) - held])
        self._pending = rest[len(rest) - held :]
        return pieces

    def finish(self) -> list[str]:
        """What was held back, as text: the completion ended inside no marker."""
        rest, self._pending = self._pending, ""
        return [rest] if rest else []


def check_arguments(call_id: str, name: str, arguments: str, raw: str) -> ParsedToolCall:
    """An attempt whose arguments text must be a JSON object: ``ok`` or ``invalid_json``."""
    try:
        value = json.loads(arguments)
    except ValueError as exc:
        return ParsedToolCall(
            status="invalid_json", raw=raw, error=f"arguments of {name!r} are not JSON: {exc}"
        )
    if not isinstance(value, dict):
        return ParsedToolCall(
            status="invalid_json",
            raw=raw,
            error=f"arguments of {name!r} are {type(value).__name__}, not a JSON object",
        )
    return ParsedToolCall(
        status="ok", raw=raw, call=ToolCall(id=call_id, name=name, arguments=arguments)
    )


def fold(events: Iterable[StreamEvent], reasoning_seen: bool) -> tuple[str, str | None]:
    """The content and reasoning that a completion's events add up to."""
    content: list[str] = []
    reasoning: list[str] = []
    for event in events:
        if isinstance(event, ContentDelta):
            content.append(event.text)
        elif isinstance(event, ReasoningDelta):
            reasoning.append(event.text)
    return "".join(content), ("".join(reasoning) if reasoning_seen else None)
