"""Pacing of creation requests and retries of transient failures.

Both take the clock and the sleep function as arguments, so tests drive them with a fake
clock instead of waiting.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from rllm_core.errors import SandboxTransientError

__all__ = ["MinInterval", "with_retries"]

T = TypeVar("T")
Sleep = Callable[[float], Awaitable[None]]

_log = logging.getLogger(__name__)


class MinInterval:
    """Spaces calls at least ``interval_s`` apart, in the order they asked.

    Each caller reserves the next free slot before it sleeps, so concurrent callers never
    share a slot and no lock is needed inside one event loop.
    """

    def __init__(self, interval_s: float, *, clock: Callable[[], float], sleep: Sleep) -> None:
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


async def with_retries(
    call: Callable[[], Awaitable[T]],
    *,
    what: str,
    retries: int,
    backoff_s: float,
    backoff_max_s: float,
    sleep: Sleep,
) -> T:
    """Await ``call()``; when it raises ``SandboxTransientError``, wait and call again.

    Waits ``backoff_s``, then twice that, up to ``backoff_max_s``, for at most ``retries``
    retries. The last transient error is raised with the attempt count added to its message
    and the original error as ``__cause__``. Any other error is raised at once.
    """
    delay = min(backoff_s, backoff_max_s)
    attempt = 0
    while True:
        try:
            return await call()
        except SandboxTransientError as exc:
            if attempt >= retries:
                if retries == 0:
                    raise
                raise SandboxTransientError(
                    f"{exc} (gave up after {attempt + 1} attempts; raise `retries` in the"
                    " [sandbox] config or try again later)"
                ) from (exc.__cause__ or exc)
            attempt += 1
            _log.warning(
                "%s failed transiently (%s); retry %d of %d in %.1f s",
                what,
                exc,
                attempt,
                retries,
                delay,
            )
            await sleep(delay)
            delay = min(delay * 2, backoff_max_s)
