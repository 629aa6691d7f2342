"""The ``<tool_call>`` text format of Qwen-style ChatML templates, written and read back.

An assistant turn is its content followed by one block per call, separated by newlines::

    Let me look.
    <tool_call>
    {"name": "read_file", "arguments": {"path": "notes.txt"}}
    </tool_call>

Reading keeps every attempt: a block whose JSON does not parse is ``invalid_json``, one
without a string ``name`` is ``missing_name``, one never closed (a truncated completion) is
``unterminated``. For a well-formed call the arguments are the exact JSON text the model
wrote, so rendering the call again reproduces its tokens.
"""

from __future__ import annotations

import json
import re

from rllm_core.types import ParsedToolCall, ToolCall

__all__ = ["TOOL_CALL_CLOSE", "TOOL_CALL_OPEN", "format_tool_call", "split_tool_calls"]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

_HEAD = re.compile(r'\{\s*"name"\s*:\s*"(?:[^"\\]|\\.)*"\s*,\s*"arguments"\s*:\s*')
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
    """Split an assistant turn's text into its content and its tool-call attempts.

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
