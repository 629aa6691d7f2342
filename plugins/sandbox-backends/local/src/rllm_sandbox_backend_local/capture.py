"""Bounded capture of a command's stdout and stderr."""

from __future__ import annotations

import asyncio

__all__ = ["Capture"]


class Capture(asyncio.SubprocessProtocol):
    """Keeps the first ``limit`` bytes of each stream and discards the rest as it arrives.

    Both pipes are read as data comes, so a command never blocks on a full pipe whatever it
    prints and in whatever order. ``finished`` resolves once the process has exited and both
    pipes are closed.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept = {1: bytearray(), 2: bytearray()}
        self.truncated = False
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._open = {1, 2}
        self._exited = False

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        kept = self.kept[fd]
        room = max(self.limit - len(kept), 0)
        if room:
            kept += data[:room]
        if len(data) > room:
            self.truncated = True

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self._open.discard(fd)
        self._check()

    def process_exited(self) -> None:
        self._exited = True
        self._check()

    def _check(self) -> None:
        if self._exited and not self._open and not self.finished.done():
            self.finished.set_result(None)

    def text(self, fd: int) -> str:
        return self.kept[fd].decode("utf-8", errors="replace")
