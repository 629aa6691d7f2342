"""Qwen3's chat template in Python over text pieces.

What it renders, as Qwen3's Jinja template does:

- No default system message. Offered tools go into a system turn as the ``# Tools`` block,
  after the first message's content when that is a system message.
- The *last query* is the last user message whose content is not a ``<tool_response>``
  block (tool results do not count). An assistant message after it shows its thinking as
  ``<think>\\n{reasoning}\\n</think>\\n\\n`` before its content when it is the last message or
  its reasoning is not empty; every other assistant message is rendered without it. This is
  how the template drops past reasoning once the user asks something new.
- Reasoning comes from ``Message.reasoning``; when that is ``None`` and the content holds a
  ``</think>``, the template splits the content there itself.
- Tool calls follow the content as ``<tool_call>`` blocks with the arguments written as
  given (the template prints string arguments verbatim); tool results share one user turn
  as ``<tool_response>`` blocks.
- With ``enable_thinking=False`` the generation prompt is followed by an empty think block.

``keep_reasoning=True`` changes one rule: every assistant message shows its think block,
wherever it is (empty when it has no reasoning). The render then no longer equals the
Jinja template for earlier turns, but it is exactly the sequence of tokens the model saw
turn after turn, so rendering never rewrites the past.

``<think>`` and ``</think>`` are single added tokens in Qwen3's vocabulary and plain text in
Qwen2.5's; the template works on text, so both vocabularies render as the Jinja template
does with them.
"""

from __future__ import annotations

from collections.abc import Sequence

from rllm_core.kit.completions import THINK_CLOSE, THINK_OPEN
from rllm_core.kit.toolformats.hermes import HERMES, format_tool_call
from rllm_core.types import Message, ParsedToolCall, ToolSpec

from rllm_renderer_chatml.templates import (
    GENERATION_PROMPT,
    ChatTemplate,
    assistant_turn,
    check_roles,
    plain_turn,
    tool_result,
    tools_system_block,
)
from rllm_renderer_chatml.tokenizer import Piece

__all__ = ["EMPTY_THINK", "Qwen3Template", "is_query"]

EMPTY_THINK = f"{THINK_OPEN}\n\n{THINK_CLOSE}\n\n"


def is_query(message: Message) -> bool:
    """Whether the template counts ``message`` as a user query (tool results do not)."""
    content = message.content
    wrapped = content.startswith("<tool_response>") and content.endswith("</tool_response>")
    return message.role == "user" and not wrapped


def _last_query_index(messages: Sequence[Message]) -> int:
    for n in range(len(messages) - 1, -1, -1):
        if is_query(messages[n]):
            return n
    return len(messages) - 1


def split_reasoning(message: Message) -> tuple[str, str]:
    """``(content, reasoning)`` as the template reads them from an assistant message."""
    content = message.content
    if message.reasoning is not None:
        return content, message.reasoning
    if THINK_CLOSE not in content:
        return content, ""
    reasoning = content.split(THINK_CLOSE)[0].rstrip("\n").split(THINK_OPEN)[-1].lstrip("\n")
    return content.split(THINK_CLOSE)[-1].lstrip("\n"), reasoning


class Qwen3Template(ChatTemplate):
    name = "qwen3"
    supports_tools = True
    default_system = ""

    def __init__(self, *, keep_reasoning: bool = False, enable_thinking: bool = True) -> None:
        self.keep_reasoning = keep_reasoning
        self.enable_thinking = enable_thinking

    def generation_prompt(self) -> str:
        return GENERATION_PROMPT + ("" if self.enable_thinking else EMPTY_THINK)

    def assistant_text(self, message: Message, *, show_think: bool) -> tuple[str, str, bool]:
        """``(think, body, think_sampled)``: the think block (``""`` when hidden), the rest of
        the turn before ``<|im_end|>``, and whether the model sampled the think block (an
        empty one after a generation prompt that already holds it was not sampled)."""
        content, reasoning = split_reasoning(message)
        think, body = "", content
        if show_think:
            kept = reasoning.strip("\n")
            think = f"{THINK_OPEN}\n{kept}\n{THINK_CLOSE}\n\n"
            body = content.lstrip("\n")
        for n, call in enumerate(message.tool_calls):
            if n or content:
                body += "\n"
            body += format_tool_call(call.name, call.arguments)
        sampled = self.enable_thinking or think != EMPTY_THINK
        return think, body, sampled

    def _assistant(self, index: int, message: Message, show_think: bool) -> list[Piece]:
        think, body, think_sampled = self.assistant_text(message, show_think=show_think)
        if think_sampled:
            return assistant_turn(index, think + body)
        return assistant_turn(index, body, scaffold=think)

    def _turns(self, messages: Sequence[Message], start: int) -> list[Piece]:
        last_query = _last_query_index(messages)
        last = len(messages) - 1
        out: list[Piece] = []
        for n in range(start, len(messages)):
            m = messages[n]
            if m.role == "assistant":
                _, reasoning = split_reasoning(m)
                shown = n > last_query and (n == last or bool(reasoning))
                out += self._assistant(n, m, self.keep_reasoning or shown)
            elif m.role == "tool":
                out += tool_result(messages, n)
            else:
                out += plain_turn(n, m.role, m.content)
        return out

    def pieces(
        self, messages: Sequence[Message], tools: Sequence[ToolSpec] | None, generation: bool
    ) -> list[Piece]:
        check_roles(messages)
        has_system = messages[0].role == "system"
        out: list[Piece] = []
        if tools:
            lead = messages[0].content + "\n\n" if has_system else ""
            system = f"{lead}{tools_system_block(tools)}"
            out += plain_turn(0 if has_system else -1, "system", system)
        elif has_system:
            out += plain_turn(0, "system", messages[0].content)
        out += self._turns(messages, 1 if has_system else 0)
        if generation:
            out.append(Piece(self.generation_prompt(), -1))
        return out

    def parse(self, text: str) -> tuple[str, str | None, list[ParsedToolCall]]:
        """Read as the ``hermes`` tool-call format reads it; without a think
        block it is ``None``, or ``""`` with ``enable_thinking=False``, whose generation prompt
        already holds the (empty) block."""
        content, reasoning, calls = HERMES.split(text)
        if reasoning is None and not self.enable_thinking:
            reasoning = ""
        return content, reasoning, calls
