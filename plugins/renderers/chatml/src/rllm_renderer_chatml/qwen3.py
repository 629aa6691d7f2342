"""The ``qwen3`` renderer: Qwen3's thinking template, with a reasoning-retention policy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rllm_core.kit.completions import THINK_CLOSE, THINK_OPEN, assistant_message
from rllm_core.models import resolve_tokenizer
from rllm_core.types import Message, ToolSpec

from rllm_renderer_chatml.qwen3_template import Qwen3Template, is_query
from rllm_renderer_chatml.renderer import ChatMLRenderer
from rllm_renderer_chatml.templates import GENERATION_PROMPT
from rllm_renderer_chatml.tokenizer import Piece, TextTokenizer

if TYPE_CHECKING:
    from rllm_renderer_chatml.plugin import Qwen3Config

__all__ = ["Qwen3Renderer"]

_USER_HEADER = "<|im_start|>user\n"


class Qwen3Renderer(ChatMLRenderer):
    """Renders Qwen3's template and reads ``<think>`` blocks into ``ParsedResponse.reasoning``.

    Retention policy (``keep_reasoning``), and what ``bridge_to_next_turn`` does with it:

    - ``False`` (the template's own behaviour): past reasoning is dropped once the user asks
      something new, so the next prompt is not an extension of the last one. The bridge
      appends the new messages only when the template's full render of the next turn keeps
      ``prompt + completion`` unchanged and returns ``None`` otherwise (the gateway then
      re-renders: a reset). In practice it bridges over tool results after a turn whose
      reasoning is not empty, and over a new user message when no think block has been shown
      since the last one (``enable_thinking=False`` always shows an empty block, so there it
      bridges over neither). The check re-renders the sampled turn as the template will and
      compares token ids, so it cannot accept a prompt the template would not produce.
    - ``True``: every assistant turn keeps its think block (see
      :mod:`rllm_renderer_chatml.qwen3_template`), the render never rewrites the past and the bridge
      always extends, exactly like the ``chatml`` renderer.
    """

    def __init__(
        self,
        tokenizer: TextTokenizer,
        template: Qwen3Template,
        *,
        literal_control_tokens: bool = False,
        tool_call_format: str = "hermes",
    ) -> None:
        super().__init__(
            tokenizer,
            template,
            literal_control_tokens=literal_control_tokens,
            tool_call_format=tool_call_format,
        )
        self.template: Qwen3Template = template
        self.im_start = tokenizer.require_token("<|im_start|>")
        self._header_ids = tokenizer.encode(GENERATION_PROMPT)

    @classmethod
    def from_config(cls, config: Qwen3Config) -> Qwen3Renderer:  # type: ignore[override]
        template = Qwen3Template(
            keep_reasoning=config.keep_reasoning, enable_thinking=config.enable_thinking
        )
        return cls(
            TextTokenizer(resolve_tokenizer(config.tokenizer)),
            template,
            literal_control_tokens=config.literal_control_tokens,
            tool_call_format=config.tool_call_format,
        )

    def _last_query_end(self, prompt: list[int]) -> int | None:
        """Where the turn of the last user query ends in ``prompt`` (``None``: no query)."""
        end = len(prompt)
        for start in range(len(prompt) - 1, -1, -1):
            if prompt[start] != self.im_start:
                continue
            text = self.tokenizer.decode(prompt[start:end])
            turn_end, end = end, start
            if text.startswith(_USER_HEADER):
                content = text[len(_USER_HEADER) :].removesuffix("\n").removesuffix("<|im_end|>")
                if is_query(Message(role="user", content=content)):
                    return turn_end
        return None

    def _bridge_keeps_prefix(
        self,
        prompt: list[int],
        body: list[int],
        truncated: bool,
        new_messages: Sequence[Message],
        tools: Sequence[ToolSpec] | None,
    ) -> bool:
        if self.template.keep_reasoning:
            return True
        query_end = self._last_query_end(prompt)
        new_query = any(is_query(m) for m in new_messages)
        if new_query and query_end is not None:
            since = self.tokenizer.decode(
                prompt[query_end : len(prompt) - len(self._generation_ids)]
            )
            if THINK_OPEN in since or THINK_CLOSE in since:
                return False
        message = assistant_message(self.parse_response(body, tools))
        if message is None:
            return False
        reasoning = bool(message.reasoning)
        show = not new_query and query_end is not None and reasoning
        think, text, _ = self.template.assistant_text(message, show_think=show)
        pieces = [Piece(GENERATION_PROMPT, -1), Piece(think + text, -1, True, True)]
        expected = self.tokenizer.render(pieces, literal=self.literal_control_tokens)
        return expected.token_ids == self._generation_ids + body
