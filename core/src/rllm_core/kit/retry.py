"""Bounded retries with jittered exponential backoff, and pacing, for calls to remote services.

Every component that retries (sandbox backends, managed trainers, the vLLM sampler) takes the
same three config keys by adding :class:`RetrySettings` to its config model, and retries
through :func:`retry_async` or :func:`retry_sync` (built on tenacity). The wait before retry
``n`` (1-based) is drawn uniformly from ``[0, min(retry_backoff_max_s, retry_backoff_s *
2 ** (n - 1))]`` ("full jitter"), so callers that failed together do not retry together; a
``hint`` (a server's ``Retry-After``) replaces the draw when it gives one. After ``retries``
retries the last error is raised as it was. :class:`Pacer` spaces calls at least
``interval_s`` apart.

Tests pass ``sleep`` (and ``clock``) to drive both without waiting.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import tenacity
from pydantic import BaseModel, Field

__all__ = ["Pacer", "RetrySettings", "retry_async", "retry_sync"]

T = TypeVar("T")
Transient = Callable[[BaseException], bool]
OnRetry = Callable[[int, BaseException, float], None]
"""Called before each retry with its number (1-based), the error and the wait in seconds."""
Hint = Callable[[BaseException], float | None]

_log = logging.getLogger(__name__)


class RetrySettings(BaseModel):
    """The retry keys of a component's config; subclass it (``class MyConfig(RetrySettings)``)
    so that every component spells them the same way."""

    retries: int = Field(
        3,
        ge=0,
        description="retries of a call that failed transiently (a connection error, a timeout,"
        " a 429 or 5xx answer); 0 fails at the first error",
    )
    retry_backoff_s: float = Field(
        1.0,
        ge=0.0,
        description="scale of the wait before a retry: retry n waits a random time up to"
        " retry_backoff_s * 2**(n-1) seconds (full jitter)",
    )
    retry_backoff_max_s: float = Field(
        30.0, ge=0.0, description="longest wait between two retries, in seconds"
    )


def _wait(settings: RetrySettings, hint: Hint | None) -> Callable[[tenacity.RetryCallState], float]:
    jittered = tenacity.wait_random_exponential(
        multiplier=settings.retry_backoff_s, max=settings.retry_backoff_max_s
    )

    def wait(state: tenacity.RetryCallState) -> float:
        error = state.outcome.exception() if state.outcome is not None else None
        given = hint(error) if hint is not None and error is not None else None
        return max(0.0, given) if given is not None else jittered(state)

    return wait


def _before_sleep(what: str, settings: RetrySettings, on_retry: OnRetry | None):
    def before_sleep(state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        delay = state.next_action.sleep if state.next_action is not None else 0.0
        _log.warning(
            "%s failed transiently (%s); retry %d of %d in %.1f s",
            what,
            error,
            state.attempt_number,
            settings.retries,
            delay,
        )
        if on_retry is not None and error is not None:
            on_retry(state.attempt_number, error, delay)

    return before_sleep


def _arguments(
    settings: RetrySettings,
    transient: Transient,
    what: str,
    on_retry: OnRetry | None,
    hint: Hint | None,
) -> dict:
    return {
        "stop": tenacity.stop_after_attempt(settings.retries + 1),
        "wait": _wait(settings, hint),
        "retry": tenacity.retry_if_exception(transient),
        "before_sleep": _before_sleep(what, settings, on_retry),
        "reraise": True,
    }


async def retry_async(
    call: Callable[[], Awaitable[T]],
    settings: RetrySettings,
    *,
    transient: Transient,
    what: str,
    on_retry: OnRetry | None = None,
    hint: Hint | None = None,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> T:
    """Await ``call()``, retrying it while it raises an error ``transient`` accepts.

    ``call`` may be any callable that returns an awaitable (a lambda included), not only a
    coroutine function."""
    # The first attempt runs outside tenacity: building its retrying object costs more than a
    # gateway's whole upstream call, and most calls succeed at once. A first failure is handed
    # to tenacity as its first attempt's outcome, so waits, logs and counts are unchanged.
    try:
        return await call()
    except BaseException as exc:
        if settings.retries == 0 or not transient(exc):
            raise
        first: list[BaseException] = [exc]

    # tenacity awaits only coroutine functions; a lambda's coroutine would be returned as is.
    async def attempt() -> T:
        if first:
            raise first.pop()
        return await call()

    retrying = tenacity.AsyncRetrying(
        sleep=sleep, **_arguments(settings, transient, what, on_retry, hint)
    )
    return await retrying(attempt)


def retry_sync(
    call: Callable[[], T],
    settings: RetrySettings,
    *,
    transient: Transient,
    what: str,
    on_retry: OnRetry | None = None,
    hint: Hint | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Call ``call()``, retrying it while it raises an error ``transient`` accepts."""
    retrying = tenacity.Retrying(
        sleep=sleep, **_arguments(settings, transient, what, on_retry, hint)
    )
    return retrying(call)


class Pacer:
    """Spaces calls at least ``interval_s`` apart, in the order they asked.

    Each caller reserves the next free slot before it sleeps, so concurrent callers never share
    a slot and no lock is needed inside one event loop.
    """

    def __init__(
        self,
        interval_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self._sleep = sleep
        self._next_slot = float("-inf")

    async def wait(self) -> None:
        if self.interval_s <= 0:
            return
        now = self._clock()
        slot = max(now, self._next_slot)
        self._next_slot = slot + self.interval_s
        if slot > now:
            await self._sleep(slot - now)
