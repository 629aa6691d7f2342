"""Contract for chat renderers: messages to token ids and back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from rllm_core.types import Message, ParsedResponse, RenderedTokens, ToolSpec

__all__ = ["Renderer"]


@runtime_checkable
class Renderer(Protocol):
    """A chat template as an object.

    Contract:

    - ``render`` is deterministic and, for templates it claims to cover, equals the reference
      tokenizer's ``apply_chat_template(..., tokenize=True)`` token for token. Every per-token
      list in the result has the length of ``token_ids``. A renderer configured with
      ``literal_control_tokens`` departs from that only where message text spells a control
      token (``<|im_end|>``): that text is then encoded as ordinary text.
    - ``parse_response(ids)`` reads sampled completion tokens back into content, reasoning and
      tool calls; malformed tool calls are returned with a non-``ok`` status, never dropped.
    - ``stop_token_ids()`` lists the ids that end an assistant turn.
    - ``encode(text)`` / ``decode(ids)`` expose the underlying tokenizer for plain text (no
      special tokens added), for completion-style requests and display.
    - ``bridge_to_next_turn(prev_prompt, prev_completion, new_messages)`` returns the next
      prompt, whose first ``len(prev_prompt) + len(prev_completion)`` ids are exactly
      ``prev_prompt + prev_completion``, or ``None`` when that cannot be proven. It refuses
      (returns ``None``) when ``new_messages`` contains an assistant message. Tokens sampled
      after the turn-close token stay in the prefix (they were given to the model), and the
      appended delta is the one that follows a clean close; when the completion was truncated
      before its close, the delta starts with the synthesized close token.

    Example::

        rendered = renderer.render([Message(role="user", content="2+2?")],
                                   add_generation_prompt=True)
        sampled = sampler.sample(rendered.token_ids)
        nxt = renderer.bridge_to_next_turn(rendered.token_ids, sampled,
                                           [Message(role="user", content="and 3+3?")])
    """

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] | None = None,
        add_generation_prompt: bool = False,
    ) -> RenderedTokens: ...

    def parse_response(self, token_ids: Sequence[int]) -> ParsedResponse: ...

    def stop_token_ids(self) -> list[int]: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def bridge_to_next_turn(
        self,
        prev_prompt_ids: Sequence[int],
        prev_completion_ids: Sequence[int],
        new_messages: Sequence[Message],
        tools: Sequence[ToolSpec] | None = None,
    ) -> list[int] | None: ...
