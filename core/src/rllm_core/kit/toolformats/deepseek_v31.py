# ruff: noqa: RUF001, RUF002  (the family spells its tokens with fullwidth bars)
"""DeepSeek-V3.1's tool calls: special tokens around the name and the JSON arguments.

A turn in thinking mode (the prompt ends with ``<think>``, so the completion starts inside
the reasoning), one line broken here before each marker::

    I should look.</think>Let me look.<｜tool▁calls▁begin｜>
    <｜tool▁call▁begin｜>read_file<｜tool▁sep｜>{"path": "a.txt"}<｜tool▁call▁end｜>
    <｜tool▁calls▁end｜>

The bars are fullwidth (U+FF5C) and the word gaps U+2581, as the tokenizer spells them. In
non-thinking mode the prompt ends with ``</think>`` and the completion is content and calls.

Reading: the text before a ``</think>`` is the reasoning (without a leading ``<think>``);
with no ``</think>`` there is none, so a stream holds text back until a ``</think>``, the
calls or the end of the completion shows which it is (a completion that starts with
``<think>`` streams its reasoning at once). Calls are read only inside the
``<｜tool▁calls▁begin｜>`` section; a call whose arguments are not a JSON object is
``invalid_json``, one with an empty name ``missing_name``, one cut off before
``<｜tool▁call▁end｜>`` ``unterminated``. Text after the section, or between calls if not
blank, is added to the content.
"""

from __future__ import annotations

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

__all__ = ["DEEPSEEK_V31", "DeepSeekV31Format"]

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"

_MARKERS = (THINK_OPEN, THINK_CLOSE, CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP)


class _Reader:
    """One completion's state machine; ``split`` and ``stream`` both run it."""

    def __init__(self) -> None:
        self._lexer = MarkerLexer(_MARKERS)
        self._state = "start"
        self._held: list[str] = []  # text not yet known to be reasoning or content
        self._stray: list[str] = []  # text between calls
        self._name: list[str] = []
        self._args: list[str] = []
        self._call_id: str | None = None
        self.reasoning_seen = False
        self.attempts: list[ParsedToolCall] = []
        self._started = 0

    def feed(self, text: str) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        for piece in self._lexer.feed(text):
            self._piece(piece, out)
        return out

    def finish(self) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        for piece in self._lexer.finish():
            self._piece(piece, out)
        state = self._state
        if state == "start" and self._held:
            out.append(ContentDelta("".join(self._held)))
        elif state == "section":
            self._flush_stray(out)
        elif state in ("name", "args"):
            self._unterminated()
        self._state = "done"
        return out

    def _piece(self, piece: str, out: list[StreamEvent]) -> None:
        state = self._state
        marker = piece if isinstance(piece, Marker) else None
        piece = str(piece)
        if state == "start":
            if marker == THINK_OPEN and not self._held:
                self._state = "reasoning"
                self.reasoning_seen = True
            elif marker == THINK_CLOSE:
                self.reasoning_seen = True
                out.append(ReasoningDelta("".join(self._held)))
                self._held.clear()
                self._state = "content"
            elif marker == CALLS_BEGIN:
                if self._held:
                    out.append(ContentDelta("".join(self._held)))
                self._held.clear()
                self._state = "section"
            else:
                self._held.append(piece)
        elif state == "reasoning":
            if marker == THINK_CLOSE:
                self._state = "content"
            else:
                out.append(ReasoningDelta(piece))
        elif state == "content":
            if marker == CALLS_BEGIN:
                self._state = "section"
            else:
                out.append(ContentDelta(piece))
        elif state == "section":
            if marker == CALL_BEGIN:
                self._flush_stray(out)
                self._state = "name"
            elif marker == CALLS_END:
                self._flush_stray(out)
                self._state = "content"
            else:
                self._stray.append(piece)
        elif state == "name":
            if marker == SEP:
                name = "".join(self._name).strip()
                if name:
                    self._call_id = f"call_{self._started}"
                    out.append(ToolCallStart(self._started, self._call_id, name))
                    self._started += 1
                self._state = "args"
            elif marker in (CALL_END, CALLS_END, CALL_BEGIN):
                raw = "".join(self._name)
                self.attempts.append(
                    ParsedToolCall(
                        status="missing_name",
                        raw=raw,
                        error=f"the call has no {SEP} after its name",
                    )
                )
                self._name.clear()
                self._state = "section"
                if marker != CALL_END:
                    self._piece(piece, out)
            else:
                self._name.append(piece)
        elif state == "args":
            if marker == CALL_END:
                self._close_call()
                self._state = "section"
            elif marker in (CALLS_END, CALL_BEGIN):
                self._unterminated()
                self._state = "section"
                self._piece(piece, out)
            else:
                self._args.append(piece)
                if self._call_id is not None:
                    out.append(ArgumentsDelta(self._started - 1, piece))
        else:
            out.append(ContentDelta(piece))

    def _flush_stray(self, out: list[StreamEvent]) -> None:
        stray = "".join(self._stray)
        self._stray.clear()
        if stray.strip():
            out.append(ContentDelta(stray))

    def _raw(self) -> str:
        return f"{''.join(self._name)}{SEP}{''.join(self._args)}"

    def _close_call(self) -> None:
        name = "".join(self._name).strip()
        raw = self._raw()
        if self._call_id is None:
            attempt = ParsedToolCall(
                status="missing_name", raw=raw, error="the call has an empty function name"
            )
        else:
            attempt = check_arguments(self._call_id, name, "".join(self._args), raw)
        self.attempts.append(attempt)
        self._name.clear()
        self._args.clear()
        self._call_id = None

    def _unterminated(self) -> None:
        raw = self._raw() if self._state == "args" else "".join(self._name)
        self.attempts.append(ParsedToolCall(status="unterminated", raw=raw, error=f"no {CALL_END}"))
        self._name.clear()
        self._args.clear()
        self._call_id = None


class DeepSeekV31Format:
    """DeepSeek-V3.1's format; see the module docstring."""

    name = "deepseek-v3.1"
    families = ("DeepSeek-V3.1", "DeepSeek-V3.1-Terminus", "DeepSeek-V3.2-Exp")
    vllm_tool_parser = "deepseek_v31"
    vllm_reasoning_parser: str | None = "deepseek_v3"

    def split(
        self, text: str, tools: Sequence[ToolSpec] = ()
    ) -> tuple[str, str | None, list[ParsedToolCall]]:
        reader = _Reader()
        events = reader.feed(text) + reader.finish()
        content, reasoning = fold(events, reader.reasoning_seen)
        return content, reasoning, reader.attempts

    def write(self, content: str, reasoning: str | None, calls: Sequence[ToolCall]) -> str:
        head = "" if reasoning is None else f"{reasoning}{THINK_CLOSE}"
        if not calls:
            return f"{head}{content}"
        body = "".join(f"{CALL_BEGIN}{c.name}{SEP}{c.arguments}{CALL_END}" for c in calls)
        return f"{head}{content}{CALLS_BEGIN}{body}{CALLS_END}"

    def stream(self, tools: Sequence[ToolSpec] = ()) -> _Reader:
        return _Reader()

    def detects(self, chat_template: str) -> bool:
        # DeepSeek-V3 (before 3.1) uses the same tokens but writes ```json blocks after the name.
        return (
            CALLS_BEGIN in chat_template and SEP in chat_template and "```json" not in chat_template
        )


DEEPSEEK_V31 = DeepSeekV31Format()
