"""Hermes-style ``<tool_call>`` JSON blocks (Qwen2.5, Qwen3, QwQ, Hermes 2 Pro / 3), with
Qwen3's ``<think>`` reasoning.

An assistant turn is its reasoning (when any), its content, then one block per call,
separated by newlines::

    <think>
    The file is named in the task.
    </think>

    Let me look.
    <tool_call>
    {"name": "read_file", "arguments": {"path": "notes.txt"}}
    </tool_call>

Reasoning is read as :func:`~rllm_core.kit.completions.split_think` reads it, from the text
before the first ``<tool_call>`` (a call ends the reasoning, as in vLLM's ``qwen3`` parser)
of a reply that opens with ``<think>``: up to ``</think>``, or all of it when the block never
closes. With ``opened_think`` (templates that put ``<think>`` in the generation prompt) the
text up to a ``</think>`` is reasoning without the opening tag too.

Reading keeps every attempt: a block whose JSON does not parse is ``invalid_json``, one
without a string ``name`` is ``missing_name``, one never closed (a truncated completion) is
``unterminated``. For a well-formed call the arguments are the exact JSON text the model
wrote, so rendering the call again reproduces its tokens. Text between or after blocks
(which the template never writes) is added to the content on a line of its own, so nothing
the model wrote is lost; vLLM's ``hermes`` parser drops it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from rllm_core.kit.completions import THINK_CLOSE, THINK_OPEN, split_think
from rllm_core.ports.rendering import (
    ArgumentsDelta,
    ContentDelta,
    ReasoningDelta,
    StreamEvent,
    ToolCallStart,
)
from rllm_core.types import ParsedToolCall, ToolCall, ToolSpec

__all__ = [
    "HERMES",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "Hermes",
    "format_tool_call",
    "split_tool_calls",
]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

_HEAD = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*')
_DECODER = json.JSONDecoder()


def format_tool_call(name: str, arguments: str) -> str:
    """One call block; ``arguments`` is inserted as given (JSON text)."""
    return f'{TOOL_CALL_OPEN}\n{{"name": "{name}", "arguments": {arguments}}}\n{TOOL_CALL_CLOSE}'


def _raw_arguments(raw: str) -> str | None:
    """The exact text of the ``arguments`` value when the block is laid out as the template
    writes it (``{"name": ..., "arguments": ...}``), else ``None``."""
    head = _HEAD.match(raw)
    if head is None:
        return None
    try:
        _, end = _DECODER.raw_decode(raw, head.end())
    except ValueError:
        return None
    return raw[head.end() : end] if raw[end:].strip() == "}" else None


def _parse_call(n: int, body: str) -> ParsedToolCall:
    raw = body.strip()
    try:
        payload = json.loads(raw)
    except ValueError as exc:
        return ParsedToolCall(status="invalid_json", raw=raw, error=f"not valid JSON: {exc}")
    name = payload.get("name") if isinstance(payload, dict) else None
    if not isinstance(name, str) or not name:
        return ParsedToolCall(
            status="missing_name", raw=raw, error='the call has no non-empty string "name"'
        )
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):
        text = arguments
    else:
        text = _raw_arguments(raw) or json.dumps(arguments, ensure_ascii=False)
    return ParsedToolCall(
        status="ok", raw=raw, call=ToolCall(id=f"call_{n}", name=name, arguments=text)
    )


def split_tool_calls(text: str) -> tuple[str, list[ParsedToolCall]]:
    """Split an assistant turn's text (without reasoning) into its content and its tool-call
    attempts.

    The content is the text before the first block, without the newline that separates it
    from the block. Text between or after blocks (which the template never writes) is added
    to the content on a line of its own, so nothing the model wrote is lost.
    """
    first = text.find(TOOL_CALL_OPEN)
    if first < 0:
        return text, []
    content = text[:first].removesuffix("\n")
    calls: list[ParsedToolCall] = []
    rest = text[first:]
    while rest:
        body_start = len(TOOL_CALL_OPEN)
        end = rest.find(TOOL_CALL_CLOSE, body_start)
        if end < 0:
            raw = rest[body_start:].strip()
            calls.append(
                ParsedToolCall(status="unterminated", raw=raw, error=f"no {TOOL_CALL_CLOSE}")
            )
            break
        calls.append(_parse_call(len(calls), rest[body_start:end]))
        rest = rest[end + len(TOOL_CALL_CLOSE) :]
        nxt = rest.find(TOOL_CALL_OPEN)
        between = (rest if nxt < 0 else rest[:nxt]).strip()
        if between:
            content = f"{content}\n{between}" if content else between
        rest = "" if nxt < 0 else rest[nxt:]
    return content, calls


def _name(spelled: str) -> str | None:
    """A JSON string's value from its text between the quotes; ``None`` when it is not one."""
    try:
        value = json.loads(f'"{spelled}"')
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def _held(text: str, *markers: str) -> int:
    """How many characters at the end of ``text`` may be the start of one of ``markers``."""
    for size in range(min(len(text), max(len(m) for m in markers) - 1), 0, -1):
        if any(m.startswith(text[-size:]) for m in markers):
            return size
    return 0


class _Stream:
    """Reads a Hermes completion as it streams; see :class:`~rllm_core.ports.rendering.
    ToolCallStream`. The text is kept whole and a position marks what was read; each phase
    sends only what the text after it can no longer change."""

    def __init__(self, opened_think: bool = False) -> None:
        self.opened_think = opened_think
        self.text = ""
        self.pos = 0
        self.phase = "start"
        self.sent = 0  # characters of the current reasoning or content run already sent
        self.content = False  # whether any content was sent
        self.attempts = 0
        self.started = 0
        self.args_from = -1  # where the streamed call's arguments value starts, or -1
        self.scan = 0
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.value_done = False

    def feed(self, text: str) -> list[StreamEvent]:
        self.text += text
        return self._advance(final=False)

    def finish(self) -> list[StreamEvent]:
        return self._advance(final=True)

    def _send(self, kind: type, whole: str, out: list[StreamEvent]) -> None:
        if len(whole) > self.sent:
            out.append(kind(whole[self.sent :]))
            if kind is ContentDelta:
                self.content = True
            self.sent = len(whole)

    def _advance(self, final: bool) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        while True:
            phase = self.phase
            getattr(self, f"_{phase}")(final, out)
            if self.phase == phase:
                return out

    def _start(self, final: bool, out: list[StreamEvent]) -> None:
        t = self.text
        if t.startswith(THINK_OPEN):
            self.pos, self.phase = len(THINK_OPEN), "think"
            return
        if not final and THINK_OPEN.startswith(t):
            return
        if not self.opened_think:
            self.phase = "content"
            return
        close, call = t.find(THINK_CLOSE), t.find(TOOL_CALL_OPEN)
        if close >= 0 and (call < 0 or close < call):
            reasoning, _ = split_think(t[: close + len(THINK_CLOSE)])
            self._send(ReasoningDelta, reasoning or "", out)
            self.pos, self.phase, self.sent = close + len(THINK_CLOSE), "after_think", 0
        elif call >= 0 or final:
            self.phase = "content"
        # else: text before a possible </think> may yet turn out to be reasoning: held back

    def _think(self, final: bool, out: list[StreamEvent]) -> None:
        t = self.text
        close, call = t.find(THINK_CLOSE, self.pos), t.find(TOOL_CALL_OPEN, self.pos)
        if close >= 0 and (call < 0 or close < call):
            self._send(ReasoningDelta, t[self.pos : close].strip("\n"), out)
            self.pos, self.phase, self.sent = close + len(THINK_CLOSE), "after_think", 0
        elif call >= 0:
            self._send(ReasoningDelta, t[self.pos : call].lstrip("\n"), out)
            self.pos, self.phase, self.sent = call, "content", 0
        elif final:
            self._send(ReasoningDelta, t[self.pos :].lstrip("\n"), out)
        else:
            body = t[self.pos :]
            body = body[: len(body) - _held(body, THINK_CLOSE, TOOL_CALL_OPEN)]
            self._send(ReasoningDelta, body.lstrip("\n").rstrip("\n"), out)

    def _after_think(self, final: bool, out: list[StreamEvent]) -> None:
        while self.pos < len(self.text) and self.text[self.pos] == "\n":
            self.pos += 1
        if self.pos < len(self.text) or final:
            self.phase = "content"

    def _content(self, final: bool, out: list[StreamEvent]) -> None:
        t = self.text
        call = t.find(TOOL_CALL_OPEN, self.pos)
        if call >= 0:
            self._send(ContentDelta, t[self.pos : call].removesuffix("\n"), out)
            self.pos, self.phase = call, "block"
        elif final:
            self._send(ContentDelta, t[self.pos :], out)
        else:
            body = t[self.pos :]
            body = body[: len(body) - _held(body, TOOL_CALL_OPEN)]
            self._send(ContentDelta, body.removesuffix("\n"), out)

    def _block(self, final: bool, out: list[StreamEvent]) -> None:
        t = self.text
        start = self.pos + len(TOOL_CALL_OPEN)
        close = t.find(TOOL_CALL_CLOSE, start)
        if self.args_from < 0 and not self.value_done:
            head = _HEAD.match(t, len(t) - len(t[start:].lstrip()))
            if head is not None and head.end() < len(t) and t[head.end()] == "{":
                name = _name(head.group(1))
                if name and (close < 0 or head.end() < close):
                    out.append(ToolCallStart(self.started, f"call_{self.attempts}", name))
                    self.args_from = self.scan = head.end()
        if self.args_from >= 0 and not self.value_done:
            self._scan_arguments(len(t) if close < 0 else close, out)
        if close < 0:
            return
        attempt = _parse_call(self.attempts, t[start:close])
        if attempt.call is not None and self.args_from < 0:
            out.append(ToolCallStart(self.started, attempt.call.id, attempt.call.name))
            out.append(ArgumentsDelta(self.started, attempt.call.arguments))
        if attempt.call is not None or self.args_from >= 0:
            self.started += 1
        self.attempts += 1
        self.args_from, self.value_done = -1, False
        self.pos, self.phase = close + len(TOOL_CALL_CLOSE), "between"

    def _scan_arguments(self, end: int, out: list[StreamEvent]) -> None:
        """Send the arguments object's text up to ``end``, stopping where it closes."""
        t, n = self.text, self.scan
        sent_from = n
        while n < end:
            char = t[n]
            n += 1
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif char == "\\":
                    self.escaped = True
                elif char == '"':
                    self.in_string = False
            elif char == '"':
                self.in_string = True
            elif char in "{[":
                self.depth += 1
            elif char in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.value_done = True
                    break
        if n > sent_from:
            out.append(ArgumentsDelta(self.started, t[sent_from:n]))
        self.scan = n
        if self.value_done:
            self.depth, self.in_string, self.escaped = 0, False, False

    def _between(self, final: bool, out: list[StreamEvent]) -> None:
        t = self.text
        call = t.find(TOOL_CALL_OPEN, self.pos)
        if call < 0 and not final:
            return
        between = (t[self.pos :] if call < 0 else t[self.pos : call]).strip()
        if between:
            out.append(ContentDelta(f"\n{between}" if self.content else between))
            self.content = True
        if call >= 0:
            self.pos, self.phase = call, "block"
        else:
            self.pos = len(t)


@dataclass(frozen=True)
class Hermes:
    """The Hermes format; see the module docstring."""

    name: str = "hermes"
    families: tuple[str, ...] = ("Qwen2.5", "Qwen3", "QwQ", "Hermes 2 Pro / 3")
    vllm_tool_parser: str = "hermes"
    vllm_reasoning_parser: str | None = "qwen3"
    opened_think: bool = False
    """Whether the generation prompt opens the think block (QwQ, Qwen3 thinking-only
    templates): then the text before a ``</think>`` is reasoning though it has no ``<think>``.
    Otherwise only a reply that opens with ``<think>`` has reasoning, and content streams from
    its first token."""

    def split(
        self, text: str, tools: Sequence[ToolSpec] = ()
    ) -> tuple[str, str | None, list[ParsedToolCall]]:
        # The arguments are JSON the model wrote: the offered tools change nothing.
        head, opened, tail = text.partition(TOOL_CALL_OPEN)
        if self.opened_think or head.startswith(THINK_OPEN):
            reasoning, rest = split_think(head)
        else:
            reasoning, rest = None, head
        content, attempts = split_tool_calls(rest + opened + tail)
        return content, reasoning, attempts

    def write(self, content: str, reasoning: str | None, calls: Sequence[ToolCall]) -> str:
        head = f"{THINK_OPEN}\n{reasoning}\n{THINK_CLOSE}\n\n" if reasoning is not None else ""
        blocks = [format_tool_call(c.name, c.arguments) for c in calls]
        return head + "\n".join([content, *blocks] if content or not blocks else blocks)

    def stream(self, tools: Sequence[ToolSpec] = ()) -> _Stream:
        return _Stream(self.opened_think)

    def detects(self, chat_template: str) -> bool:
        return TOOL_CALL_OPEN in chat_template and '"arguments"' in chat_template


HERMES = Hermes()
