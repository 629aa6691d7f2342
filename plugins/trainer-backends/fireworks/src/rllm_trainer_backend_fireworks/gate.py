"""Which sampling client and weight version a request uses, and the switch to the next ones.

A Fireworks hot-load deployment serves one snapshot at a time, and a sampling request does not
name the snapshot it wants: the deployment answers with whatever it serves while the request
runs. A completion therefore comes from the version it is reported with only when the
deployment does not switch while the request runs. So requests and the switch take turns: any
number of requests may run at once, each holding the client and version it read on entry; a
switch waits until none runs, holds new ones back, hot-loads, installs the new client and
version, then lets them go. Requests are coroutines on the sampler's event loop; the switch
runs on the trainer's thread.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from contextlib import asynccontextmanager
from typing import Any

__all__ = ["HotLoadGate"]


class HotLoadGate:
    """The sampling client of the snapshot the deployment serves, its weight version, and the
    hand-over between sampling requests and hot-loads."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._running = 0
        self._switching: Future[None] | None = None
        self._client: Any = None
        self._version = 0

    @property
    def client(self) -> Any:
        return self._client

    @property
    def version(self) -> int:
        return self._version

    @property
    def switching(self) -> bool:
        """True from the moment a switch starts waiting for running requests until its new
        client is installed (or it failed)."""
        return self._switching is not None

    @asynccontextmanager
    async def request(self) -> AsyncIterator[tuple[Any, int]]:
        """Hold the current ``(client, version)`` for one request; waits while a switch is
        under way."""
        while True:
            with self._cond:
                switching = self._switching
                if switching is None:
                    self._running += 1
                    held = self._client, self._version
                    break
            await asyncio.wrap_future(switching)
        try:
            yield held
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify_all()

    def switch(self, load: Callable[[], Any], version: int, timeout: float) -> Any:
        """Wait until no request runs (new ones wait meanwhile), call ``load()``, which
        hot-loads the new snapshot and returns its sampling client, and install that client
        as ``version``. Returns the previous client, which no request uses any more. Raises
        ``TimeoutError`` when requests still run after ``timeout`` seconds; the client and
        version stay as they were when that or ``load()`` fails."""
        switching: Future[None] = Future()
        # A running future cannot be cancelled, so a waiting request that is cancelled
        # (asyncio.wrap_future passes the cancellation on) leaves it to the others.
        switching.set_running_or_notify_cancel()
        with self._cond:
            if self._switching is not None:
                raise RuntimeError("a weight switch is already under way; switch from one thread")
            self._switching = switching
            drained = self._cond.wait_for(lambda: self._running == 0, timeout)
        try:
            if not drained:
                raise TimeoutError(
                    f"sampling requests still ran {timeout} s after weight version {version} was"
                    " saved, so the deployment could not load it; raise request_timeout_s in"
                    " [trainer] or check the deployment's health"
                )
            client = load()
            with self._cond:
                previous, self._client, self._version = self._client, client, version
            return previous
        finally:
            with self._cond:
                self._switching = None
            switching.set_result(None)
