"""What the XML-style formats (Qwen3-Coder, GLM-4.5/4.7, MiniMax-M2) share.

These families write each argument as text between tags, so a value's JSON type is not in
the text: like vLLM, :func:`typed_arguments` reads a value as the type the offered tool's
JSON schema gives its parameter, and keeps it a string without one.

:func:`read` reads a completion as far as its text shows it: the reasoning (a ``<think>``
block, or text before a ``</think>`` the prompt opened), the content, and each call block
as a :class:`Attempt` that a format's :class:`Syntax` scans. ``split`` reads the whole text;
:class:`XmlCallStream` reads the text so far each time more arrives and sends what was added,
holding back a tail that could still become a marker, so a streamed completion reads as the
whole text does.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from rllm_core.ports.rendering import (
    ArgumentsDelta,
    ContentDelta,
    ReasoningDelta,
    StreamEvent,
    ToolCallStart,
)
from rllm_core.types import ParsedToolCall, ToolCall, ToolSpec

__all__ = [
    "THINK_CLOSE",
    "THINK_OPEN",
    "Attempt",
    "Syntax",
    "XmlCallStream",
    "read",
    "split",
    "text_value",
    "typed_arguments",
]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

Status = Literal["ok", "invalid_json", "missing_name", "unterminated"]


@dataclass
class Attempt:
    """One call as far as the text shows it: its name once complete, the parameters whose
    values are complete (raw text, in order), and ``closed`` once its end was read."""

    start: int
    name: str | None = None
    params: list[tuple[str, str]] = field(default_factory=list)
    closed: bool = False
    raw: str = ""
    status: Status = "ok"
    error: str | None = None


class Syntax(Protocol):
    """How one format opens and reads its call blocks."""

    openers: tuple[str, ...]

    def scan(self, text: str, start: int, opener: str) -> tuple[list[Attempt], int | None]:
        """The attempts in the block that ``opener`` opens at ``start``, and where the block
        ends (``None``: not within ``text``, which then belongs to the block to its end)."""
        ...


# --------------------------------------------------------------------------------------------
# Types from the tool's schema
# --------------------------------------------------------------------------------------------

_ALIASES = {
    "str": "string",
    "text": "string",
    "int": "integer",
    "long": "integer",
    "float": "number",
    "double": "number",
    "bool": "boolean",
    "dict": "object",
    "list": "array",
}
_ORDER = ("null", "integer", "number", "boolean", "object", "array", "string")


def _schema_types(schema: Any) -> set[str]:
    if not isinstance(schema, dict):
        return {"string"}
    types: set[str] = set()
    declared = schema.get("type")
    if isinstance(declared, str):
        types.add(declared)
    elif isinstance(declared, list):
        types.update(t for t in declared if isinstance(t, str))
    enum = schema.get("enum")
    if isinstance(enum, list):
        for value in enum:
            types.add(_json_type(value))
    for key in ("anyOf", "oneOf", "allOf"):
        choices = schema.get(key)
        if isinstance(choices, list):
            for choice in choices:
                types |= _schema_types(choice)
    return {_ALIASES.get(t.strip().lower(), t.strip().lower()) for t in types} or {"string"}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True


def _loads(text: str) -> tuple[bool, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return False, None
    return _finite(value), value


def _typed(text: str, types: set[str]) -> Any:
    """``text`` read as the first of ``types`` it reads as (null, integer, number, boolean,
    object, array, string), else as JSON, else as the string itself."""
    for kind in _ORDER:
        if kind not in types:
            continue
        if kind == "string":
            return text
        if kind == "null" and text.lower() == "null":
            return None
        if kind == "integer":
            try:
                return int(text)
            except ValueError:
                continue
        if kind == "number":
            try:
                number = float(text)
            except ValueError:
                continue
            if math.isfinite(number):
                return int(number) if number == int(number) else number
        if kind == "boolean":
            word = text.strip().lower()
            if word in ("true", "1", "false", "0"):
                return word in ("true", "1")
        if kind in ("object", "array"):
            ok, value = _loads(text)
            if ok:
                return value
    ok, value = _loads(text)
    return value if ok else text


def _properties(tools: Sequence[ToolSpec], name: str) -> dict[str, Any]:
    for tool in tools:
        if tool.name == name:
            properties = tool.parameters.get("properties")
            return properties if isinstance(properties, dict) else {}
    return {}


def typed_arguments(
    name: str, params: Sequence[tuple[str, str]], tools: Sequence[ToolSpec]
) -> dict[str, Any]:
    """A call's arguments: each parameter's text as its schema's type in the offered tool
    called ``name`` (a string where the tool, or the parameter, is not offered)."""
    properties = _properties(tools, name)
    arguments: dict[str, Any] = {}
    for key, text in params:
        schema = properties.get(key)
        arguments[key] = _typed(text, _schema_types(schema)) if isinstance(schema, dict) else text
    return arguments


def text_value(value: Any, *, python_scalars: bool = False) -> str:
    """How a template writes an argument value: a string as is, anything else as JSON
    (``python_scalars``: booleans as Python writes them, ``True``/``False``)."""
    if isinstance(value, str):
        return value
    if python_scalars and isinstance(value, bool):
        return str(value)
    return json.dumps(value, ensure_ascii=False)


def call_arguments(call: ToolCall) -> dict[str, Any]:
    """A call's arguments as an object, to write as tags; a ``ValueError`` names the call
    whose arguments are not a JSON object."""
    try:
        arguments = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError as exc:
        raise ValueError(
            f"tool call {call.id!r} ({call.name}) has arguments that are not JSON ({exc});"
            " this format writes each argument as a tag, so they must be a JSON object"
        ) from exc
    if not isinstance(arguments, dict):
        raise ValueError(
            f"tool call {call.id!r} ({call.name}) has arguments that are a"
            f" {type(arguments).__name__}, not a JSON object; this format writes each"
            " argument as a tag"
        )
    return arguments


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


def _held(tail: str, markers: Sequence[str]) -> int:
    """How many characters at the end of ``tail`` could be the start of a marker."""
    for n in range(min(len(tail), max(len(m) for m in markers) - 1), 0, -1):
        end = tail[-n:]
        if any(m.startswith(end) for m in markers):
            return n
    return 0


def _first(text: str, markers: Sequence[str], start: int) -> tuple[int, str]:
    best, found = -1, ""
    for marker in markers:
        at = text.find(marker, start)
        if at >= 0 and (best < 0 or at < best):
            best, found = at, marker
    return best, found


@dataclass
class Reading:
    """What a completion's text shows so far; ``decided`` is false while it cannot yet be
    told whether its opening text is reasoning."""

    decided: bool
    reasoning: str | None = None
    content: str = ""
    attempts: list[Attempt] = field(default_factory=list)


def read(text: str, syntax: Syntax, final: bool) -> Reading:
    """Read ``text``; unless ``final``, more may follow, so nothing that more text could
    change is read yet.

    Reasoning is the text of a leading ``<think>`` block, which a ``</think>`` or the first
    call ends (a block never ended is all reasoning); without one, text before a
    ``</think>`` that comes before any call (the prompt opened the block). Content is the
    text outside reasoning and calls, its surrounding whitespace removed.
    """
    openers = syntax.openers
    stripped = text.lstrip()
    reasoning: str | None = None
    pos = 0
    if stripped.startswith(THINK_OPEN):
        start = len(text) - len(stripped) + len(THINK_OPEN)
        end, _ = _first(text, (THINK_CLOSE,), start)
        call, _ = _first(text, openers, start)
        if end >= 0 and (call < 0 or end < call):
            reasoning, pos = text[start:end], end + len(THINK_CLOSE)
        elif call >= 0:
            reasoning, pos = text[start:call], call
        else:
            tail = text[start:]
            if not final:
                tail = tail[: len(tail) - _held(tail, (THINK_CLOSE, *openers))]
            return Reading(decided=True, reasoning=tail.strip("\n"))
    elif not final and THINK_OPEN.startswith(stripped):
        return Reading(decided=False)
    else:
        end, _ = _first(text, (THINK_CLOSE,), 0)
        call, _ = _first(text, openers, 0)
        if end >= 0 and (call < 0 or end < call):
            reasoning, pos = text[:end], end + len(THINK_CLOSE)
        elif call < 0 and not final:
            return Reading(decided=False)
    content: list[str] = []
    attempts: list[Attempt] = []
    while True:
        at, opener = _first(text, openers, pos)
        if at < 0:
            tail = text[pos:]
            if not final:
                tail = tail[: len(tail) - _held(tail, openers)]
            content.append(tail)
            break
        content.append(text[pos:at])
        found, end = syntax.scan(text, at, opener)
        attempts.extend(found)
        if end is None:
            break
        pos = end
    return Reading(
        decided=True,
        reasoning=None if reasoning is None else reasoning.strip("\n"),
        content="".join(content).strip(),
        attempts=attempts,
    )


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _arguments_text(name: str, params: Sequence[tuple[str, str]], tools: Sequence[ToolSpec]) -> str:
    return json.dumps(typed_arguments(name, params, tools), ensure_ascii=False)


def split(
    text: str, syntax: Syntax, tools: Sequence[ToolSpec]
) -> tuple[str, str | None, list[ParsedToolCall]]:
    """The format's ``split``: the whole of ``text`` read, each attempt's status settled."""
    reading = read(text, syntax, final=True)
    parsed: list[ParsedToolCall] = []
    for n, attempt in enumerate(reading.attempts):
        if not attempt.closed:
            parsed.append(
                ParsedToolCall(
                    status="unterminated",
                    raw=attempt.raw,
                    error=attempt.error or "the completion ended inside the call",
                )
            )
        elif attempt.status != "ok" or not attempt.name:
            parsed.append(
                ParsedToolCall(
                    status="missing_name" if not attempt.name else attempt.status,
                    raw=attempt.raw,
                    error=attempt.error or "the call names no function",
                )
            )
        else:
            arguments = _arguments_text(attempt.name, attempt.params, tools)
            call = ToolCall(id=f"call_{n}", name=attempt.name, arguments=arguments)
            parsed.append(ParsedToolCall(status="ok", raw=attempt.raw, call=call))
    return reading.content, reading.reasoning, parsed


class XmlCallStream:
    """A :class:`~rllm_core.ports.rendering.ToolCallStream` over one format's syntax.

    A call starts once its name is complete; its arguments arrive one parameter at a time,
    each once its value is complete (its type may depend on all of it), as the JSON text
    ``split`` gives for the call. A call that the completion leaves unfinished has started
    but never closes its arguments: ``split`` reports it ``unterminated``.
    """

    def __init__(self, syntax: Syntax, tools: Sequence[ToolSpec] = ()) -> None:
        self._syntax = syntax
        self._tools = tuple(tools)
        self._text = ""
        self._reasoning = ""
        self._content = ""
        self._started: dict[int, int] = {}  # attempt number -> call index
        self._params_sent: dict[int, int] = {}
        self._closed: set[int] = set()

    def feed(self, text: str) -> list[StreamEvent]:
        self._text += text
        return self._events(final=False)

    def finish(self) -> list[StreamEvent]:
        return self._events(final=True)

    def _events(self, final: bool) -> list[StreamEvent]:
        reading = read(self._text, self._syntax, final)
        events: list[StreamEvent] = []
        if not reading.decided:
            return events
        if reading.reasoning is not None and len(reading.reasoning) > len(self._reasoning):
            events.append(ReasoningDelta(reading.reasoning[len(self._reasoning) :]))
            self._reasoning = reading.reasoning
        if len(reading.content) > len(self._content):
            events.append(ContentDelta(reading.content[len(self._content) :]))
            self._content = reading.content
        for n, attempt in enumerate(reading.attempts):
            if not attempt.name or attempt.status != "ok" or n in self._closed:
                continue
            if n not in self._started:
                self._started[n] = len(self._started)
                self._params_sent[n] = 0
                events.append(
                    ToolCallStart(index=self._started[n], id=f"call_{n}", name=attempt.name)
                )
            index = self._started[n]
            sent = self._params_sent[n]
            pieces: list[str] = []
            for key, text in attempt.params[sent:]:
                value = typed_arguments(attempt.name, [(key, text)], self._tools)[key]
                pieces.append("{" if sent == 0 and not pieces else ", ")
                pieces.append(f"{_dumps(key)}: {_dumps(value)}")
            self._params_sent[n] = len(attempt.params)
            if attempt.closed:
                pieces.append("}" if attempt.params else "{}")
                self._closed.add(n)
            if pieces:
                events.append(ArgumentsDelta(index=index, text="".join(pieces)))
        return events
