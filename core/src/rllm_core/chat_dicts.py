"""rllm-core records as plain dictionaries in the OpenAI chat shape, which Hugging Face chat
templates also read."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

from rllm_core.types import Message, ToolSpec

__all__ = ["message_dicts", "tool_dicts"]


def tool_dicts(tools: Sequence[ToolSpec] | None) -> list[dict[str, Any]] | None:
    """Tools in the OpenAI function-tool shape: ``{"type": "function", "function": {name,
    description, parameters}}``; ``None`` for no tools."""
    if not tools:
        return None
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools
    ]


def _arguments(text: str, mode: Literal["object", "string"]) -> Any:
    if mode == "string":
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


def message_dicts(
    messages: Sequence[Message], *, arguments: Literal["object", "string"] = "object"
) -> list[dict[str, Any]]:
    """One dictionary per message: ``role`` and ``content`` always; ``reasoning_content`` when
    the message has reasoning; ``tool_calls`` (``{"id", "type": "function", "function":
    {"name", "arguments"}}``, the arguments decoded from JSON with ``arguments="object"``),
    ``tool_call_id`` and ``name`` when set."""
    out = []
    for m in messages:
        d: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.reasoning is not None:
            d["reasoning_content"] = m.reasoning
        if m.tool_calls:
            d["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": _arguments(c.arguments, arguments)},
                }
                for c in m.tool_calls
            ]
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        if m.name is not None:
            d["name"] = m.name
        out.append(d)
    return out
