"""Llama 3.1 / 3.2 / 3.3 JSON tool calls (vLLM's ``llama3_json`` parser).

The Llama 3 chat template writes a custom tool call as one JSON object, the turn's whole
text; the model may put ``<|python_tag|>`` before it, and vLLM reads several calls separated
by ``;``::

    {"name": "read_file", "parameters": {"path": "notes.txt"}}; {"name": "ls", "parameters": {}}

``write`` emits exactly that (``parameters``, calls joined by ``"; "``), after the content.
``split`` reads calls from ``<|python_tag|>`` or the first ``{"name":`` on, so text before
them stays content (vLLM drops it); ``"arguments"`` is read as well as ``"parameters"``.
Text after the last call is added to the content on a line of its own. Arguments are the
exact JSON text the model wrote when the object is laid out as the template writes it (name
first, then the arguments, then its close). The family has no reasoning syntax.
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

__all__ = ["LLAMA3_JSON", "PYTHON_TAG", "Llama3Json"]

PYTHON_TAG = "<|python_tag|>"

_START = re.compile(r'<\|python_tag\|>|\{\s*"name"\s*:')
# What could still become a call's start at the end of the text so far.
_PARTIAL_START = re.compile(r'\{\s*(?:"(?:n(?:a(?:m(?:e(?:"\s*)?)?)?)?)?)?\Z')
_HEAD = re.compile(
    r'\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*+")\s*,\s*"(?:parameters|arguments)"\s*:\s*(?=[{\[])'
)
_SPACE = re.compile(r"\s*")
_DECODER = json.JSONDecoder()


def _skip_space(text: str, pos: int) -> int:
    match = _SPACE.match(text, pos)
    return match.end() if match else pos


def _call(index: int, raw: str, payload: object) -> ParsedToolCall:
    name = payload.get("name") if isinstance(payload, dict) else None
    if not isinstance(name, str) or not name:
        return ParsedToolCall(
            status="missing_name", raw=raw, error='the call has no non-empty string "name"'
        )
    assert isinstance(payload, dict)
    key = "parameters" if "parameters" in payload else "arguments"
    arguments = payload.get(key, {})
    if not isinstance(arguments, dict):
        return ParsedToolCall(
            status="invalid_json",
            raw=raw,
            error=f'"{key}" of {name!r} is {type(arguments).__name__}, not a JSON object',
        )
    head = _HEAD.match(raw)
    text = None
    if head is not None:
        end = json_value_end(raw, head.end())
        if end is not None and raw[end:].strip() == "}":
            text = raw[head.end() : end]
    if text is None:
        text = json.dumps(arguments, ensure_ascii=False)
    return ParsedToolCall(
        status="ok", raw=raw, call=ToolCall(id=f"call_{index}", name=name, arguments=text)
    )


def _read(text: str) -> tuple[str, list[ParsedToolCall], int]:
    """Content before the calls, the attempts, and where the text after them starts."""
    start = _START.search(text)
    if start is None:
        return text, [], len(text)
    content = text[: start.start()]
    pos = start.start()
    if text.startswith(PYTHON_TAG, pos):
        pos += len(PYTHON_TAG)
    attempts: list[ParsedToolCall] = []
    while True:
        pos = _skip_space(text, pos)
        if pos == len(text) or text[pos] != "{":
            if not attempts:
                raw = text[pos:].strip()
                status = "unterminated" if not raw else "invalid_json"
                error = f"no JSON call object after {PYTHON_TAG}"
                attempts.append(ParsedToolCall(status=status, raw=raw, error=error))
                pos = len(text)
            break
        end = json_value_end(text, pos)
        if end is None:
            attempts.append(
                ParsedToolCall(
                    status="unterminated",
                    raw=text[pos:].strip(),
                    error="the call's JSON object never closes",
                )
            )
            return content, attempts, len(text)
        try:
            payload = json.loads(text[pos:end])
        except ValueError as exc:
            attempts.append(
                ParsedToolCall(
                    status="invalid_json", raw=text[pos:end], error=f"not valid JSON: {exc}"
                )
            )
        else:
            attempts.append(_call(len(attempts), text[pos:end], payload))
        pos = _skip_space(text, end)
        if not text.startswith(";", pos):
            break
        after = _skip_space(text, pos + 1)
        if after == len(text):
            pos = after
            break
        if text[after] != "{":
            break
        pos = after
    return content, attempts, pos


class Llama3Json:
    """The Llama 3 JSON tool-call format; see the module docstring."""

    name = "llama3-json"
    families = ("llama-3.1", "llama-3.2", "llama-3.3", "llama-4")
    vllm_tool_parser = "llama3_json"
    vllm_reasoning_parser: str | None = None

    def split(
        self, text: str, tools: Sequence[ToolSpec] = ()
    ) -> tuple[str, str | None, list[ParsedToolCall]]:
        # The arguments are JSON the model wrote: the offered tools change nothing.
        content, attempts, rest = _read(text)
        return add_trailing(content, text[rest:]), None, attempts

    def write(self, content: str, reasoning: str | None, calls: Sequence[ToolCall]) -> str:
        if reasoning:
            raise ValueError(
                f"llama3-json has no syntax for reasoning, got {reasoning[:40]!r}: pass "
                "reasoning=None, or pick the tool_call_format of a reasoning family"
            )
        parts = []
        for call in calls:
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
            name = json.dumps(call.name, ensure_ascii=False)
            parts.append(f'{{"name": {name}, "parameters": {call.arguments}}}')
        return content + "; ".join(parts)

    def stream(self, tools: Sequence[ToolSpec] = ()) -> ToolCallStream:
        return ProgressStream(_progress, self.split)

    def detects(self, chat_template: str) -> bool:
        # Llama 3.x templates name the python tag; Llama 4's own template writes the same
        # JSON object (with <|header_start|> headers) unless it is a pythonic one.
        return PYTHON_TAG in chat_template or (
            '"parameters"' in chat_template
            and ("<|start_header_id|>" in chat_template or "<|header_start|>" in chat_template)
        )


def _progress(text: str) -> Progress:
    start = _START.search(text)
    if start is None:
        tail = _PARTIAL_START.search(text)
        cut = tail.start() if tail is not None else len(text)
        return Progress(content=text[: cut - held_back(text[:cut], [PYTHON_TAG])])
    progress = Progress(content=text[: start.start()])
    pos = start.start()
    if text.startswith(PYTHON_TAG, pos):
        pos += len(PYTHON_TAG)
    while True:
        pos = _skip_space(text, pos)
        if pos == len(text) or text[pos] != "{":
            return progress
        end = json_value_end(text, pos)
        if end is not None:
            attempt = _call(len(progress.calls), text[pos:end], _loads(text[pos:end]))
            if attempt.call is None:
                return progress
            progress.calls.append((attempt.call.name, attempt.call.arguments))
            pos = _skip_space(text, end)
            if not text.startswith(";", pos):
                return progress
            pos += 1
            continue
        head = _HEAD.match(text, pos)
        if head is None:
            return progress
        try:
            name = json.loads(head.group(1))
        except ValueError:
            return progress
        if name:
            arguments_end = json_value_end(text, head.end()) or len(text)
            progress.calls.append((name, text[head.end() : arguments_end]))
        return progress


def _loads(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None


LLAMA3_JSON = Llama3Json()
