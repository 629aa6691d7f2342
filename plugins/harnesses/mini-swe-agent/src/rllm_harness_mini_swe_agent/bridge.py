"""How the agent's thread reaches the episode's event loop, and how an episode stops it.

mini-swe-agent's loop is synchronous, so each episode runs it in a thread of its own while the
sandbox lives on the event loop. :class:`LoopBridge` runs one sandbox coroutine at a time as a
task on the loop and waits for it; :meth:`LoopBridge.stop` (cancellation, the time budget)
cancels that task and makes every later call raise :class:`Stopped`, so the thread unwinds at
its next model call or command, and :meth:`LoopBridge.settle` waits for the cancelled task to
finish its own clean-up (a sandbox killing the command's processes).
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
    """Runs coroutines on ``loop`` for a thread that is not the loop's. :meth:`run` is called
    from that thread; :meth:`stop` and :meth:`settle` on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._lock = threading.Lock()
        self._stopped = False
        self._task: asyncio.Task[Any] | None = None

    @property
    def stopped(self) -> bool:
        return self._stopped

    def check(self) -> None:
        """Raise :class:`Stopped` once the episode was stopped."""
        if self._stopped:
            raise Stopped("the episode was stopped (cancelled or out of time)")

    def run(self, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """Run the coroutine ``make()`` returns as a task on the loop and wait for its result
        (or exception). Raises :class:`Stopped` when the episode stops before or while it
        runs."""
        done: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._lock:
            self.check()
            self.loop.call_soon_threadsafe(self._start, make, done)
        try:
            return done.result()
        except concurrent.futures.CancelledError:
            raise Stopped("the episode was stopped while a sandbox call ran") from None

    def _start(self, make: Callable[[], Coroutine[Any, Any, T]], done: Any) -> None:
        if self._stopped:
            done.cancel()
            return
        task = self.loop.create_task(make())
        self._task = task
        task.add_done_callback(lambda finished: _copy(finished, done))

    def stop(self) -> None:
        """Stop the episode: cancel the sandbox call in flight; later calls raise
        :class:`Stopped`. Idempotent."""
        with self._lock:
            self._stopped = True
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def settle(self, timeout_s: float) -> None:
        """After :meth:`stop`: wait up to ``timeout_s`` for the cancelled sandbox call to
        finish cleaning up."""
        if self._task is not None and not self._task.done():
            await asyncio.wait({self._task}, timeout=timeout_s)


def _copy(task: asyncio.Task[Any], done: concurrent.futures.Future[Any]) -> None:
    if task.cancelled():
        done.cancel()
    elif task.exception() is not None:
        done.set_exception(task.exception())
    else:
        done.set_result(task.result())
