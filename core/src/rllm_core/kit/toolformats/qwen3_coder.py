"""Qwen3-Coder and Qwen3.5: each call a ``<function=...>`` block of ``<parameter=...>`` tags::

    <think>
    reasoning
    </think>

    Let me look.

    <tool_call>
    <function=read_file>
    <parameter=path>
    notes.txt
    </parameter>
    </function>
    </tool_call>

A value is the text between its tags less one newline on each side; its JSON type comes
from the offered tool's schema (a string without one), as vLLM's ``qwen3_coder`` parser
reads it. A ``<function=...>`` block without its ``<tool_call>`` is a call too, as vLLM
reads it. Values cannot hold the markers themselves (``</parameter>``, ``<parameter=``,
``</function>``): the format has no escape for them.
"""

from __future__ import annotations

from collections.abc import Sequence

from rllm_core.kit.toolformats import _xmlcalls
from rllm_core.kit.toolformats._xmlcalls import THINK_CLOSE, THINK_OPEN, Attempt
from rllm_core.ports.rendering import ToolCallStream
from rllm_core.types import ParsedToolCall, ToolCall, ToolSpec

__all__ = ["QWEN3_CODER", "Qwen3CoderFormat"]

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
FUNCTION_OPEN, FUNCTION_CLOSE = "<function=", "</function>"
PARAMETER_OPEN, PARAMETER_CLOSE = "<parameter=", "</parameter>"


def _trim_newline(value: str) -> str:
    return value.removeprefix("\n").removesuffix("\n")


class _Syntax:
    openers = (TOOL_CALL_OPEN, FUNCTION_OPEN)

    def scan(self, text: str, start: int, opener: str) -> tuple[list[Attempt], int | None]:
        attempt = Attempt(start=start)
        pos = start + len(opener)
        if opener == TOOL_CALL_OPEN:
            function = pos + (len(text[pos:]) - len(text[pos:].lstrip()))
            if not text.startswith(FUNCTION_OPEN, function):
                if FUNCTION_OPEN.startswith(text[function:]):
                    attempt.raw = text[pos:].strip()
                    return [attempt], None
                close = text.find(TOOL_CALL_CLOSE, pos)
                attempt.raw = text[pos : close if close >= 0 else len(text)].strip()
                attempt.error = f"no {FUNCTION_OPEN}name> in the {TOOL_CALL_OPEN} block"
                if close < 0:
                    return [attempt], None
                attempt.closed, attempt.status = True, "missing_name"
                return [attempt], close + len(TOOL_CALL_CLOSE)
            pos = function + len(FUNCTION_OPEN)
        name_end = text.find(">", pos)
        close = text.find(FUNCTION_CLOSE, pos)
        limit = close if close >= 0 else len(text)
        attempt.raw = text[start:limit].strip()
        if name_end < 0 or name_end > limit:
            return [attempt], None
        attempt.name = text[pos:name_end].strip()
        self._parameters(text, name_end + 1, limit, attempt)
        if close < 0:
            return [attempt], None
        attempt.closed = True
        if not attempt.name:
            attempt.status, attempt.error = "missing_name", f"{FUNCTION_OPEN}> names no function"
        end = close + len(FUNCTION_CLOSE)
        attempt.raw = text[start:end]
        after = end + (len(text[end:]) - len(text[end:].lstrip()))
        if text.startswith(TOOL_CALL_CLOSE, after):
            end = after + len(TOOL_CALL_CLOSE)
            attempt.raw = text[start:end]
        elif TOOL_CALL_CLOSE.startswith(text[after:]):
            # What follows may yet be the block's close: it belongs to the call until then.
            return [attempt], None
        return [attempt], end

    @staticmethod
    def _parameters(text: str, pos: int, limit: int, attempt: Attempt) -> None:
        while True:
            at = text.find(PARAMETER_OPEN, pos, limit)
            if text[pos : at if at >= 0 else limit].strip():
                attempt.status = "invalid_json"
                attempt.error = f"text outside the {PARAMETER_OPEN}...> tags of the call"
            if at < 0:
                return
            name_end = text.find(">", at, limit)
            if name_end < 0:
                return
            value = name_end + 1
            close = text.find(PARAMETER_CLOSE, value, limit)
            following = text.find(PARAMETER_OPEN, value, limit)
            if close >= 0 and (following < 0 or close < following):
                pos = close + len(PARAMETER_CLOSE)
            elif following >= 0:
                close = pos = following
            else:
                if limit < len(text):
                    attempt.status = "invalid_json"
                    attempt.error = f"a parameter is not closed by {PARAMETER_CLOSE}"
                return
            key = text[at + len(PARAMETER_OPEN) : name_end].strip()
            attempt.params.append((key, _trim_newline(text[value:close])))


_SYNTAX = _Syntax()


class Qwen3CoderFormat:
    """The Qwen3-Coder / Qwen3.5 XML tool-call format; see the module docstring."""

    name = "qwen3-coder"
    families = ("Qwen3-Coder", "Qwen3.5")
    vllm_tool_parser = "qwen3_coder"
    vllm_reasoning_parser = "qwen3"

    def split(
        self, text: str, tools: Sequence[ToolSpec] = ()
    ) -> tuple[str, str | None, list[ParsedToolCall]]:
        return _xmlcalls.split(text, _SYNTAX, tools)

    def write(self, content: str, reasoning: str | None, calls: Sequence[ToolCall]) -> str:
        text = "" if reasoning is None else f"{THINK_OPEN}\n{reasoning}\n{THINK_CLOSE}\n\n"
        text += content
        for n, call in enumerate(calls):
            text += ("\n\n" if content.strip() else "") if n == 0 else "\n"
            text += f"{TOOL_CALL_OPEN}\n{FUNCTION_OPEN}{call.name}>\n"
            for key, value in _xmlcalls.call_arguments(call).items():
                written = _xmlcalls.text_value(value, python_scalars=True)
                text += f"{PARAMETER_OPEN}{key}>\n{written}\n{PARAMETER_CLOSE}\n"
            text += f"{FUNCTION_CLOSE}\n{TOOL_CALL_CLOSE}"
        return text

    def stream(self, tools: Sequence[ToolSpec] = ()) -> ToolCallStream:
        return _xmlcalls.XmlCallStream(_SYNTAX, tools)

    def detects(self, chat_template: str) -> bool:
        return FUNCTION_OPEN in chat_template and PARAMETER_OPEN in chat_template


QWEN3_CODER = Qwen3CoderFormat()
