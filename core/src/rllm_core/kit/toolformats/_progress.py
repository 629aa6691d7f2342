"""Streaming a format by reading its text so far, and the scanning the JSON formats share.

:class:`ProgressStream` is a :class:`~rllm_core.ports.rendering.ToolCallStream` for a format
that can say, of any prefix of a completion, what is already certain (:data:`Progress`): the
content and reasoning so far, and each call whose name is complete with as much of its
arguments text as has arrived. Each ``feed`` reads the whole text again and sends what was
added; ``finish`` sends what the format's ``split`` adds to that, so a streamed completion
ends exactly where ``split`` reads the whole text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from rllm_core.ports.rendering import (
    ArgumentsDelta,
    ContentDelta,
    ReasoningDelta,
    StreamEvent,
    ToolCallStart,
)
from rllm_core.types import ParsedToolCall

__all__ = [
    "Progress",
    "ProgressStream",
    "add_trailing",
    "held_back",
    "json_value_end",
]


@dataclass
class Progress:
    """What a prefix of a completion makes certain. ``calls`` holds ``(name, arguments so
    far)`` for each call whose name is complete, in order; the arguments text only grows."""

    content: str = ""
    reasoning: str = ""
    calls: list[tuple[str, str]] = field(default_factory=list)


Split = Callable[[str], tuple[str, str | None, list[ParsedToolCall]]]


class ProgressStream:
    """A stream over ``progress(text so far)``, closed by ``split(whole text)``."""

    def __init__(self, progress: Callable[[str], Progress], split: Split) -> None:
        self._progress = progress
        self._split = split
        self._text = ""
        self._content = ""
        self._reasoning = ""
        self._names: list[str] = []
        self._arguments: list[str] = []

    def feed(self, text: str) -> list[StreamEvent]:
        self._text += text
        return self._send(self._progress(self._text))

    def finish(self) -> list[StreamEvent]:
        content, reasoning, attempts = self._split(self._text)
        calls = [(a.call.name, a.call.arguments) for a in attempts if a.call is not None]
        return self._send(Progress(content, reasoning or "", calls))

    def _send(self, now: Progress) -> list[StreamEvent]:
        events: list[StreamEvent] = []
        # A reading that is not an extension of what was sent (only on malformed text) sends
        # nothing more rather than contradict it.
        if len(now.reasoning) > len(self._reasoning) and now.reasoning.startswith(self._reasoning):
            events.append(ReasoningDelta(now.reasoning[len(self._reasoning) :]))
            self._reasoning = now.reasoning
        if len(now.content) > len(self._content) and now.content.startswith(self._content):
            events.append(ContentDelta(now.content[len(self._content) :]))
            self._content = now.content
        for index, (name, arguments) in enumerate(now.calls):
            if index == len(self._names):
                events.append(ToolCallStart(index=index, id=f"call_{index}", name=name))
                self._names.append(name)
                self._arguments.append("")
            elif self._names[index] != name:
                break
            sent = self._arguments[index]
            if len(arguments) > len(sent) and arguments.startswith(sent):
                events.append(ArgumentsDelta(index=index, text=arguments[len(sent) :]))
                self._arguments[index] = arguments
        return events


def held_back(text: str, markers: Iterable[str]) -> int:
    """The length of the longest tail of ``text`` that could still grow into a marker."""
    longest = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:n]):
                longest = n
                break
    return longest


def add_trailing(content: str, trailing: str) -> str:
    """Content with text the model wrote after its calls, on a line of its own."""
    trailing = trailing.strip()
    if not trailing:
        return content
    return f"{content}\n{trailing}" if content else trailing


_JSON_PIECE = re.compile(r'"(?:[^"\\]|\\.)*+"|"|[\[\]{}]', re.DOTALL)


def json_value_end(text: str, start: int) -> int | None:
    """Where the JSON object or array opening at ``text[start]`` closes (the index after its
    closing bracket), or ``None`` when the text ends first. Brackets inside strings do not
    count; a mismatched bracket is not checked here (the decoder reports it)."""
    depth = 0
    for piece in _JSON_PIECE.finditer(text, start):
        token = piece.group()
        if token[0] == '"':
            if len(token) == 1:
                return None
            continue
        depth += 1 if token in "[{" else -1
        if depth == 0:
            return piece.end()
    return None
