"""Kimi-K2's tool calls: a section of calls, each headed by the model's own call id.

A turn (Kimi-K2-Thinking writes its reasoning first; Kimi-K2-Instruct writes none), one line
broken here before each marker::

    <think>I should look.</think>Let me look.<|tool_calls_section_begin|>
    <|tool_call_begin|>functions.read_file:0
    <|tool_call_argument_begin|>{"path": "a.txt"}<|tool_call_end|>
    <|tool_calls_section_end|>

The header ``functions.NAME:INDEX`` is the call's id: the chat template writes it back from
the assistant message's ``tool_calls[].id`` when it renders the conversation again. So here,
unlike the other formats, an ``ok`` call's ``id`` is that header as the model wrote it (as
vLLM's ``kimi_k2`` parser returns it), and ``write`` writes a call's ``id`` when it has that
shape for the call's name, else ``functions.NAME:N`` with N its position in the turn. A turn
read and written again is then the same text, token for token.

Reading: a completion that starts with ``<think>`` has reasoning up to ``</think>`` (all of
it, when cut off before); the reasoning also ends where the call section begins. Calls are
read only inside the section. A header that is not ``NAME:INDEX`` is ``missing_name``,
arguments that are not a JSON object ``invalid_json``, a call cut off before
``<|tool_call_end|>`` ``unterminated``. Text after the section, or between calls if not
blank, is added to the content.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from rllm_core.kit.toolformats._markers import Marker, MarkerLexer, check_arguments, fold
from rllm_core.ports.rendering import (
    ArgumentsDelta,
    ContentDelta,
    ReasoningDelta,
    StreamEvent,
    ToolCallStart,
)
from rllm_core.types import ParsedToolCall, ToolCall, ToolSpec

__all__ = ["KIMI_K2", "KimiK2Format"]

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARGS_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"

_MARKERS = (THINK_OPEN, THINK_CLOSE, SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARGS_BEGIN, CALL_END)
_HEADER = re.compile(r"(?:functions\.)?(?P<name>[^:]+):\d+")


def _name_of(header: str) -> str | None:
    match = _HEADER.fullmatch(header)
    return match.group("name") if match else None


class _Reader:
    """One completion's state machine; ``split`` and ``stream`` both run it."""

    def __init__(self) -> None:
        self._lexer = MarkerLexer(_MARKERS)
        self._state = "start"
        self._stray: list[str] = []
        self._header: list[str] = []
        self._args: list[str] = []
        self._call: tuple[str, str] | None = None  # (id, name) of the call being read
        self._started = 0
        self.reasoning_seen = False
        self.attempts: list[ParsedToolCall] = []

    def feed(self, text: str) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        for piece in self._lexer.feed(text):
            self._piece(piece, out)
        return out

    def finish(self) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        for piece in self._lexer.finish():
            self._piece(piece, out)
        if self._state == "section":
            self._flush_stray(out)
        elif self._state in ("header", "args"):
            self._end_call(terminated=False)
        self._state = "done"
        return out

    def _piece(self, piece: str, out: list[StreamEvent]) -> None:
        state = self._state
        marker = piece if isinstance(piece, Marker) else None
        piece = str(piece)
        if state == "start":
            self._state = "content"
            if marker == THINK_OPEN:
                self._state = "reasoning"
                self.reasoning_seen = True
                return
            self._piece(piece if marker is None else Marker(piece), out)
        elif state == "reasoning":
            if marker == THINK_CLOSE:
                self._state = "content"
            elif marker == SECTION_BEGIN:
                self._state = "section"
            else:
                out.append(ReasoningDelta(piece))
        elif state == "content":
            if marker == SECTION_BEGIN:
                self._state = "section"
            else:
                out.append(ContentDelta(piece))
        elif state == "section":
            if marker == CALL_BEGIN:
                self._flush_stray(out)
                self._state = "header"
            elif marker == SECTION_END:
                self._flush_stray(out)
                self._state = "content"
            else:
                self._stray.append(piece)
        elif state == "header":
            if marker == ARGS_BEGIN:
                header = "".join(self._header).strip()
                name = _name_of(header)
                if name is not None:
                    self._call = (header, name)
                    out.append(ToolCallStart(self._started, header, name))
                    self._started += 1
                self._state = "args"
            elif marker in (CALL_END, SECTION_END, CALL_BEGIN):
                self._end_call(terminated=marker == CALL_END)
                if marker != CALL_END:
                    self._piece(Marker(piece), out)
            else:
                self._header.append(piece)
        elif state == "args":
            if marker in (CALL_END, SECTION_END):
                self._end_call(terminated=True)
                if marker == SECTION_END:
                    self._state = "content"
            elif marker == CALL_BEGIN:
                self._end_call(terminated=False)
                self._piece(Marker(piece), out)
            else:
                self._args.append(piece)
                if self._call is not None:
                    out.append(ArgumentsDelta(self._started - 1, piece))
        else:
            out.append(ContentDelta(piece))

    def _flush_stray(self, out: list[StreamEvent]) -> None:
        stray = "".join(self._stray)
        self._stray.clear()
        if stray.strip():
            out.append(ContentDelta(stray))

    def _end_call(self, terminated: bool) -> None:
        header = "".join(self._header)
        raw = header if self._state == "header" else f"{header}{ARGS_BEGIN}{''.join(self._args)}"
        if not terminated:
            attempt = ParsedToolCall(status="unterminated", raw=raw, error=f"no {CALL_END}")
        elif self._state == "header" or self._call is None:
            attempt = ParsedToolCall(
                status="missing_name",
                raw=raw,
                error=f"the call header {header.strip()!r} is not functions.NAME:INDEX"
                f" followed by {ARGS_BEGIN}",
            )
        else:
            call_id, name = self._call
            attempt = check_arguments(call_id, name, "".join(self._args), raw)
        self.attempts.append(attempt)
        self._header.clear()
        self._args.clear()
        self._call = None
        self._state = "section"


class KimiK2Format:
    """Kimi-K2's format; see the module docstring."""

    name = "kimi-k2"
    families = ("Kimi-K2-Instruct", "Kimi-K2-Thinking", "Kimi-K2.5")
    vllm_tool_parser = "kimi_k2"
    vllm_reasoning_parser: str | None = "kimi_k2"

    def split(
        self, text: str, tools: Sequence[ToolSpec] = ()
    ) -> tuple[str, str | None, list[ParsedToolCall]]:
        reader = _Reader()
        events = reader.feed(text) + reader.finish()
        content, reasoning = fold(events, reader.reasoning_seen)
        return content, reasoning, reader.attempts

    def write(self, content: str, reasoning: str | None, calls: Sequence[ToolCall]) -> str:
        head = "" if reasoning is None else f"{THINK_OPEN}{reasoning}{THINK_CLOSE}"
        if not calls:
            return f"{head}{content}"
        body = "".join(
            f"{CALL_BEGIN}{call_id(call, n)}{ARGS_BEGIN}{call.arguments}{CALL_END}"
            for n, call in enumerate(calls)
        )
        return f"{head}{content}{SECTION_BEGIN}{body}{SECTION_END}"

    def stream(self, tools: Sequence[ToolSpec] = ()) -> _Reader:
        return _Reader()

    def detects(self, chat_template: str) -> bool:
        return SECTION_BEGIN in chat_template and ARGS_BEGIN in chat_template


def call_id(call: ToolCall, position: int) -> str:
    """The header Kimi-K2 writes for ``call``: its own id when that is ``functions.NAME:N``
    for its name, else ``functions.NAME:position``."""
    if call.id.startswith("functions.") and _name_of(call.id) == call.name:
        return call.id
    return f"functions.{call.name}:{position}"


KIMI_K2 = KimiK2Format()
