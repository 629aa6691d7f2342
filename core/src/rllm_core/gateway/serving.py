"""Serving an ASGI app with uvicorn inside this process: in a background thread with its own
event loop, or as a task on the caller's loop.

Both the gateway and the test worker (:mod:`rllm_core.testing.fakeworker`) use it. The socket is
bound before uvicorn starts, so port 0 picks a free port and :attr:`AsgiServer.port` is known at
once. uvicorn runs with httptools and without an access log, server or date header: on a 2-core
machine that is the cheapest configuration per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["AsgiServer", "new_event_loop"]

log = logging.getLogger("rllm_core.gateway")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop when uvloop is installed, else asyncio's default."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class AsgiServer:
    """One ASGI app served by uvicorn on ``host:port``.

    ``on_close`` is awaited on the serving loop after uvicorn has stopped (to close clients
    bound to that loop). ``stop_timeout_s`` is how long requests in flight get to finish.
    """

    def __init__(
        self,
        app: Any,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
        stop_timeout_s: float = 10.0,
        on_close: Callable[[], Awaitable[None]] | None = None,
        name: str = "asgi-server",
    ) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.log_level = log_level
        self.stop_timeout_s = stop_timeout_s
        self.on_close = on_close
        self.name = name
        self._server: Any = None
        self._socket: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the running server."""
        if self._socket is None:
            raise RuntimeError(f"{self.name} is not running; start it first")
        host = self.host if ":" not in self.host else f"[{self.host.strip('[]')}]"
        return f"http://{host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._thread is not None or self._task is not None

    def _prepare(self) -> None:
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        import uvicorn

        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        self._socket = socket.create_server((self.host.strip("[]"), self.port), family=family)
        self.port = self._socket.getsockname()[1]
        self._server = uvicorn.Server(
            uvicorn.Config(
                self.app,
                http="httptools",
                ws="none",
                lifespan="on",
                log_config=None,
                log_level=self.log_level,
                access_log=False,
                proxy_headers=False,
                server_header=False,
                date_header=False,
                timeout_graceful_shutdown=self.stop_timeout_s,
            )
        )

    async def _serve(self) -> None:
        try:
            await self._server.serve(sockets=[self._socket])
        finally:
            if self.on_close is not None:
                await self.on_close()

    def _close_socket(self) -> None:
        if self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.close()

    # ---------------------------------------------------------------- in a thread

    def start(self) -> str:
        """Serve in a background thread; returns the base URL once connections are accepted."""
        self._prepare()
        self._failure = None
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                self._thread = None
                self._close_socket()
                raise RuntimeError(f"{self.name} failed to start: {self._failure!r}")
            self._thread.join(0.01)
        return self.base_url

    def _run(self) -> None:
        loop = new_event_loop()
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:
            self._failure = exc
            log.exception("%s stopped with an error", self.name)
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def stop(self) -> None:
        """Stop a server started with :meth:`start`. Idempotent."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._server.should_exit = True
        thread.join(self.stop_timeout_s + 5)
        self._close_socket()
        if thread.is_alive():
            log.warning("%s did not stop within %.0fs", self.name, self.stop_timeout_s + 5)

    # ---------------------------------------------------------------- on the caller's loop

    async def astart(self) -> str:
        """Serve as a task on the running loop; returns the base URL once serving."""
        self._prepare()
        self._task = asyncio.get_running_loop().create_task(self._serve())
        while not self._server.started:
            if self._task.done():
                task, self._task = self._task, None
                self._close_socket()
                exc = None if task.cancelled() else task.exception()
                raise RuntimeError(f"{self.name} failed to start: {exc!r}")
            await asyncio.sleep(0.01)
        return self.base_url

    async def wait(self) -> None:
        """Wait until a server started with :meth:`astart` stops (SIGINT or SIGTERM stop it
        when it runs on the main thread)."""
        task = self._task
        if task is None:
            return
        try:
            await task
        finally:
            self._task = None
            self._close_socket()

    async def astop(self) -> None:
        """Stop a server started with :meth:`astart`. Idempotent."""
        task, self._task = self._task, None
        if task is None:
            return
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await task
        self._close_socket()
