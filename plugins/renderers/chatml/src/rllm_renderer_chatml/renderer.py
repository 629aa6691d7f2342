"""The ``chatml`` renderer: a ChatML template in Python over a ``tokenizer.json``."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rllm_core.kit import toolformats
from rllm_core.kit.completions import parse_completion, split_at_stop
from rllm_core.models import resolve_tokenizer
from rllm_core.ports.rendering import ToolCallStream
from rllm_core.types import Message, ParsedResponse, RenderedTokens, ToolSpec

from rllm_renderer_chatml.templates import TEMPLATES, ChatTemplate, detect_template
from rllm_renderer_chatml.tokenizer import TextTokenizer, load_chat_template

if TYPE_CHECKING:
    from rllm_renderer_chatml.plugin import ChatMLConfig

__all__ = ["ChatMLRenderer"]


class ChatMLRenderer:
    """Renders with a :class:`~rllm_renderer_chatml.templates.ChatTemplate`, reads sampled
    tokens back, and bridges to the next turn without re-tokenizing the past.

    ``stop_token_ids()`` is ``[<|im_end|>, <|endoftext|>]``; ``<|im_end|>`` closes a turn.

    ``bridge_to_next_turn(prompt, completion, new_messages)`` returns
    ``prompt + completion + delta`` where ``delta`` is what the template writes after a closed
    assistant turn: a newline, the new messages and the generation prompt. When the
    completion was cut before its ``<|im_end|>`` the delta starts with a synthesized
    ``<|im_end|>``; tokens sampled after the ``<|im_end|>`` stay where they are. It returns
    ``None`` when a new message is an assistant message, when ``prompt`` does not end with
    the generation prompt, or when the completion stopped on ``<|endoftext|>`` without
    closing its turn (no template writes that). ChatML templates render every turn
    independently of what follows, so the bridged prompt equals the full render of the
    conversation whenever the completion is what the template renders for the parsed
    message.

    With ``literal_control_tokens``, a control token (an added token marked special, such as
    ``<|im_end|>``) spelled inside message text (content, reasoning, tool calls and their
    arguments, tool results) is encoded as ordinary text, so no message can close its turn or
    open another; the template's own markup stays special. Text that spells no control token
    renders exactly as without it, and the bridge keeps its prefix either way.

    Subclasses (the ``qwen3`` renderer) refine when a bridge keeps the template's prefix by
    overriding :meth:`_bridge_keeps_prefix`.
    """

    def __init__(
        self,
        tokenizer: TextTokenizer,
        template: ChatTemplate,
        *,
        literal_control_tokens: bool = False,
        tool_call_format: str = "hermes",
    ) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.literal_control_tokens = literal_control_tokens
        self.tool_call_format = toolformats.get(tool_call_format)
        # The template's own reading is the hermes format's, with its reasoning conventions.
        self._template_reads = tool_call_format == "hermes"
        tokenizer.require_token("<|im_start|>")
        self.im_end = tokenizer.require_token("<|im_end|>")
        self.end_of_text = tokenizer.require_token("<|endoftext|>")
        self._generation_ids = tokenizer.encode(template.generation_prompt())

    @classmethod
    def from_config(cls, config: ChatMLConfig) -> ChatMLRenderer:
        tokenizer = TextTokenizer(resolve_tokenizer(config.tokenizer))
        name = config.template
        if name == "auto":
            name = detect_template(load_chat_template(tokenizer.folder), config.tokenizer)
        template = TEMPLATES[name](default_system=config.default_system)
        return cls(
            tokenizer,
            template,
            literal_control_tokens=config.literal_control_tokens,
            tool_call_format=config.tool_call_format,
        )

    # ---------------------------------------------------------------- render

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] | None = None,
        add_generation_prompt: bool = False,
    ) -> RenderedTokens:
        pieces = self.template.pieces(list(messages), tools or None, add_generation_prompt)
        return self.tokenizer.render(pieces, literal=self.literal_control_tokens)

    # ---------------------------------------------------------------- tokens and text

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(token_ids)

    def stop_token_ids(self) -> list[int]:
        return [self.im_end, self.end_of_text]

    def parse_response(
        self, token_ids: Sequence[int], tools: Sequence[ToolSpec] | None = None
    ) -> ParsedResponse:
        if self._template_reads:
            parse = self.template.parse
        else:
            parse = functools.partial(self.tool_call_format.split, tools=tools or ())
        return parse_completion(token_ids, self.stop_token_ids(), self.tokenizer.decode, parse)

    def tool_call_stream(self, tools: Sequence[ToolSpec] | None = None) -> ToolCallStream:
        return self.tool_call_format.stream(tools=tools or ())

    # ---------------------------------------------------------------- bridge

    def _bridge_keeps_prefix(
        self,
        prompt: list[int],
        body: list[int],
        truncated: bool,
        new_messages: Sequence[Message],
        tools: Sequence[ToolSpec] | None,
    ) -> bool:
        """Whether the template's full render of the next turn keeps ``prompt + body``
        unchanged; ``body`` is the completion before its close token."""
        return True

    def bridge_to_next_turn(
        self,
        prev_prompt_ids: Sequence[int],
        prev_completion_ids: Sequence[int],
        new_messages: Sequence[Message],
        tools: Sequence[ToolSpec] | None = None,
    ) -> list[int] | None:
        if any(m.role == "assistant" for m in new_messages):
            return None
        # The gateway passes lists: copying a long prompt would cost more than the rest.
        prompt = prev_prompt_ids if isinstance(prev_prompt_ids, list) else list(prev_prompt_ids)
        completion = list(prev_completion_ids)
        gen = self._generation_ids
        if len(prompt) < len(gen) or prompt[len(prompt) - len(gen) :] != gen:
            return None
        body, stop = split_at_stop(completion, self.stop_token_ids())
        if stop is not None and completion[stop] != self.im_end:
            return None
        truncated = stop is None
        if not self._bridge_keeps_prefix(prompt, body, truncated, new_messages, tools or None):
            return None
        delta = [self.im_end] if truncated else []
        pieces = self.template.continuation(new_messages, tools or None)
        delta += self.tokenizer.render(pieces, literal=self.literal_control_tokens).token_ids
        bridged = prompt + completion
        bridged += delta
        return bridged
