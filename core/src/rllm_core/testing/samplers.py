"""Samplers without a model, for tests of the gateway and anything that calls a
:class:`~rllm_core.ports.Sampler`.

- :class:`ScriptedSampler` answers from a script: a list of replies used in order, or a
  callable that sees each :class:`~rllm_core.types.SampleRequest`. A reply is completion text
  (encoded with the renderer, then the renderer's first stop token appended), token ids (used
  as given), or an exception instance (raised, to simulate an upstream failure).
- :class:`EchoSampler` answers instantly with the tail of the prompt, for overhead tests that
  need no script.

Both behave like a real sampler on the request's limits: the completion ends at the first stop
token (included, ``finish_reason="stop"``) or after ``max_tokens`` ids (``"length"``). A reply
that runs out without a stop token is reported as ``"length"`` too, so a script simulates a
truncated completion by giving ids without a stop token. Logprobs are deterministic
(:func:`scripted_logprob`), so a regenerated completion carries the same values.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Sequence
from typing import Literal

from rllm_core.ports import Renderer
from rllm_core.types import SampleRequest, SampleResult

__all__ = [
    "EchoSampler",
    "Reply",
    "Script",
    "ScriptExhaustedError",
    "ScriptedSampler",
    "scripted_logprob",
]

Reply = str | Sequence[int] | BaseException
"""One scripted answer: completion text, completion token ids, or an exception to raise."""

Script = Sequence[Reply] | Callable[[SampleRequest], Reply | Awaitable[Reply]]
"""Replies used in order, or a (sync or async) function from the request to its reply."""


class ScriptExhaustedError(RuntimeError):
    """A list script was asked for more replies than it holds."""


def scripted_logprob(token_id: int, position: int) -> float:
    """The logprob a test sampler reports for ``token_id`` at ``position`` in its completion.

    A negative multiple of 1/64 between -50/64 and -1/64: exact in float32 and float64, so
    stores that pack logprobs as float32 round-trip it unchanged.
    """
    return -float((token_id * 7 + position * 13) % 50 + 1) / 64.0


def finish(
    token_ids: Sequence[int], request: SampleRequest, extra_stops: Sequence[int] = ()
) -> tuple[list[int], Literal["stop", "length"]]:
    """Cut ``token_ids`` where a sampler serving ``request`` would have stopped.

    The stop set is the request's ``stop_token_ids`` plus ``extra_stops``. Returns the kept ids
    (the stop token included) and the finish reason.
    """
    stops = set(request.params.stop_token_ids).union(extra_stops)
    limit = max(request.params.max_tokens, 0)
    for position, token in enumerate(token_ids[:limit]):
        if token in stops:
            return list(token_ids[: position + 1]), "stop"
    return list(token_ids[:limit]), "length"


class ScriptedSampler:
    """A :class:`~rllm_core.ports.Sampler` that answers from a script.

    ``renderer`` is needed only for text replies: the text is ``renderer.encode``-d and
    ``renderer.stop_token_ids()[0]`` appended; the renderer's stop tokens also end a completion
    even when the request does not list them. ``weight_version`` is reported on every result
    and may be reassigned between calls. ``delay_s`` makes every call wait that long first
    (for concurrency and timeout tests).

    Every request received is kept in ``requests``, in arrival order, before the reply is
    produced, so a request that raised is recorded too.

    Example::

        sampler = ScriptedSampler(["Hello!", [72, 105]], renderer=renderer)
        result = await sampler.sample(SampleRequest(prompt_token_ids=ids))
        assert sampler.requests[0].prompt_token_ids == ids
    """

    def __init__(
        self,
        script: Script,
        *,
        renderer: Renderer | None = None,
        weight_version: int = 0,
        delay_s: float = 0.0,
    ) -> None:
        if isinstance(script, (str, bytes)):
            raise TypeError(
                f"script must be a list of replies or a callable, not the string {script!r};"
                " wrap a single reply in a list"
            )
        self._script = script
        self._next = 0
        self.renderer = renderer
        self.weight_version = weight_version
        self.delay_s = delay_s
        self.requests: list[SampleRequest] = []

    @property
    def calls(self) -> int:
        """How many requests the sampler received."""
        return len(self.requests)

    @property
    def remaining(self) -> int | None:
        """Replies left in a list script; ``None`` for a callable script."""
        if callable(self._script):
            return None
        return len(self._script) - self._next

    async def _reply(self, request: SampleRequest) -> Reply:
        if callable(self._script):
            reply = self._script(request)
            if inspect.isawaitable(reply):
                reply = await reply
            return reply
        if self._next >= len(self._script):
            raise ScriptExhaustedError(
                f"the script holds {len(self._script)} replies and request"
                f" {len(self.requests)} asked for another; add replies to the script"
            )
        reply = self._script[self._next]
        self._next += 1
        return reply

    def _reply_ids(self, reply: Reply) -> list[int]:
        if isinstance(reply, str):
            if self.renderer is None:
                raise TypeError(
                    f"reply {reply[:40]!r} is text but the sampler has no renderer to encode it;"
                    " pass renderer= or script token ids"
                )
            return [*self.renderer.encode(reply), self.renderer.stop_token_ids()[0]]
        ids = list(reply)
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise TypeError(f"reply {ids[:8]!r} must hold only int token ids")
        return ids

    async def sample(self, request: SampleRequest) -> SampleResult:
        self.requests.append(request)
        if self.delay_s > 0:
            await asyncio.sleep(self.delay_s)
        reply = await self._reply(request)
        if isinstance(reply, BaseException):
            raise reply
        extra = self.renderer.stop_token_ids() if self.renderer is not None else ()
        ids, reason = finish(self._reply_ids(reply), request, extra)
        return SampleResult(
            completion_token_ids=ids,
            logprobs=[scripted_logprob(t, i) for i, t in enumerate(ids)],
            finish_reason=reason,
            weight_version=self.weight_version,
        )


class EchoSampler:
    """Answers at once with the last ``echo`` prompt ids that are not stop tokens, then the
    request's first stop token (if it lists one), cut to ``max_tokens``.

    It needs no script and no renderer, so overhead measurements see only the caller's cost.
    """

    def __init__(self, *, echo: int = 16, weight_version: int = 0) -> None:
        if echo < 0:
            raise ValueError(f"echo must be >= 0, got {echo}")
        self.echo = echo
        self.weight_version = weight_version
        self.calls = 0

    async def sample(self, request: SampleRequest) -> SampleResult:
        self.calls += 1
        stops = request.params.stop_token_ids
        ids: list[int] = []
        # Walk back from the end only as far as needed: prompts can be long.
        for token in reversed(request.prompt_token_ids):
            if len(ids) == self.echo:
                break
            if token not in stops:
                ids.append(token)
        ids.reverse()
        if stops:
            ids.append(stops[0])
        ids, reason = finish(ids, request)
        return SampleResult(
            completion_token_ids=ids,
            logprobs=[scripted_logprob(t, i) for i, t in enumerate(ids)],
            finish_reason=reason,
            weight_version=self.weight_version,
        )
