"""The gateway engine: chat and completion requests in, token-exact traces recorded.

The HTTP layer parses a request into a :class:`ChatRequest` and calls
:meth:`GatewayEngine.chat`; the engine classifies it with the session's
:class:`~rllm_core.gateway.accumulator.TokenAccumulator`, samples from token ids, parses the
completion with the renderer, records one :class:`~rllm_core.types.TraceRecord` per model call
in the trace store (a delta chain), and returns a :class:`ChatResult`.

For callers: :class:`ChatResult` ends with ``divergent_message`` and ``history_break`` (where
and how a history break rewrote the conversation); :class:`CompletionResult` also carries
``weight_version``, ``lineage_id`` and ``turn``; a request the engine cannot serve as given raises
:class:`InvalidChatRequestError` (no messages, an empty prompt), an over-long prompt
:class:`PromptTooLongError`, and an unknown session on a read :class:`UnknownSessionError`;
all three derive from :class:`GatewayError`. Sampler exceptions propagate unchanged.

Open sessions: a session is open while it has live state, from :meth:`GatewayEngine.open_session`
(or :meth:`~GatewayEngine.configure_session`, or its first call) until
:meth:`~GatewayEngine.release_session` or :meth:`~GatewayEngine.delete_session`. The HTTP layer
accepts a session's own token only while it is open, and clears :data:`calls_open_sessions`
for those calls, so a call that arrives after the release raises :class:`SessionClosedError`
instead of opening the session again.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass

import msgspec

from rllm_core.errors import RllmError
from rllm_core.gateway.accumulator import (
    Lineage,
    TokenAccumulator,
    TurnPlan,
    new_trace_id,
    renderer_keeps_reasoning,
)
from rllm_core.gateway.history import HistoryBreak
from rllm_core.ports import Renderer, Sampler, StreamingSampler, TraceStore
from rllm_core.types import (
    Message,
    ParsedToolCall,
    SampleRequest,
    SampleResult,
    SamplingParams,
    ToolCall,
    ToolSpec,
    TraceRecord,
)

__all__ = [
    "COMPLETIONS_LINEAGE",
    "MAX_SESSION_ID",
    "ChatRequest",
    "ChatResult",
    "CompletionResult",
    "GatewayEngine",
    "GatewayError",
    "InvalidChatRequestError",
    "PromptTooLongError",
    "SessionClosedError",
    "SessionStats",
    "UnknownSessionError",
    "calls_open_sessions",
    "is_session_id",
]

COMPLETIONS_LINEAGE = "completions"
"""The lineage every ``/v1/completions`` call of a session is recorded in (each a root)."""

MAX_SESSION_ID = 256
"""The gateway accepts session ids of at most this many characters."""

_SESSION_ID = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._:@-]{{0,{MAX_SESSION_ID - 1}}}")


calls_open_sessions: ContextVar[bool] = ContextVar("rllm_core_calls_open_sessions", default=True)
"""Whether a model call made in this context may open a session that is not open (see the module
docstring). True unless the caller clears it."""


def is_session_id(text: str) -> bool:
    """Whether the gateway accepts ``text`` as a session id: letters, digits and ``._:@-``,
    starting with a letter or digit, at most :data:`MAX_SESSION_ID` characters."""
    return _SESSION_ID.fullmatch(text) is not None


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class GatewayError(RllmError):
    """Base of the errors the engine raises for a request the client must change."""


class PromptTooLongError(GatewayError):
    """The prompt has more tokens than ``max_prompt_tokens`` allows."""

    def __init__(self, *, prompt_tokens: int, max_prompt_tokens: int, session_id: str) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_prompt_tokens = max_prompt_tokens
        self.session_id = session_id
        super().__init__(
            f"the prompt of session {session_id!r} has {prompt_tokens} tokens, over the"
            f" gateway's limit of {max_prompt_tokens}; shorten or compact the conversation"
        )


class UnknownSessionError(GatewayError, KeyError):
    """No live state and no stored traces for a session id."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(
            f"no session {session_id!r}: it has no traces and was never used on this gateway"
            " (or was deleted); list the known sessions first"
        )

    def __str__(self) -> str:
        return str(self.args[0])


class InvalidChatRequestError(GatewayError, ValueError):
    """A chat request the engine cannot serve as given (for example, no messages)."""


class SessionClosedError(RllmError, PermissionError):
    """A model call of a session that is not open, made where :data:`calls_open_sessions` is
    cleared (a session token's call that arrived after its session was released)."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        super().__init__(
            f"session {session_id!r} is closed: it was released (its episode ended) or never"
            " opened; its session token no longer reaches it"
        )


# --------------------------------------------------------------------------------------------
# Requests and results
# --------------------------------------------------------------------------------------------


class ChatRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One chat completion request of a session, as the HTTP layer parsed it.

    ``tools`` are the tools rendered into the prompt. ``tool_choice`` is ``auto``,
    ``required`` (the reply must call a tool) or ``function`` (it must call ``tool_name``);
    sampling is never constrained, so the result says whether the reply met it, and the trace
    of a reply that did not carries the flag ``tool_choice_unmet``. The trace of a reply with
    a tool-call attempt that is not ``ok`` (malformed, cut off) carries ``tool_call_invalid``.
    """

    messages: tuple[Message, ...]
    tools: tuple[ToolSpec, ...] = ()
    params: SamplingParams = SamplingParams()
    tool_choice: str = "auto"
    tool_name: str | None = None


class ChatResult(msgspec.Struct, frozen=True, kw_only=True):
    """The assistant reply and everything the HTTP layer reports about the call.

    ``message`` is the parsed reply (content, reasoning, the ``ok`` tool calls);
    ``tool_call_attempts`` keeps every attempt, malformed ones included. ``prompt_token_ids``
    is exactly what the sampler received. ``finish_reason`` is ``tool_calls`` when the reply
    has tool calls, else the sampler's ``stop`` or ``length``. ``mode`` is ``root``,
    ``extend``, ``replay`` or ``reset``; ``reset_reason`` is set for a reset, and for a history
    break (see :mod:`rllm_core.gateway.history`) ``history_break`` describes it and
    ``divergent_message`` is its first differing message. ``tool_choice_met`` is ``None`` unless
    the request required a tool call, then whether the reply holds one (of the named function).
    """

    message: Message
    tool_call_attempts: tuple[ParsedToolCall, ...]
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    trace_id: str
    lineage_id: str
    turn: int
    mode: str
    reset_reason: str | None
    weight_version: int
    divergent_message: int | None = None
    tool_choice_met: bool | None = None
    history_break: HistoryBreak | None = None


class CompletionResult(msgspec.Struct, frozen=True, kw_only=True):
    """A ``/v1/completions`` call: ``text`` is the completion decoded without its stop token."""

    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    trace_id: str
    weight_version: int
    lineage_id: str = COMPLETIONS_LINEAGE
    turn: int = 0


class SessionStats(msgspec.Struct, frozen=True, kw_only=True):
    """What a session did.

    ``turns`` counts recorded chat calls (a replay overwrites its trace, so it is counted in
    ``replays`` instead); ``resets`` maps each reset reason that occurred to its count;
    ``lineages`` lists the chat lineages in creation order; ``completions`` counts
    ``/v1/completions`` calls; ``denied`` the requests refused to the session's token while it
    was open (0 once released). ``live`` is false for a session known only from the trace store
    (after a restart): its figures are then read back from the stored records, where replays
    leave no mark.
    """

    session_id: str
    turns: int
    replays: int
    resets: dict[str, int]
    lineages: tuple[str, ...]
    completions: int
    denied: int = 0
    live: bool = True


# --------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------


@dataclass
class _Session:
    accumulator: TokenAccumulator
    enforced: SamplingParams | None = None
    completions: int = 0
    next_completion: int = 0
    denied: int = 0


class GatewayEngine:
    """Serves chat and completion requests of many sessions over one sampler.

    ``cumulative`` selects cumulative token mode (bridge from the sampled tokens) or plain mode
    (render the conversation every call); see :mod:`rllm_core.gateway.accumulator`. ``model`` is
    written into every record. ``max_prompt_tokens`` rejects longer prompts with
    :class:`PromptTooLongError` before sampling.

    Sampling parameters come from the request unless the session enforces its own
    (:meth:`configure_session`): those then replace ``max_tokens``, ``temperature``, ``top_p``
    and ``seed`` entirely. The stop token ids sent are the renderer's, then any the parameters
    list.

    Requests of one lineage are served one at a time, in arrival order; sessions and lineages
    run concurrently. A sampler exception propagates and records nothing. ``resets`` counts
    the resets of every session since the engine started, by reason.
    """

    def __init__(
        self,
        *,
        renderer: Renderer,
        sampler: Sampler,
        trace_store: TraceStore,
        cumulative: bool = True,
        model: str = "policy",
        max_prompt_tokens: int | None = None,
    ) -> None:
        if max_prompt_tokens is not None and max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be at least 1, got {max_prompt_tokens}")
        self.renderer = renderer
        self.sampler = sampler
        self.trace_store = trace_store
        self.cumulative = cumulative
        self.model = model
        self.max_prompt_tokens = max_prompt_tokens
        self._stop_ids = tuple(renderer.stop_token_ids())
        self._keep_reasoning = renderer_keeps_reasoning(renderer)
        self._sessions: dict[str, _Session] = {}
        self.resets: Counter[str] = Counter()

    # ---------------------------------------------------------------- sessions

    def _session(self, session_id: str) -> _Session:
        session = self._sessions.get(session_id)
        if session is None:
            if not calls_open_sessions.get():
                raise SessionClosedError(session_id)
            accumulator = TokenAccumulator(
                session_id,
                self.renderer,
                cumulative=self.cumulative,
                keep_reasoning=self._keep_reasoning,
            )
            session = self._sessions[session_id] = _Session(accumulator)
        return session

    def configure_session(self, session_id: str, *, enforced: SamplingParams | None = None) -> None:
        """Set (or, with ``None``, clear) the sampling parameters a session enforces; opens the
        session."""
        self._session(session_id).enforced = enforced

    def open_session(self, session_id: str) -> None:
        """Give a session live state unless it has some (idempotent)."""
        self._session(session_id)

    def is_open(self, session_id: str) -> bool:
        """Whether the session has live state: opened, configured or called since it was last
        released or deleted."""
        return session_id in self._sessions

    def note_denied(self, session_id: str) -> int:
        """Count one request refused to ``session_id``'s token while the session is open;
        returns the session's count so far (0 when it is not open)."""
        session = self._sessions.get(session_id)
        if session is None:
            return 0
        session.denied += 1
        return session.denied

    def denied(self, session_id: str) -> int:
        """Requests refused to ``session_id``'s token since the session was opened (0 for a
        session without live state)."""
        session = self._sessions.get(session_id)
        return session.denied if session is not None else 0

    def session_ids(self) -> list[str]:
        """Every session with live state or stored traces, sorted."""
        return sorted(set(self._sessions).union(self.trace_store.sessions()))

    def session_stats(self, session_id: str) -> SessionStats:
        """Turns, replays, resets by reason and lineages of a session.

        Raises :class:`UnknownSessionError` when the session has neither live state nor traces.
        """
        session = self._sessions.get(session_id)
        if session is not None:
            acc = session.accumulator
            return SessionStats(
                session_id=session_id,
                turns=acc.turns,
                replays=acc.replays,
                resets=dict(acc.resets),
                lineages=tuple(acc.lineages()),
                completions=session.completions,
                denied=session.denied,
            )
        records = self.trace_store.chain(session_id)
        if not records:
            raise UnknownSessionError(session_id)
        chat = [r for r in records if r.lineage_id != COMPLETIONS_LINEAGE]
        resets: dict[str, int] = {}
        for record in chat:
            if record.reset_reason is not None:
                resets[record.reset_reason] = resets.get(record.reset_reason, 0) + 1
        return SessionStats(
            session_id=session_id,
            turns=len(chat),
            replays=0,
            resets=resets,
            lineages=tuple(dict.fromkeys(r.lineage_id for r in chat)),
            completions=len(records) - len(chat),
            live=False,
        )

    def release_session(self, session_id: str) -> None:
        """Forget a finished session's live state (token accumulator, lineages) while its
        traces stay in the trace store. A later call on the same id starts a fresh session.
        Unknown ids are ignored."""
        self._sessions.pop(session_id, None)

    def delete_session(self, session_id: str) -> None:
        """Forget a session's state and delete its traces. A call still in flight completes
        but is not recorded. Raises :class:`UnknownSessionError` for an unknown session."""
        live = self._sessions.pop(session_id, None)
        if live is None and session_id not in self.trace_store.sessions():
            raise UnknownSessionError(session_id)
        self.trace_store.delete_session(session_id)

    # ---------------------------------------------------------------- sampling

    def _params(self, session: _Session, requested: SamplingParams) -> SamplingParams:
        base = session.enforced if session.enforced is not None else requested
        stops = tuple(dict.fromkeys((*self._stop_ids, *base.stop_token_ids)))
        if stops == base.stop_token_ids:
            return base
        return msgspec.structs.replace(base, stop_token_ids=stops)

    def _check_length(self, session_id: str, prompt: Sequence[int]) -> None:
        if self.max_prompt_tokens is not None and len(prompt) > self.max_prompt_tokens:
            raise PromptTooLongError(
                prompt_tokens=len(prompt),
                max_prompt_tokens=self.max_prompt_tokens,
                session_id=session_id,
            )

    async def chat(self, session_id: str, request: ChatRequest) -> ChatResult:
        """Serve one chat request of a session; see the class docstring."""
        # The same steps as :meth:`chat_stream` without its async generators, whose every
        # step costs a resumption on the hot path of a plain answer.
        session, lineage = self._start_chat(session_id, request)
        async with lineage.lock:
            plan, sample = self._plan_chat(session_id, session, lineage, request)
            created = time.time()
            started = time.perf_counter()
            result = await self.sampler.sample(sample)
            return self._record_chat(session_id, session, request, plan, result, created, started)

    async def chat_stream(
        self, session_id: str, request: ChatRequest
    ) -> AsyncIterator[str | tuple[list[int], list[float]] | ChatResult]:
        """Serve one chat request while it is sampled.

        Yields the trace id once the prompt is accepted, then ``(token_ids, logprobs)`` pieces
        as the sampler produces them (one piece with the whole completion when the sampler is
        not a :class:`~rllm_core.ports.StreamingSampler`), then the :class:`ChatResult`. The
        trace recorded is the one :meth:`chat` records. Close the iterator (``aclose``) when
        stopping early; nothing is then recorded."""
        async for item in self._serve_chat(session_id, request, stream=True):
            yield item

    async def _sample(
        self, request: SampleRequest, stream: bool
    ) -> AsyncIterator[tuple[list[int], list[float]] | SampleResult]:
        if stream and isinstance(self.sampler, StreamingSampler):
            final = None
            async for item in self.sampler.sample_stream(request):
                if isinstance(item, SampleResult):
                    final = item
                else:
                    yield item
            if final is None:
                raise RuntimeError(
                    f"{type(self.sampler).__name__}.sample_stream ended without a SampleResult"
                )
            yield final
            return
        result = await self.sampler.sample(request)
        if stream:
            yield result.completion_token_ids, result.logprobs
        yield result

    def _start_chat(self, session_id: str, request: ChatRequest) -> tuple[_Session, Lineage]:
        if not request.messages:
            raise InvalidChatRequestError(
                f"the chat request of session {session_id!r} has no messages; send at least one"
            )
        session = self._session(session_id)
        return session, session.accumulator.lineage_for(request.messages)

    def _plan_chat(
        self, session_id: str, session: _Session, lineage: Lineage, request: ChatRequest
    ) -> tuple[TurnPlan, SampleRequest]:
        """The turn's plan and what to sample; call with the lineage's lock held."""
        plan = session.accumulator.plan(lineage, request.messages, request.tools, request.params)
        self._check_length(session_id, plan.prompt_token_ids)
        sample = SampleRequest(
            prompt_token_ids=plan.prompt_token_ids,
            params=self._params(session, request.params),
            request_id=plan.trace_id,
            session_id=session_id,
        )
        return plan, sample

    def _record_chat(
        self,
        session_id: str,
        session: _Session,
        request: ChatRequest,
        plan: TurnPlan,
        result: SampleResult,
        created: float,
        started: float,
    ) -> ChatResult:
        """Record a sampled turn, make it its lineage's head, and build the result; call with
        the lineage's lock held."""
        latency = time.perf_counter() - started
        reply, attempts = self._reply(plan, result.completion_token_ids)
        met = None
        if request.tool_choice == "required":
            met = bool(reply.tool_calls)
        elif request.tool_choice == "function":
            met = any(c.name == request.tool_name for c in reply.tool_calls)
        flags = ("tool_choice_unmet",) if met is False else ()
        if any(attempt.status != "ok" for attempt in attempts):
            flags += ("tool_call_invalid",)
        if plan.history_break is not None:
            flags += plan.history_break.flags()
        if self._sessions.get(session_id) is session:
            self.trace_store.append(
                TraceRecord(
                    trace_id=plan.trace_id,
                    session_id=session_id,
                    lineage_id=plan.lineage_id,
                    turn=plan.turn,
                    parent_trace_id=plan.parent_trace_id,
                    prompt_delta_token_ids=plan.prompt_delta_token_ids,
                    completion_token_ids=result.completion_token_ids,
                    logprobs=result.logprobs,
                    finish_reason=result.finish_reason,
                    weight_version=result.weight_version,
                    model=self.model,
                    messages_delta=(*plan.request_delta, reply),
                    reset_reason=plan.reset_reason,
                    created_at=created,
                    latency_s=latency,
                    flags=flags,
                )
            )
        session.accumulator.commit(plan, result.completion_token_ids, reply)
        if plan.mode == "reset" and plan.reset_reason is not None:
            self.resets[plan.reset_reason] += 1
        return ChatResult(
            message=reply,
            tool_call_attempts=attempts,
            prompt_token_ids=plan.prompt_token_ids,
            completion_token_ids=result.completion_token_ids,
            logprobs=result.logprobs,
            finish_reason="tool_calls" if reply.tool_calls else result.finish_reason,
            trace_id=plan.trace_id,
            lineage_id=plan.lineage_id,
            turn=plan.turn,
            mode=plan.mode,
            reset_reason=plan.reset_reason if plan.mode == "reset" else None,
            weight_version=result.weight_version,
            divergent_message=plan.divergent_message,
            tool_choice_met=met,
            history_break=plan.history_break if plan.mode == "reset" else None,
        )

    async def _serve_chat(
        self, session_id: str, request: ChatRequest, *, stream: bool
    ) -> AsyncIterator[str | tuple[list[int], list[float]] | ChatResult]:
        session, lineage = self._start_chat(session_id, request)
        async with lineage.lock:
            plan, sample = self._plan_chat(session_id, session, lineage, request)
            created = time.time()
            started = time.perf_counter()
            if stream:
                yield plan.trace_id
            result = None
            async for item in self._sample(sample, stream):
                if isinstance(item, SampleResult):
                    result = item
                else:
                    yield item
            assert result is not None
            chat = self._record_chat(session_id, session, request, plan, result, created, started)
        yield chat

    def _reply(
        self, plan: TurnPlan, completion: Sequence[int]
    ) -> tuple[Message, tuple[ParsedToolCall, ...]]:
        """The assistant message for a completion, and every tool-call attempt.

        Ok calls get ids unique to the trace (``call_<trace id prefix>_<n>``), so an agent that
        keys tool results by id never sees one id twice in a session; a replay reuses them.
        """
        parsed = self.renderer.parse_response(completion, tools=plan.tools)
        attempts: list[ParsedToolCall] = []
        calls: list[ToolCall] = []
        for attempt in parsed.tool_calls:
            if attempt.status == "ok" and attempt.call is not None:
                call = msgspec.structs.replace(
                    attempt.call, id=f"call_{plan.trace_id[:12]}_{len(calls)}"
                )
                calls.append(call)
                attempt = msgspec.structs.replace(attempt, call=call)
            attempts.append(attempt)
        message = Message(
            role="assistant",
            content=parsed.content,
            reasoning=parsed.reasoning,
            tool_calls=tuple(calls),
        )
        return message, tuple(attempts)

    async def complete(
        self, session_id: str, prompt: str | list[int], params: SamplingParams
    ) -> CompletionResult:
        """Serve a ``/v1/completions`` call: a text prompt is ``renderer.encode``-d, token ids
        are sent as given. Recorded as a root in lineage ``completions``, numbered by call."""
        session = self._session(session_id)
        prompt_ids = self.renderer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not prompt_ids:
            raise InvalidChatRequestError(
                f"the completion request of session {session_id!r} has an empty prompt"
            )
        if not isinstance(prompt, str):
            try:
                self.renderer.decode(prompt_ids)
            except Exception as exc:  # the tokenizer's own error for an id it does not know
                raise InvalidChatRequestError(
                    f"the completion prompt of session {session_id!r} holds token ids the"
                    f" renderer cannot decode ({type(exc).__name__}: {exc}); send ids from the"
                    " model's vocabulary"
                ) from None
        self._check_length(session_id, prompt_ids)
        sent = self._params(session, params)
        trace_id = new_trace_id()
        turn = session.next_completion
        session.next_completion += 1
        created = time.time()
        started = time.perf_counter()
        result = await self.sampler.sample(
            SampleRequest(
                prompt_token_ids=prompt_ids,
                params=sent,
                request_id=trace_id,
                session_id=session_id,
            )
        )
        latency = time.perf_counter() - started
        ids = result.completion_token_ids
        stopped = result.finish_reason == "stop" and ids and ids[-1] in sent.stop_token_ids
        shown = ids[:-1] if stopped else ids
        if self._sessions.get(session_id) is session:
            self.trace_store.append(
                TraceRecord(
                    trace_id=trace_id,
                    session_id=session_id,
                    lineage_id=COMPLETIONS_LINEAGE,
                    turn=turn,
                    prompt_delta_token_ids=prompt_ids,
                    completion_token_ids=ids,
                    logprobs=result.logprobs,
                    finish_reason=result.finish_reason,
                    weight_version=result.weight_version,
                    model=self.model,
                    created_at=created,
                    latency_s=latency,
                )
            )
        session.completions += 1
        return CompletionResult(
            prompt_token_ids=prompt_ids,
            completion_token_ids=ids,
            logprobs=result.logprobs,
            text=self.renderer.decode(shown),
            finish_reason=result.finish_reason,
            trace_id=trace_id,
            weight_version=result.weight_version,
            turn=turn,
        )
