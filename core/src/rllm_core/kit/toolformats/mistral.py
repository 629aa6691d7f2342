"""Mistral tool calls and reasoning (vLLM's ``mistral`` tool and reasoning parsers).

Tokenizers v11 and later (Mistral Small 3.2, Magistral, Devstral, Ministral) write each call
as ``[TOOL_CALLS]`` then its name, ``[ARGS]`` and its JSON arguments (v11 may put
``[CALL_ID]<id>`` before ``[ARGS]``); thinking models (v13+) open the turn with their
reasoning between ``[THINK]`` and ``[/THINK]``::

    [THINK]The file is small.[/THINK]Reading it.[TOOL_CALLS]read_file[ARGS]{"path": "a.txt"}

``write`` emits exactly that. ``split`` also reads what older tokenizers (before v11) write,
``[TOOL_CALLS]`` then a JSON list of ``{"name": ..., "arguments": {...}}`` objects (or one
such object), and a name followed directly by its ``{`` arguments. Text before the first
``[TOOL_CALLS]`` (less the reasoning) is the content; text after a call's arguments is added
to it on a line of its own. Arguments are the exact JSON text after ``[ARGS]``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from rllm_core.kit.toolformats._progress import (
    Progress,
    ProgressStream,
    add_trailing,
    held_back,
    json_value_end,
)
from rllm_core.ports.rendering import ToolCallStream
from rllm_core.types import ParsedToolCall, ToolCall, ToolSpec

__all__ = ["ARGS", "CALL_ID", "MISTRAL", "THINK_END", "THINK_START", "TOOL_CALLS", "Mistral"]

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
THINK_START = "[THINK]"
THINK_END = "[/THINK]"

_NAME_END = re.compile(r"\[ARGS\]|\[CALL_ID\]|\{")
_BAD_NAME = re.compile(r"[\s\[\]{}]")


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos


def _head(text: str) -> tuple[str, str | None]:
    """Content and reasoning of the text before the first call."""
    start = text.find(THINK_START)
    if start < 0:
        return text, None
    end = text.find(THINK_END, start)
    if end < 0:
        return text[:start], text[start + len(THINK_START) :]
    return text[:start] + text[end + len(THINK_END) :], text[start + len(THINK_START) : end]


def _arguments(index: int, name: str, raw: str, arguments: str) -> ParsedToolCall:
    if not name:
        return ParsedToolCall(status="missing_name", raw=raw, error="the call has no name")
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
        status="ok", raw=raw, call=ToolCall(id=f"call_{index}", name=name, arguments=arguments)
    )


def _legacy(index: int, raw: str) -> list[ParsedToolCall]:
    """The calls in the JSON list (or object) that tokenizers before v11 write."""
    try:
        value = json.loads(raw)
    except ValueError as exc:
        return [ParsedToolCall(status="invalid_json", raw=raw, error=f"not valid JSON: {exc}")]
    attempts: list[ParsedToolCall] = []
    for item in value if isinstance(value, list) else [value]:
        text = json.dumps(item, ensure_ascii=False)
        name = item.get("name") if isinstance(item, dict) else None
        if not isinstance(name, str) or not name:
            attempts.append(
                ParsedToolCall(
                    status="missing_name", raw=text, error='the call has no non-empty "name"'
                )
            )
            continue
        assert isinstance(item, dict)
        arguments = item.get("arguments", {})
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        attempts.append(_arguments(index + len(attempts), name, text, arguments))
    return attempts


def _legacy_start(segment: str, start: int) -> bool:
    return (
        start < len(segment)
        and segment[start] in "[{"
        and not segment.startswith((ARGS, CALL_ID), start)
    )


def _segment(index: int, segment: str, last: bool) -> tuple[list[ParsedToolCall], str]:
    """The attempts in the text after one ``[TOOL_CALLS]``, and the text after them."""
    cut_off = "unterminated" if last else "invalid_json"
    start = _skip_space(segment, 0)
    if _legacy_start(segment, start):
        end = json_value_end(segment, start)
        if end is None:
            raw = segment.strip()
            return [ParsedToolCall(status=cut_off, raw=raw, error="the JSON never closes")], ""
        return _legacy(index, segment[start:end]), segment[end:]
    name_end = _NAME_END.search(segment)
    if name_end is None:
        raw = segment.strip()
        error = f"no {ARGS} after the call's name"
        return [ParsedToolCall(status=cut_off, raw=raw, error=error)], ""
    name = segment[: name_end.start()].strip()
    pos = name_end.start()
    if segment.startswith(CALL_ID, pos):
        args = segment.find(ARGS, pos)
        if args < 0:
            raw = segment.strip()
            error = f"no {ARGS} after {CALL_ID}"
            return [ParsedToolCall(status=cut_off, raw=raw, error=error)], ""
        pos = args
    if segment.startswith(ARGS, pos):
        pos += len(ARGS)
    pos = _skip_space(segment, pos)
    if pos == len(segment) or segment[pos] not in "[{":
        raw = segment.strip()
        status = cut_off if pos == len(segment) else "invalid_json"
        error = f"the arguments of {name!r} are not a JSON object"
        return [ParsedToolCall(status=status, raw=raw, error=error)], ""
    end = json_value_end(segment, pos)
    if end is None:
        raw = segment.strip()
        error = f"the arguments of {name!r} never close"
        return [ParsedToolCall(status=cut_off, raw=raw, error=error)], ""
    raw = segment[:end].strip()
    return [_arguments(index, name, raw, segment[pos:end])], segment[end:]


class Mistral:
    """The Mistral tool-call and reasoning format; see the module docstring."""

    name = "mistral"
    families = ("mistral-small", "magistral", "devstral", "ministral", "mistral-large")
    vllm_tool_parser = "mistral"
    vllm_reasoning_parser: str | None = "mistral"

    def split(
        self, text: str, tools: Sequence[ToolSpec] = ()
    ) -> tuple[str, str | None, list[ParsedToolCall]]:
        # The arguments are JSON the model wrote: the offered tools change nothing.
        first = text.find(TOOL_CALLS)
        if first < 0:
            content, reasoning = _head(text)
            return content, reasoning, []
        content, reasoning = _head(text[:first])
        segments = text[first + len(TOOL_CALLS) :].split(TOOL_CALLS)
        attempts: list[ParsedToolCall] = []
        trailing = ""
        for n, segment in enumerate(segments):
            last = n == len(segments) - 1
            if not segment.strip() and not last:
                continue
            found, after = _segment(len(attempts), segment, last)
            attempts.extend(found)
            trailing = add_trailing(trailing, after)
        return add_trailing(content, trailing), reasoning, attempts

    def write(self, content: str, reasoning: str | None, calls: Sequence[ToolCall]) -> str:
        parts = [] if reasoning is None else [THINK_START, reasoning, THINK_END]
        parts.append(content)
        for call in calls:
            if not call.name or _BAD_NAME.search(call.name):
                raise ValueError(
                    f"tool call {call.id!r} is named {call.name!r}: mistral writes a name "
                    "between [TOOL_CALLS] and [ARGS], so it must be non-empty, without "
                    "spaces or brackets"
                )
            try:
                arguments = json.loads(call.arguments)
            except ValueError as exc:
                raise ValueError(
                    f"tool call {call.id!r} ({call.name}) has arguments that are not JSON: "
                    f"{call.arguments[:80]!r} ({exc})"
                ) from exc
            if not isinstance(arguments, dict):
                raise ValueError(
                    f"tool call {call.id!r} ({call.name}) has arguments "
                    f"{call.arguments[:80]!r}, not a JSON object"
                )
            parts += [TOOL_CALLS, call.name, ARGS, call.arguments]
        return "".join(parts)

    def stream(self, tools: Sequence[ToolSpec] = ()) -> ToolCallStream:
        return ProgressStream(_progress, self.split)

    def detects(self, chat_template: str) -> bool:
        return TOOL_CALLS in chat_template


def _progress(text: str) -> Progress:
    first = text.find(TOOL_CALLS)
    if first < 0:
        visible = text[: len(text) - held_back(text, (TOOL_CALLS, THINK_START, THINK_END))]
        content, reasoning = _head(visible)
        return Progress(content=content, reasoning=reasoning or "")
    content, reasoning = _head(text[:first])
    progress = Progress(content=content, reasoning=reasoning or "")
    segments = text[first + len(TOOL_CALLS) :].split(TOOL_CALLS)
    count = 0
    for n, segment in enumerate(segments):
        if n < len(segments) - 1:
            if not segment.strip():
                continue
            found, _ = _segment(count, segment, last=False)
            if any(a.call is None for a in found):
                return progress
            progress.calls += [(a.call.name, a.call.arguments) for a in found if a.call]
            count += len(found)
            continue
        start = _skip_space(segment, 0)
        name_end = _NAME_END.search(segment)
        if start == len(segment) or _legacy_start(segment, start) or name_end is None:
            return progress
        name = segment[: name_end.start()].strip()
        pos = name_end.start()
        if segment.startswith(CALL_ID, pos):
            pos = segment.find(ARGS, pos)
            if pos < 0:
                return progress
        if segment.startswith(ARGS, pos):
            pos += len(ARGS)
        pos = _skip_space(segment, pos)
        if not name or pos == len(segment) or segment[pos] != "{":
            return progress
        end = json_value_end(segment, pos) or len(segment)
        progress.calls.append((name, segment[pos:end]))
    return progress


MISTRAL = Mistral()
