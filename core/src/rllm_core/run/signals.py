"""SIGINT / SIGTERM during a run: ask the loop to stop instead of dying mid-write.

Every handler the core installs goes through this module: :class:`StopSignals` on a run's
event loop (the run lifecycle's), :func:`handled` around a blocking call (the launcher that
forwards signals to torchrun, a follower rank that leaves them to rank 0, the gateway)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["EXIT_CODES", "StopSignals", "handled"]

EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}
"""The exit code of a run stopped by each signal (128 + the signal number)."""


class StopSignals:
    """Routes SIGINT and SIGTERM to ``on_stop`` on the running event loop.

    The first signal records itself in ``received`` and calls ``on_stop`` (the loop cancels
    the step in flight); a second one calls ``on_force`` (the loop gives up waiting for
    cleanup). Use as a context manager inside the loop; the previous handlers come back on exit.
    """

    def __init__(self, on_stop: Callable[[], None], on_force: Callable[[], None]) -> None:
        self.on_stop = on_stop
        self.on_force = on_force
        self.received: signal.Signals | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _handle(self, signum: signal.Signals) -> None:
        if self.received is None:
            self.received = signum
            self.on_stop()
        else:
            self.on_force()

    def __enter__(self) -> StopSignals:
        self._loop = asyncio.get_running_loop()
        for signum in EXIT_CODES:
            self._loop.add_signal_handler(signum, self._handle, signum)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None
        for signum in EXIT_CODES:
            self._loop.remove_signal_handler(signum)

    @property
    def exit_code(self) -> int:
        """130 after SIGINT, 143 after SIGTERM, 0 when none arrived."""
        return EXIT_CODES[self.received] if self.received is not None else 0


@contextlib.contextmanager
def handled(
    handler: Any, signals: tuple[signal.Signals, ...] = tuple(EXIT_CODES)
) -> Iterator[None]:
    """``handler`` (a ``signal.signal`` handler, or ``signal.SIG_IGN``) for ``signals`` while
    the block runs; the previous handlers come back after it."""
    previous = {signum: signal.signal(signum, handler) for signum in signals}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
