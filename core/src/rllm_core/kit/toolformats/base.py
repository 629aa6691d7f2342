"""What a tool-call format is: how one model family writes tool calls (and, where it has one,
its reasoning) into an assistant turn's text, read back and written again.

Contract of a :class:`ToolCallFormat`:

- ``split(text, tools=())`` reads decoded completion text (special tokens kept as text) into
  ``(content, reasoning, attempts)``. It never raises: a call it cannot read is an attempt
  with a status other than ``ok`` (``invalid_json``, ``missing_name``, ``unterminated``),
  its ``raw`` text kept, so a malformed call is visible on the trace rather than lost. For an
  ``ok`` call, ``call.arguments`` is JSON text of an object; ids are ``call_0``, ``call_1``,
  ... in order, except in a family whose calls carry their own id, which its template writes
  back (Kimi-K2's ``functions.NAME:N``): the id is then the model's, and ``write`` writes it.
  Text the model wrote outside the calls stays in the content. ``tools`` are the tools the
  request offered: a format that writes argument values as bare text (the
  XML-style ones) reads each value as the JSON type its tool's schema gives it, as vLLM
  does, and as a string where no offered tool describes it; other formats ignore them.
- ``write(content, reasoning, calls)`` is the text the model writes for such a turn, in the
  family's own syntax, so that ``split(write(c, r, calls))`` gives back ``c``, ``r`` and the
  calls (their arguments equal as JSON values; as text where the syntax carries JSON text).
- ``stream(tools=())`` returns a fresh :class:`~rllm_core.ports.rendering.ToolCallStream` for one
  streamed completion: its events are the port's ``ContentDelta``, ``ReasoningDelta``,
  ``ToolCallStart`` and ``ArgumentsDelta``; ``tools`` as for ``split``.
- ``detects(chat_template)`` says whether a chat template writes tool calls this way (the
  family's own markers in its text).
- ``vllm_tool_parser`` and ``vllm_reasoning_parser`` name vLLM's parsers for the family
  (``--tool-call-parser``, ``--reasoning-parser``): the oracle the tests compare against.

Formats register in :mod:`rllm_core.kit.toolformats` under their ``name``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from rllm_core.ports.rendering import ToolCallStream
from rllm_core.types import ParsedToolCall, ToolCall, ToolSpec

__all__ = ["ToolCallFormat"]


@runtime_checkable
class ToolCallFormat(Protocol):
    """One family's tool-call (and reasoning) syntax; see the module docstring."""

    name: str
    families: tuple[str, ...]
    vllm_tool_parser: str
    vllm_reasoning_parser: str | None

    def split(
        self, text: str, tools: Sequence[ToolSpec] = ()
    ) -> tuple[str, str | None, list[ParsedToolCall]]: ...

    def write(self, content: str, reasoning: str | None, calls: Sequence[ToolCall]) -> str: ...

    def stream(self, tools: Sequence[ToolSpec] = ()) -> ToolCallStream: ...

    def detects(self, chat_template: str) -> bool: ...
