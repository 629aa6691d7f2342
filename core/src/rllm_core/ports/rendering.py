"""Contract for chat renderers: messages to token ids and back, and, for a renderer that can,
tool calls read from a completion as it streams."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from rllm_core.types import Message, ParsedResponse, RenderedTokens, ToolSpec

__all__ = [
    "ArgumentsDelta",
    "ContentDelta",
    "ReasoningDelta",
    "Renderer",
    "StreamEvent",
    "StreamsToolCalls",
    "ToolCallStart",
    "ToolCallStream",
]


@runtime_checkable
class Renderer(Protocol):
    """A chat template as an object.

    Contract:

    - ``render`` is deterministic and, for templates it claims to cover, equals the reference
      tokenizer's ``apply_chat_template(..., tokenize=True)`` token for token. Every per-token
      list in the result has the length of ``token_ids``. A renderer configured with
      ``literal_control_tokens`` departs from that only where message text spells a control
      token (``<|im_end|>``): that text is then encoded as ordinary text.
    - ``parse_response(ids, tools=None)`` reads sampled completion tokens back into content,
      reasoning and tool calls; malformed tool calls are returned with a non-``ok`` status,
      never dropped. ``tools`` are the tools the request offered (the gateway passes them): a
      renderer whose tool-call syntax writes argument values as bare text types each value by
      its tool's schema; one whose calls carry JSON ignores them. Every implementation accepts
      the argument; without it values are read as the syntax alone says.
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

    def parse_response(
        self, token_ids: Sequence[int], tools: Sequence[ToolSpec] | None = None
    ) -> ParsedResponse: ...

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


@dataclass(frozen=True, slots=True)
class ContentDelta:
    """More content text."""

    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """More reasoning text."""

    text: str


@dataclass(frozen=True, slots=True)
class ToolCallStart:
    """Tool call number ``index`` (0, 1, ...) has begun and its function name is known."""

    index: int
    id: str
    name: str


@dataclass(frozen=True, slots=True)
class ArgumentsDelta:
    """More of tool call ``index``'s arguments JSON text."""

    index: int
    text: str


StreamEvent = ContentDelta | ReasoningDelta | ToolCallStart | ArgumentsDelta


@runtime_checkable
class ToolCallStream(Protocol):
    """Reads one completion's decoded text as it is sampled.

    ``feed(text)`` takes the next decoded text and returns what became certain: content and
    reasoning as soon as they cannot be the start of a call, a call's start once its name is
    complete, its arguments as they arrive. ``finish()`` flushes what is left at the end of
    the completion. Over a whole completion, the content and reasoning deltas concatenate to
    the content and reasoning ``parse_response`` gives for the same tokens (and the same
    ``tools``); its ``ok`` calls are started, in order, and each one's argument deltas
    concatenate to JSON text equal (as a JSON value) to that call's arguments.

    A call is started once its name is read, before the stream can know whether the call will
    be well formed, so calls that ``parse_response`` reports as attempts that are not ``ok``
    may have been started too, and part of their arguments sent: a call cut off by
    ``max_tokens`` (``unterminated``; in a syntax that reads a turn's calls as one attempt,
    such as Llama 4's pythonic list, every call of that attempt), or one whose arguments turn
    out malformed after its name (``invalid_json``). Indices count every call started, so such
    a call shifts the index of the ``ok`` calls after it. No ``ok`` call stands for it: the
    gateway leaves it out of the finished reply's ``tool_calls`` and flags the trace
    ``tool_call_invalid``, while a client that streamed has already seen its start.
    """

    def feed(self, text: str) -> list[StreamEvent]: ...

    def finish(self) -> list[StreamEvent]: ...


@runtime_checkable
class StreamsToolCalls(Protocol):
    """A renderer that reads tool calls while a completion streams: ``tool_call_stream(tools)``
    returns a fresh :class:`ToolCallStream` for one completion, reading it as
    ``parse_response(ids, tools)`` does (``tools``: the tools the request offered, as there).
    The gateway then sends each call's name, then its arguments, as they arrive; without it a
    streamed reply's tool calls go out once the completion ends."""

    def tool_call_stream(self, tools: Sequence[ToolSpec] | None = None) -> ToolCallStream: ...
