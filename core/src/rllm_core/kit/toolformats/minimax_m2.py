"""MiniMax-M2: a ``<minimax:tool_call>`` block of ``<invoke>`` calls with ``<parameter>`` tags::

    <think>
    reasoning
    </think>

    Let me look.
    <minimax:tool_call>
    <invoke name="read_file">
    <parameter name="path">notes.txt</parameter>
    </invoke>
    </minimax:tool_call>

The prompt opens the think block, so a completion starts inside its reasoning. Each
``<invoke>`` is one call; a value is the text between its tags exactly, its JSON type from
the offered tool's schema (a string without one), as vLLM's ``minimax_m2`` parser reads it.
Names may be quoted with ``"`` or ``'`` or not at all. A value cannot hold the markers
themselves (``</parameter>``, ``<parameter name=``, ``</invoke>``).
"""

from __future__ import annotations

from collections.abc import Sequence

from rllm_core.kit.toolformats import _xmlcalls
from rllm_core.kit.toolformats._xmlcalls import THINK_CLOSE, THINK_OPEN, Attempt
from rllm_core.ports.rendering import ToolCallStream
from rllm_core.types import ParsedToolCall, ToolCall, ToolSpec

__all__ = ["MINIMAX_M2", "MinimaxM2Format"]

BLOCK_OPEN, BLOCK_CLOSE = "<minimax:tool_call>", "</minimax:tool_call>"
INVOKE_OPEN, INVOKE_CLOSE = "<invoke name=", "</invoke>"
PARAMETER_OPEN, PARAMETER_CLOSE = "<parameter name=", "</parameter>"


def _quoted_name(text: str, pos: int, limit: int) -> tuple[str, int] | None:
    """The name that starts at ``pos`` (``"name"``, ``'name'`` or ``name``) and where the
    ``>`` after it ends, or ``None`` while the text does not show its end."""
    quote = text[pos : pos + 1]
    if quote in ('"', "'"):
        end = text.find(quote + ">", pos + 1, limit)
        return None if end < 0 else (text[pos + 1 : end].strip(), end + 2)
    end = text.find(">", pos, limit)
    return None if end < 0 else (text[pos:end].strip(), end + 1)


class _Syntax:
    openers = (BLOCK_OPEN, INVOKE_OPEN)

    def scan(self, text: str, start: int, opener: str) -> tuple[list[Attempt], int | None]:
        if opener == INVOKE_OPEN:
            attempt, end = self._invoke(text, start)
            return [attempt], end
        pos = start + len(opener)
        attempts: list[Attempt] = []
        while True:
            at = text.find(INVOKE_OPEN, pos)
            block_end = text.find(BLOCK_CLOSE, pos)
            if block_end >= 0 and (at < 0 or block_end < at):
                self._stray(text, pos, block_end, attempts)
                return attempts, block_end + len(BLOCK_CLOSE)
            if at < 0:
                return attempts, None
            self._stray(text, pos, at, attempts)
            attempt, end = self._invoke(text, at)
            attempts.append(attempt)
            if end is None:
                return attempts, None
            pos = end

    @staticmethod
    def _stray(text: str, pos: int, end: int, attempts: list[Attempt]) -> None:
        if text[pos:end].strip():
            attempts.append(
                Attempt(
                    start=pos,
                    raw=text[pos:end].strip(),
                    closed=True,
                    status="missing_name",
                    error=f"text outside an {INVOKE_OPEN}...> call in the {BLOCK_OPEN} block",
                )
            )

    def _invoke(self, text: str, start: int) -> tuple[Attempt, int | None]:
        attempt = Attempt(start=start)
        close = text.find(INVOKE_CLOSE, start)
        limit = close if close >= 0 else len(text)
        attempt.raw = text[start : close + len(INVOKE_CLOSE) if close >= 0 else limit]
        named = _quoted_name(text, start + len(INVOKE_OPEN), limit)
        if named is not None:
            attempt.name, pos = named
            self._parameters(text, pos, limit, attempt)
        if close < 0:
            return attempt, None
        attempt.closed = True
        if not attempt.name:
            attempt.status, attempt.error = "missing_name", f"{INVOKE_OPEN}> names no function"
        return attempt, close + len(INVOKE_CLOSE)

    @staticmethod
    def _parameters(text: str, pos: int, limit: int, attempt: Attempt) -> None:
        closed = limit < len(text)
        while True:
            at = text.find(PARAMETER_OPEN, pos, limit)
            if text[pos : at if at >= 0 else limit].strip():
                attempt.status = "invalid_json"
                attempt.error = f"text outside the {PARAMETER_OPEN}...> tags of the call"
            if at < 0:
                return
            named = _quoted_name(text, at + len(PARAMETER_OPEN), limit)
            if named is None:
                return
            key, value = named
            end = text.find(PARAMETER_CLOSE, value, limit)
            following = text.find(PARAMETER_OPEN, value, limit)
            if end >= 0 and (following < 0 or end < following):
                pos = end + len(PARAMETER_CLOSE)
            elif following >= 0:
                end = pos = following
            else:
                if closed:
                    attempt.status = "invalid_json"
                    attempt.error = f"a parameter is not closed by {PARAMETER_CLOSE}"
                return
            attempt.params.append((key, text[value:end]))


_SYNTAX = _Syntax()


class MinimaxM2Format:
    """The MiniMax-M2 tool-call format; see the module docstring."""

    name = "minimax-m2"
    families = ("MiniMax-M2", "MiniMax-M2.1", "MiniMax-M2.5")
    vllm_tool_parser = "minimax_m2"
    vllm_reasoning_parser = "minimax_m2"

    def split(
        self, text: str, tools: Sequence[ToolSpec] = ()
    ) -> tuple[str, str | None, list[ParsedToolCall]]:
        return _xmlcalls.split(text, _SYNTAX, tools)

    def write(self, content: str, reasoning: str | None, calls: Sequence[ToolCall]) -> str:
        text = "" if reasoning is None else f"{THINK_OPEN}\n{reasoning}\n{THINK_CLOSE}\n\n"
        text += content
        if calls:
            text += f"\n{BLOCK_OPEN}\n" if content else f"{BLOCK_OPEN}\n"
            for call in calls:
                text += f'{INVOKE_OPEN}"{call.name}">\n'
                for key, value in _xmlcalls.call_arguments(call).items():
                    written = _xmlcalls.text_value(value)
                    text += f'{PARAMETER_OPEN}"{key}">{written}{PARAMETER_CLOSE}\n'
                text += f"{INVOKE_CLOSE}\n"
            text += BLOCK_CLOSE
        return text

    def stream(self, tools: Sequence[ToolSpec] = ()) -> ToolCallStream:
        return _xmlcalls.XmlCallStream(_SYNTAX, tools)

    def detects(self, chat_template: str) -> bool:
        return BLOCK_OPEN in chat_template and INVOKE_OPEN in chat_template


MINIMAX_M2 = MinimaxM2Format()
