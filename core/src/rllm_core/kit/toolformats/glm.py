"""GLM-4.5/4.6 and GLM-4.7: the function name, then ``<arg_key>``/``<arg_value>`` pairs.

GLM-4.5 and 4.6 put each tag on a line of its own::

    <think>reasoning</think>
    Let me look.
    <tool_call>read_file
    <arg_key>path</arg_key>
    <arg_value>notes.txt</arg_value>
    </tool_call>

GLM-4.7 writes the same tags with nothing between them (``<tool_call>read_file<arg_key>path
</arg_key><arg_value>notes.txt</arg_value></tool_call>``), and its prompt opens the think
block. Both read the same way, as vLLM's ``glm45``/``glm47`` parser (one parser) reads them:
the name and keys without surrounding whitespace, a value exactly as written, its JSON type
from the offered tool's schema (a string without one). A value or key cannot hold the
markers themselves (``</arg_value>``, ``</arg_key>``, ``</tool_call>``).
"""

from __future__ import annotations

from collections.abc import Sequence

from rllm_core.kit.toolformats import _xmlcalls
from rllm_core.kit.toolformats._xmlcalls import THINK_CLOSE, THINK_OPEN, Attempt
from rllm_core.ports.rendering import ToolCallStream
from rllm_core.types import ParsedToolCall, ToolCall, ToolSpec

__all__ = ["GLM45", "GLM47", "GlmFormat"]

TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
KEY_OPEN, KEY_CLOSE = "<arg_key>", "</arg_key>"
VALUE_OPEN, VALUE_CLOSE = "<arg_value>", "</arg_value>"


class _Syntax:
    openers = (TOOL_CALL_OPEN,)

    def scan(self, text: str, start: int, opener: str) -> tuple[list[Attempt], int | None]:
        attempt = Attempt(start=start)
        pos = start + len(opener)
        close = text.find(TOOL_CALL_CLOSE, pos)
        limit = close if close >= 0 else len(text)
        attempt.raw = text[start : close + len(TOOL_CALL_CLOSE) if close >= 0 else limit]
        key = text.find(KEY_OPEN, pos, limit)
        if key >= 0 or close >= 0:
            attempt.name = text[pos : key if key >= 0 else limit].strip()
        if key >= 0:
            self._pairs(text, key, limit, attempt)
        if close < 0:
            return [attempt], None
        attempt.closed = True
        if not attempt.name:
            attempt.status, attempt.error = "missing_name", f"{TOOL_CALL_OPEN} names no function"
        return [attempt], close + len(TOOL_CALL_CLOSE)

    @staticmethod
    def _pairs(text: str, pos: int, limit: int, attempt: Attempt) -> None:
        closed = limit < len(text)
        while pos < limit:
            at = text.find(KEY_OPEN, pos, limit)
            if text[pos : at if at >= 0 else limit].strip():
                attempt.status = "invalid_json"
                attempt.error = f"text outside the {KEY_OPEN}/{VALUE_OPEN} pairs of the call"
            if at < 0:
                return
            key_end = text.find(KEY_CLOSE, at, limit)
            value = text.find(VALUE_OPEN, key_end, limit) if key_end >= 0 else -1
            value_end = text.find(VALUE_CLOSE, value, limit) if value >= 0 else -1
            between = text[key_end + len(KEY_CLOSE) : value] if value >= 0 else ""
            if value_end < 0 or between.strip():
                if closed:
                    attempt.status = "invalid_json"
                    attempt.error = (
                        f"an {KEY_OPEN} without its {VALUE_OPEN}...{VALUE_CLOSE} in the call"
                    )
                return
            key = text[at + len(KEY_OPEN) : key_end].strip()
            attempt.params.append((key, text[value + len(VALUE_OPEN) : value_end]))
            pos = value_end + len(VALUE_CLOSE)


_SYNTAX = _Syntax()


class GlmFormat:
    """One GLM generation's tool-call format; see the module docstring. ``compact`` is
    GLM-4.7's layout (no newlines between the tags)."""

    families: tuple[str, ...]

    def __init__(
        self, name: str, families: tuple[str, ...], vllm_tool_parser: str, *, compact: bool
    ) -> None:
        self.name = name
        self.families = families
        self.vllm_tool_parser = vllm_tool_parser
        self.vllm_reasoning_parser: str | None = vllm_tool_parser
        self.compact = compact

    def split(
        self, text: str, tools: Sequence[ToolSpec] = ()
    ) -> tuple[str, str | None, list[ParsedToolCall]]:
        return _xmlcalls.split(text, _SYNTAX, tools)

    def write(self, content: str, reasoning: str | None, calls: Sequence[ToolCall]) -> str:
        gap = "" if self.compact else "\n"
        parts = [] if reasoning is None else [f"{THINK_OPEN}{reasoning}{THINK_CLOSE}"]
        if content:
            parts.append(content)
        for call in calls:
            pairs = "".join(
                f"{gap}{KEY_OPEN}{key}{KEY_CLOSE}{gap}"
                f"{VALUE_OPEN}{_xmlcalls.text_value(value)}{VALUE_CLOSE}"
                for key, value in _xmlcalls.call_arguments(call).items()
            )
            parts.append(f"{TOOL_CALL_OPEN}{call.name}{pairs}{gap}{TOOL_CALL_CLOSE}")
        return gap.join(parts)

    def stream(self, tools: Sequence[ToolSpec] = ()) -> ToolCallStream:
        return _xmlcalls.XmlCallStream(_SYNTAX, tools)

    def detects(self, chat_template: str) -> bool:
        if KEY_OPEN not in chat_template or VALUE_OPEN not in chat_template:
            return False
        return (f"{KEY_CLOSE}{VALUE_OPEN}" in chat_template) == self.compact


GLM47 = GlmFormat("glm-4.7", ("GLM-4.7", "GLM-5"), "glm47", compact=True)
GLM45 = GlmFormat("glm-4.5", ("GLM-4.5", "GLM-4.6"), "glm45", compact=False)
