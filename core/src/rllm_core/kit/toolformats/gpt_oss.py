"""gpt-oss's harmony format: a turn is a sequence of messages on named channels.

The prompt ends with ``<|start|>assistant``, so the completion begins with the first
message's header; later messages start again with ``<|start|>assistant`` (one line, broken
here between messages)::

    <|channel|>analysis<|message|>I should look.<|end|>
    <|start|>assistant<|channel|>commentary<|message|>Let me look.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.read_file <|constrain|>json<|message|>
    {"path": "a.txt"}<|call|>

A message to ``functions.NAME`` (the recipient may also stand in the header before
``<|channel|>``) is a call, its body the JSON arguments; the ``analysis`` channel is the
reasoning; ``final``, and ``commentary`` with no recipient (a preamble before calls), are the
content. Messages of one kind are joined with a newline, and messages to built-in tools
(``python``, ``browser``, ``container``) are left out, as vLLM's harmony parser does. A turn
without calls ends with a ``final`` message and ``<|return|>``.

``<|call|>`` and ``<|return|>`` are stop tokens: a renderer that cuts the completion before
its stop token gives a last message with no terminator. So a call whose body runs to the end
of the text is ``ok`` when the body is a JSON object and ``unterminated`` otherwise (a
completion cut off at ``max_tokens``). A call with an empty name is ``missing_name``, one
whose arguments are not a JSON object ``invalid_json``. Text with no harmony markers at all
is the content, as vLLM reads it.
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

__all__ = ["GPT_OSS", "GptOssFormat"]

START = "<|start|>"
CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
CONSTRAIN = "<|constrain|>"
END = "<|end|>"
RETURN = "<|return|>"
CALL = "<|call|>"
ASSISTANT = f"{START}assistant"

_TERMINATORS = (END, RETURN, CALL)
_MARKERS = (START, CHANNEL, MESSAGE, CONSTRAIN, *_TERMINATORS)
_BUILTIN_TOOLS = frozenset({"python", "browser", "container"})
_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(re.escape(CHANNEL) + r"([^\s<]*)")
_FUNCTIONS = "functions."


def _kind(header: str) -> tuple[str, str | None]:
    """What a message with this header is: ``("tool", name)``, ``("reasoning", None)``,
    ``("content", None)`` or ``("ignore", None)``."""
    found = _RECIPIENT.search(header)
    recipient = found.group(1) if found else None
    channel_match = _CHANNEL.search(header)
    channel = channel_match.group(1) if channel_match else None
    role = header.split(CHANNEL, 1)[0].split(" to=", 1)[0].strip()
    if role not in ("", "assistant"):
        return "ignore", None
    if recipient is not None and recipient != "assistant":
        if recipient.startswith(_FUNCTIONS):
            return "tool", recipient[len(_FUNCTIONS) :]
        if recipient.split(".", 1)[0] not in _BUILTIN_TOOLS:
            return "tool", recipient
    if channel == "analysis":
        return "reasoning", None
    if channel == "final" or (channel == "commentary" and recipient is None):
        return "content", None
    return "ignore", None


class _Reader:
    """One completion's state machine; ``split`` and ``stream`` both run it."""

    def __init__(self) -> None:
        self._lexer = MarkerLexer(_MARKERS)
        self._state = "header"
        self._header: list[str] = []
        self._kind = "ignore"
        self._name = ""
        self._header_text = ""
        self._args: list[str] = []
        self._call_id: str | None = None
        self._message_has_text = False
        self._kind_has_text = {"content": False, "reasoning": False}
        self._saw_marker = False
        self._stray: list[str] = []
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
        if self._state == "header":
            header = "".join(self._header)
            if not self._saw_marker:
                self._text("content", header, out)
            elif _kind(header)[0] == "tool":
                self.attempts.append(
                    ParsedToolCall(status="unterminated", raw=header, error=f"no {MESSAGE}")
                )
        elif self._state == "body":
            self._end_message(terminator=None)
        elif self._state == "between":
            self._flush_stray(out)
        self._state = "done"
        return out

    def _piece(self, piece: str, out: list[StreamEvent]) -> None:
        marker = piece if isinstance(piece, Marker) else None
        piece = str(piece)
        if marker is not None:
            self._saw_marker = True
        state = self._state
        if state == "header":
            if marker == MESSAGE:
                self._open_message(out)
            elif marker == START:
                self._header.clear()
            elif marker in _TERMINATORS:
                self._header.clear()
                self._state = "between"
            else:
                self._header.append(piece)
        elif state == "body":
            if marker in _TERMINATORS:
                self._end_message(terminator=marker)
                self._state = "between"
            elif marker == START:
                self._end_message(terminator=None, cut=True)
                self._state = "header"
            elif self._kind == "tool":
                self._args.append(piece)
                if self._call_id is not None:
                    out.append(ArgumentsDelta(self._started - 1, piece))
            elif self._kind != "ignore":
                self._text(self._kind, piece, out)
        elif state == "between":
            if marker == START:
                self._flush_stray(out)
                self._state = "header"
            else:
                self._stray.append(piece)

    def _open_message(self, out: list[StreamEvent]) -> None:
        header = "".join(self._header)
        self._header.clear()
        self._kind, name = _kind(header)
        self._message_has_text = False
        self._state = "body"
        if self._kind == "reasoning":
            self.reasoning_seen = True
        elif self._kind == "tool":
            self._name = name or ""
            self._header_text = header
            if self._name:
                self._call_id = f"call_{self._started}"
                out.append(ToolCallStart(self._started, self._call_id, self._name))
                self._started += 1

    def _text(self, kind: str, text: str, out: list[StreamEvent]) -> None:
        if not text:
            return
        if not self._message_has_text:
            self._message_has_text = True
            if self._kind_has_text[kind]:
                text = f"\n{text}"
            self._kind_has_text[kind] = True
        out.append(ReasoningDelta(text) if kind == "reasoning" else ContentDelta(text))

    def _flush_stray(self, out: list[StreamEvent]) -> None:
        stray = "".join(self._stray)
        self._stray.clear()
        if stray.strip():
            self._message_has_text = False
            self._text("content", stray, out)

    def _end_message(self, terminator: str | None, cut: bool = False) -> None:
        if self._kind != "tool":
            return
        args = "".join(self._args)
        raw = f"{self._header_text}{MESSAGE}{args}"
        if self._call_id is None:
            attempt = ParsedToolCall(
                status="missing_name", raw=raw, error="the call's recipient names no function"
            )
        else:
            attempt = check_arguments(self._call_id, self._name, args, raw)
            if attempt.status != "ok" and terminator is None:
                attempt = ParsedToolCall(
                    status="unterminated", raw=raw, error=f"no {CALL} after the arguments"
                )
            elif cut:
                attempt = ParsedToolCall(
                    status="unterminated", raw=raw, error=f"a new message began before {CALL}"
                )
        self.attempts.append(attempt)
        self._args.clear()
        self._call_id = None
        self._kind = "ignore"


class GptOssFormat:
    """gpt-oss's harmony format; see the module docstring."""

    name = "gpt-oss"
    families = ("gpt-oss-20b", "gpt-oss-120b")
    vllm_tool_parser = "openai"
    vllm_reasoning_parser: str | None = "openai_gptoss"

    def split(
        self, text: str, tools: Sequence[ToolSpec] = ()
    ) -> tuple[str, str | None, list[ParsedToolCall]]:
        reader = _Reader()
        events = reader.feed(text) + reader.finish()
        content, reasoning = fold(events, reader.reasoning_seen)
        return content, reasoning, reader.attempts

    def write(self, content: str, reasoning: str | None, calls: Sequence[ToolCall]) -> str:
        messages: list[str] = []
        if reasoning is not None:
            messages.append(f"{CHANNEL}analysis{MESSAGE}{reasoning}{END}")
        if calls:
            if content:
                messages.append(f"{CHANNEL}commentary{MESSAGE}{content}{END}")
            messages.extend(
                f"{CHANNEL}commentary to={_FUNCTIONS}{call.name} {CONSTRAIN}json"
                f"{MESSAGE}{call.arguments}{CALL}"
                for call in calls
            )
        else:
            messages.append(f"{CHANNEL}final{MESSAGE}{content}{RETURN}")
        return ASSISTANT.join(messages)

    def stream(self, tools: Sequence[ToolSpec] = ()) -> _Reader:
        return _Reader()

    def detects(self, chat_template: str) -> bool:
        return CHANNEL in chat_template and CALL in chat_template and MESSAGE in chat_template


GPT_OSS = GptOssFormat()
