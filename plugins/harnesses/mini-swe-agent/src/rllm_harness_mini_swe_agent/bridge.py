"""How the agent's thread reaches the episode's event loop, and how an episode stops it.

mini-swe-agent's loop is synchronous, so each episode runs it in a thread of its own while the
sandbox lives on the event loop. :class:`LoopBridge` runs one sandbox coroutine at a time on
the loop and waits for it; :meth:`LoopBridge.stop` (cancellation, the time budget) cancels the
coroutine in flight and makes every later call raise :class:`Stopped`, so the thread unwinds at
its next model call or command.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = ["LoopBridge", "Stopped"]

T = TypeVar("T")


class Stopped(Exception):
    """The episode was cancelled or ran out of time; the agent's thread unwinds."""


class LoopBridge:
    """Runs coroutines on ``loop`` for a thread that is not the loop's."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._stopped = False
        self._pending: concurrent.futures.Future[Any] | None = None

    @property
    def stopped(self) -> bool:
        return self._stopped

    def check(self) -> None:
        """Raise :class:`Stopped` once the episode was stopped."""
        if self._stopped:
            raise Stopped("the episode was stopped (cancelled or out of time)")

    def run(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run the coroutine ``make()`` returns on the loop and wait for its result (or
        exception). Raises :class:`Stopped` when the episode stops before or while it runs."""
        with self._lock:
            self.check()
            future = asyncio.run_coroutine_threadsafe(make(), self.loop)
            self._pending = future
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            raise Stopped("the episode was stopped while a sandbox call ran") from None
        finally:
            with self._lock:
                self._pending = None

    def stop(self) -> None:
        """Stop the episode: cancel the sandbox call in flight; later calls raise
        :class:`Stopped`. Idempotent; safe from any thread."""
        with self._lock:
            self._stopped = True
            pending = self._pending
        if pending is not None:
            pending.cancel()
