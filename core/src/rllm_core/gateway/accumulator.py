"""The token accumulator: decides, per chat request, which token ids the model is given.

One :class:`TokenAccumulator` per session. Inside a session, requests fall into **lineages**: a
lineage is the chain of calls that share a first message, so a sub-agent with its own system
prompt gets its own chain and does not break its parent's. Each lineage remembers its *head*:
the last request it served, the assistant reply the gateway produced for it, and the prompt
and completion token ids of that call.

A request is classified against the head of its lineage (:meth:`TokenAccumulator.plan`):

- ``root``: the lineage has no head yet (its first call): the conversation is rendered.
- ``extend``: the request's messages start with the head's messages and the reply, and add at
  least one non-assistant message. In cumulative mode the next prompt is
  ``renderer.bridge_to_next_turn(prompt, completion, new_messages, tools)``, so the model
  continues from exactly the tokens it was given and produced.
- ``replay``: the same messages, tools and sampling parameters as the head's request (an
  upstream retry): the same prompt is sampled again and the head's trace is overwritten.
- ``reset`` with a reason: the conversation is rendered in full and becomes a new root in the
  same lineage. A request whose messages do not extend the head's is a *history break*,
  ``history_truncated``, ``history_summarized`` or ``history_edited``, described by a
  :class:`~rllm_core.gateway.history.HistoryBreak` (:attr:`TurnPlan.history_break`: where the
  messages first differ, how many recorded messages were kept, dropped and replaced; see
  :mod:`rllm_core.gateway.history`). The other reasons: ``tools_changed`` (the messages extend
  but the tools differ), ``empty_delta`` (nothing but assistant messages was added) and
  ``renderer_no_bridge`` (the renderer could not prove the prefix).

A request whose first message is new starts a new lineage. When it holds a run of another
lineage's recorded messages that ends with that lineage's last reply, the agent rewrote its
first message too (a truncation or summary from the very start): the new lineage's first call
is then a ``reset`` as well, its break naming that lineage as ``source``. A sub-agent with its
own conversation shares no reply with its parent and starts a plain ``root``.

Messages are compared after normalization: role, content, name, ``tool_call_id``, tool calls
by name and canonical JSON arguments (their ids are ignored), and reasoning only when the
renderer renders it and the request carries it (clients commonly drop it).

Plain (non-cumulative) mode classifies the same way but always renders the full conversation;
the record chains to the head when the render starts with the head's prompt + completion,
token for token, and is otherwise a root with reason ``renderer_no_bridge``.

The accumulator never samples: the engine calls :meth:`~TokenAccumulator.plan` with the
lineage's lock held, samples, then :meth:`~TokenAccumulator.commit`. A plan that is never
committed (the sampler failed, the prompt was too long) leaves no trace in the state.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from rllm_core.gateway.history import (
    HISTORY_REASONS,
    HistoryBreak,
    continuation,
    history_break,
)
from rllm_core.ports import Renderer
from rllm_core.types import Message, SamplingParams, ToolCall, ToolSpec

__all__ = [
    "EMPTY_DELTA",
    "RENDERER_NO_BRIDGE",
    "RESET_REASONS",
    "TOOLS_CHANGED",
    "Lineage",
    "MessageKey",
    "TokenAccumulator",
    "TurnPlan",
    "message_key",
    "renderer_keeps_reasoning",
]

logger = logging.getLogger("rllm_core.gateway")

TOOLS_CHANGED = "tools_changed"
EMPTY_DELTA = "empty_delta"
RENDERER_NO_BRIDGE = "renderer_no_bridge"
RESET_REASONS = (*HISTORY_REASONS, TOOLS_CHANGED, EMPTY_DELTA, RENDERER_NO_BRIDGE)

Mode = Literal["root", "extend", "replay", "reset"]

MessageKey = tuple[str, str, str | None, tuple[tuple[str, str], ...], str | None, str | None]
"""``(role, content, name, ((tool name, canonical arguments), ...), tool_call_id, reasoning)``."""


def _canonical_arguments(arguments: str) -> str:
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _call_key(call: ToolCall) -> tuple[str, str]:
    return (call.name, _canonical_arguments(call.arguments))


def message_key(message: Message, *, keep_reasoning: bool) -> MessageKey:
    """The normalized form two messages are compared in (see the module docstring)."""
    calls = message.tool_calls
    return (
        message.role,
        message.content or "",
        message.name,
        tuple(map(_call_key, calls)) if calls else (),
        message.tool_call_id,
        message.reasoning if keep_reasoning else None,
    )


def _same(recorded: MessageKey, incoming: MessageKey) -> bool:
    """Whether an incoming message matches a recorded one; reasoning the client left out
    (``None``) matches any recorded reasoning."""
    if recorded[:5] != incoming[:5]:
        return False
    return incoming[5] is None or incoming[5] == recorded[5]


def _role(key: MessageKey) -> str:
    return key[0]


def renderer_keeps_reasoning(renderer: Renderer) -> bool:
    """Whether ``renderer`` renders a past assistant turn's reasoning into the prompt.

    Probed once by rendering a short conversation with and without reasoning on its assistant
    turn. A renderer that fails the probe is assumed to keep it, the safer answer: reasoning a
    request carries is then compared.
    """
    user, again = Message(role="user", content="Hi."), Message(role="user", content="Again.")
    plain = Message(role="assistant", content="Hello.")
    thought = Message(role="assistant", content="Hello.", reasoning="A greeting.")
    try:
        without = renderer.render([user, plain, again], add_generation_prompt=True)
        with_reasoning = renderer.render([user, thought, again], add_generation_prompt=True)
    except Exception:
        return True
    return without.token_ids != with_reasoning.token_ids


def _first_divergence(recorded: Sequence[MessageKey], incoming: Sequence[MessageKey]) -> int | None:
    """Index of the first incoming message that differs from the recorded one, the length of
    the shorter when one is a prefix of the other, or ``None`` when ``incoming`` extends
    (or equals) ``recorded``."""
    if tuple(incoming[: len(recorded)]) == tuple(recorded):
        # Equal keys are the same messages; only the reasoning rule of _same needs the loop.
        return None
    for index, (old, new) in enumerate(zip(recorded, incoming, strict=False)):
        if not _same(old, new):
            return index
    if len(incoming) < len(recorded):
        return len(incoming)
    return None


@dataclass
class Head:
    """What a lineage remembers of its last call."""

    request: tuple[MessageKey, ...]
    tools: tuple[ToolSpec, ...]
    params: SamplingParams
    recorded: tuple[MessageKey, ...]
    prompt: list[int]
    completion: list[int]
    trace_id: str
    parent_trace_id: str | None
    prompt_delta: list[int]
    turn: int
    request_delta: tuple[Message, ...]
    reset_reason: str | None
    history_break: HistoryBreak | None


@dataclass
class Lineage:
    """One chain of calls inside a session. Hold ``lock`` from plan to commit."""

    lineage_id: str
    first: MessageKey
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    head: Head | None = None


@dataclass(frozen=True)
class TurnPlan:
    """What to sample for one request, and how to record it.

    ``prompt_token_ids`` is what the sampler must receive. The record stores
    ``prompt_delta_token_ids`` under ``parent_trace_id`` (a root: the full prompt, parent
    ``None``). ``request_delta`` are the request's messages new to the lineage (all of them for
    a root). ``history_break`` describes a history break and ``divergent_message`` is its
    ``at``, the first message that differs.
    """

    lineage: Lineage
    mode: Mode
    prompt_token_ids: list[int]
    prompt_delta_token_ids: list[int]
    parent_trace_id: str | None
    trace_id: str
    turn: int
    request: tuple[MessageKey, ...]
    tools: tuple[ToolSpec, ...]
    params: SamplingParams
    request_delta: tuple[Message, ...]
    reset_reason: str | None = None
    divergent_message: int | None = None
    history_break: HistoryBreak | None = None

    @property
    def lineage_id(self) -> str:
        return self.lineage.lineage_id


_UUID4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_UUID4_SET = (0x4000 << 64) | (0x8000 << 48)


def new_trace_id() -> str:
    """A random version-4 UUID as 32 hex digits (``uuid.uuid4().hex``, without building the
    ``UUID`` object)."""
    value = int.from_bytes(os.urandom(16), "big") & _UUID4_CLEAR | _UUID4_SET
    return f"{value:032x}"


class TokenAccumulator:
    """The lineages of one session and their heads; see the module docstring.

    ``keep_reasoning`` is :func:`renderer_keeps_reasoning` of the renderer, computed once by
    the caller and shared across sessions.
    """

    def __init__(
        self,
        session_id: str,
        renderer: Renderer,
        *,
        cumulative: bool = True,
        keep_reasoning: bool = True,
    ) -> None:
        self.session_id = session_id
        self.renderer = renderer
        self.cumulative = cumulative
        self.keep_reasoning = keep_reasoning
        self._by_first: dict[MessageKey, Lineage] = {}
        self.resets: Counter[str] = Counter()
        self.turns = 0
        self.replays = 0

    # ---------------------------------------------------------------- lineages

    def lineage_for(self, messages: Sequence[Message]) -> Lineage:
        """The lineage whose first message is ``messages[0]``; a new one when there is none.

        The first lineage of a session is ``main``, later ones ``lineage-1``, ``lineage-2`` ...
        """
        if not messages:
            raise ValueError("a chat request needs at least one message")
        first = message_key(messages[0], keep_reasoning=False)
        lineage = self._by_first.get(first)
        if lineage is None:
            n = len(self._by_first)
            lineage = Lineage(lineage_id="main" if n == 0 else f"lineage-{n}", first=first)
            self._by_first[first] = lineage
        return lineage

    def lineages(self) -> list[str]:
        """Ids of the lineages that recorded at least one call, in creation order."""
        return [lin.lineage_id for lin in self._by_first.values() if lin.head is not None]

    # ---------------------------------------------------------------- classification

    def plan(
        self,
        lineage: Lineage,
        messages: Sequence[Message],
        tools: Sequence[ToolSpec] = (),
        params: SamplingParams | None = None,
    ) -> TurnPlan:
        """Classify a request in ``lineage`` and build its prompt. Changes no state."""
        params = params if params is not None else SamplingParams()
        tools = tuple(tools)
        keep = self.keep_reasoning
        keys = tuple([message_key(m, keep_reasoning=keep) for m in messages])
        head = lineage.head
        if head is None:
            continued = self._continued(lineage, keys)
            if continued is not None:
                return self._root(lineage, messages, keys, tools, params, 0, continued)
            return self._root(lineage, messages, keys, tools, params, turn=0)

        if keys == head.request and tools == head.tools and params == head.params:
            return TurnPlan(
                lineage=lineage,
                mode="replay",
                prompt_token_ids=head.prompt,
                prompt_delta_token_ids=head.prompt_delta,
                parent_trace_id=head.parent_trace_id,
                trace_id=head.trace_id,
                turn=head.turn,
                request=keys,
                tools=tools,
                params=params,
                request_delta=head.request_delta,
                reset_reason=head.reset_reason,
                history_break=head.history_break,
            )

        turn = head.turn + 1
        divergent = _first_divergence(head.recorded, keys)
        if divergent is not None:
            rewrite = history_break(head.recorded, keys, divergent, same=_same, role=_role)
            return self._root(lineage, messages, keys, tools, params, turn, rewrite)
        if tools != head.tools:
            return self._root(lineage, messages, keys, tools, params, turn, TOOLS_CHANGED)
        added = messages[len(head.recorded) :]
        if all(m.role == "assistant" for m in added):
            return self._root(lineage, messages, keys, tools, params, turn, EMPTY_DELTA)

        if self.cumulative:
            bridged = self.renderer.bridge_to_next_turn(
                head.prompt, head.completion, list(added), list(tools) or None
            )
            prompt = bridged if bridged is not None and self._extends(bridged, head) else None
        else:
            full = self._render(messages, tools)
            prompt = full if self._extends(full, head) else None
        if prompt is None:
            return self._root(lineage, messages, keys, tools, params, turn, RENDERER_NO_BRIDGE)
        return TurnPlan(
            lineage=lineage,
            mode="extend",
            prompt_token_ids=prompt,
            prompt_delta_token_ids=prompt[len(head.prompt) + len(head.completion) :],
            parent_trace_id=head.trace_id,
            trace_id=new_trace_id(),
            turn=turn,
            request=keys,
            tools=tools,
            params=params,
            request_delta=tuple(added),
        )

    def _continued(self, lineage: Lineage, keys: tuple[MessageKey, ...]) -> HistoryBreak | None:
        """The break by which a new lineage's first request continues another lineage: the
        one whose recorded messages it keeps the most of, in a run that ends with that
        lineage's last reply; ``None`` when it continues none."""
        best: HistoryBreak | None = None
        for other in self._by_first.values():
            if other is lineage or other.head is None:
                continue
            found = continuation(
                other.head.recorded, keys, same=_same, role=_role, source=other.lineage_id
            )
            if found is not None and (best is None or found.kept > best.kept):
                best = found
        return best

    @staticmethod
    def _extends(prompt: Sequence[int], head: Head) -> bool:
        """``prompt`` is the head's prompt and completion followed by at least one more id."""
        # Compared piece by piece: joining the head's lists first would copy the whole
        # conversation's ids once more on every turn.
        before, completion = head.prompt, head.completion
        n, end = len(before), len(before) + len(completion)
        return len(prompt) > end and prompt[n:end] == completion and prompt[:n] == before

    def _render(self, messages: Sequence[Message], tools: tuple[ToolSpec, ...]) -> list[int]:
        rendered = self.renderer.render(messages, list(tools) or None, add_generation_prompt=True)
        return list(rendered.token_ids)

    def _root(
        self,
        lineage: Lineage,
        messages: Sequence[Message],
        keys: tuple[MessageKey, ...],
        tools: tuple[ToolSpec, ...],
        params: SamplingParams,
        turn: int,
        reason: str | HistoryBreak | None = None,
    ) -> TurnPlan:
        rewrite = reason if isinstance(reason, HistoryBreak) else None
        if rewrite is not None:
            reason = rewrite.reason
        prompt = self._render(messages, tools)
        return TurnPlan(
            lineage=lineage,
            mode="root" if reason is None else "reset",
            prompt_token_ids=prompt,
            prompt_delta_token_ids=prompt,
            parent_trace_id=None,
            trace_id=new_trace_id(),
            turn=turn,
            request=keys,
            tools=tools,
            params=params,
            request_delta=tuple(messages),
            reset_reason=reason,
            divergent_message=rewrite.at if rewrite is not None else None,
            history_break=rewrite,
        )

    # ---------------------------------------------------------------- commit

    def commit(self, plan: TurnPlan, completion_token_ids: Sequence[int], reply: Message) -> None:
        """Make ``plan``'s call (sampled as ``completion_token_ids``, answered with ``reply``)
        the head of its lineage and count it; a reset in cumulative mode is logged once, at
        INFO, on the ``rllm_core.gateway`` logger (plain mode logs none)."""
        lineage = plan.lineage
        previous = lineage.head
        lineage.head = Head(
            request=plan.request,
            tools=plan.tools,
            params=plan.params,
            recorded=(*plan.request, message_key(reply, keep_reasoning=self.keep_reasoning)),
            prompt=plan.prompt_token_ids,
            completion=list(completion_token_ids),
            trace_id=plan.trace_id,
            parent_trace_id=plan.parent_trace_id,
            prompt_delta=plan.prompt_delta_token_ids,
            turn=plan.turn,
            request_delta=plan.request_delta,
            reset_reason=plan.reset_reason,
            history_break=plan.history_break,
        )
        if plan.mode == "replay":
            self.replays += 1
            return
        self.turns += 1
        if plan.mode != "reset":
            return
        reason = plan.reset_reason or ""
        self.resets[reason] += 1
        if not self.cumulative:
            # Plain mode renders every call in full: a turn that does not chain resets nothing.
            return
        rewrite = plan.history_break
        where = ""
        if rewrite is not None:
            where = (
                f" divergent_message={rewrite.at} kept={rewrite.kept} dropped={rewrite.dropped}"
                f" inserted={rewrite.inserted}"
            )
            if rewrite.source is not None:
                where += f" continues={rewrite.source}"
        logger.info(
            "token reset session=%s lineage=%s reason=%s%s turn=%d prev_prompt_tokens=%d"
            " new_prompt_tokens=%d session_resets=%d",
            self.session_id,
            lineage.lineage_id,
            reason,
            where,
            plan.turn,
            len(previous.prompt) if previous is not None else 0,
            len(plan.prompt_token_ids),
            sum(self.resets.values()),
        )
