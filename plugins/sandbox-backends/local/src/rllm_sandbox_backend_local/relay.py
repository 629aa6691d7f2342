"""The gateway relay of a sandbox with ``network = "gateway"``.

Such a sandbox has its own network namespace holding only loopback. A short helper process
joins that namespace (and nothing else: it keeps the host's filesystem, process table and
identity), binds a TCP listener on the sandbox's ``127.0.0.1``, hands the listening socket
to this process over a socket pair and exits. This process then accepts the sandbox's
connections on it and opens, for each one, a connection to the gateway's host and port, the
only destination it ever connects to. No process of the relay runs in the sandbox, so none
of the sandbox's processes can kill, replace or reconfigure it; the listener's port is
taken, so none can listen there instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import sys
from urllib.parse import urlsplit, urlunsplit

from rllm_core.errors import SandboxCreateError

__all__ = ["GatewayRelay", "gateway_address"]

_HELPER = """\
import socket, sys
listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
listener.bind(("127.0.0.1", 0))
listener.listen(128)
channel = socket.socket(fileno=int(sys.argv[1]))
socket.send_fds(channel, [b"L"], [listener.fileno()])
"""
_HELPER_TIMEOUT_S = 20.0
_CONNECT_TIMEOUT_S = 10.0
_CHUNK = 1 << 16


def gateway_address(url: str) -> tuple[str, int]:
    """The host and port the relay connects to for the gateway at ``url`` (``http`` only)."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError as exc:
        raise SandboxCreateError(f"gateway_url {url!r} has an invalid port: {exc}") from exc
    if parts.scheme != "http" or not parts.hostname:
        raise SandboxCreateError(
            f"gateway_url {url!r} is not an http://host[:port] URL; the local sandbox relays"
            " plain HTTP to the gateway (serve it over http on this machine)"
        )
    return parts.hostname, port or 80


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy ``reader`` to ``writer`` until end of file, then half-close ``writer``."""
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()


class GatewayRelay:
    """Relays connections to ``127.0.0.1:<port>`` in one sandbox to the gateway's address.

    Open it with :meth:`open`; ``inside_url`` is the gateway URL as the sandbox's processes
    reach it. :meth:`close` stops listening and drops every relayed connection.
    """

    def __init__(
        self,
        server: asyncio.Server,
        listener: socket.socket,
        target: tuple[str, int],
        inside_url: str,
        port: int,
    ) -> None:
        self._server = server
        self._listener = listener
        self._target = target
        self.inside_url = inside_url
        self.port = port
        self._connections: set[asyncio.Task[None]] = set()
        self._loop = asyncio.get_running_loop()
        self._closed = False

    @classmethod
    async def open(
        cls, url: str, *, holder_pid: int, user_namespace: bool, nsenter: str | None = None
    ) -> GatewayRelay:
        """A relay from the network namespace of the sandbox whose holder is ``holder_pid`` to
        the host and port of ``url``; ``user_namespace`` says that the holder runs in a user
        namespace, which must be joined first."""
        target = gateway_address(url)
        listener = await asyncio.to_thread(
            _listen_inside,
            nsenter or shutil.which("nsenter") or "nsenter",
            holder_pid,
            user_namespace,
        )
        try:
            listener.setblocking(False)
            port = listener.getsockname()[1]
            relay: GatewayRelay | None = None

            async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                assert relay is not None
                await relay._serve(reader, writer)

            server = await asyncio.start_server(serve, sock=listener)
        except BaseException:
            listener.close()
            raise
        parts = urlsplit(url)
        inside = urlunsplit(parts._replace(netloc=f"127.0.0.1:{port}"))
        relay = cls(server, listener, target, inside, port)
        return relay

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            try:
                # Not asyncio.wait_for: on 3.11 it can swallow a cancellation that meets the
                # connection's completion, and close() would wait on the relayed stream.
                async with asyncio.timeout(_CONNECT_TIMEOUT_S):
                    upstream_reader, upstream_writer = await asyncio.open_connection(*self._target)
            except (OSError, TimeoutError):
                return
            try:
                await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
            finally:
                upstream_writer.close()
        except asyncio.CancelledError:
            # Only close() cancels a connection; asyncio's stream server (3.11) would log
            # the cancellation as an error of the handler.
            pass
        finally:
            writer.close()
            self._connections.discard(task)

    async def close(self) -> None:
        """Stop listening and drop the relayed connections. Idempotent; from another event
        loop than the one it was opened on, only closes the listening socket."""
        if self._closed:
            return
        self._closed = True
        try:
            same_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            same_loop = False
        if not same_loop or self._loop.is_closed():
            self._listener.close()
            return
        self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(self._connections, timeout=5.0)
        await self._server.wait_closed()


def _listen_inside(nsenter: str, holder_pid: int, user_namespace: bool) -> socket.socket:
    """A TCP socket listening on ``127.0.0.1`` in the holder's network namespace."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    argv = [nsenter, "--target", str(holder_pid)]
    if user_namespace:
        argv += ["-U", "--preserve-credentials"]
    argv += ["-n", "--", sys.executable, "-I", "-S", "-c", _HELPER, str(theirs.fileno())]
    try:
        with ours, theirs:
            try:
                done = subprocess.run(
                    argv,
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    pass_fds=(theirs.fileno(),),
                    timeout=_HELPER_TIMEOUT_S,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise SandboxCreateError(
                    f"could not open the gateway relay of the sandbox ({argv[0]}): {exc}"
                ) from exc
            if done.returncode != 0:
                detail = done.stderr.decode(errors="replace").strip()
                raise SandboxCreateError(
                    "could not open the gateway relay in the sandbox's network namespace:"
                    f" {detail or f'exit code {done.returncode}'}"
                )
            ours.settimeout(_HELPER_TIMEOUT_S)
            _, fds, _, _ = socket.recv_fds(ours, 16, 1)
    except OSError as exc:
        raise SandboxCreateError(f"could not receive the gateway relay's socket: {exc}") from exc
    if not fds:
        raise SandboxCreateError("the gateway relay's helper sent no socket")
    return socket.socket(fileno=fds[0])
