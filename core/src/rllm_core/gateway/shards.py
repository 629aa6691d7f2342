"""Several gateway processes behind one session-sharding front (``gateway serve --workers N``).

One gateway process renders, bridges and builds traces on one core. With N workers, N
``gateway serve`` processes listen on free ports of the front's host and a thin front,
:class:`ShardFront`, serves the public address:

- A session belongs to the worker that owns its id on a consistent-hash ring
  (:class:`ShardRing`), so its lineage, token accumulator and traces stay in one process.
- A client reaches that worker directly: ``POST /sessions/{id}/token`` (admin token) answers
  with the owner's ``base_url`` (its port, under the host name the client gave the front), and
  :meth:`ShardFront.session_url` gives the same in Python. Direct traffic costs the front
  nothing; every worker checks tokens itself.
- A session's routes (``/sessions/{id}/...``) sent to the front are relayed to the owner, for
  clients that reach only the front's port.
- ``DELETE /sessions/{id}`` and every write outside a session (``POST /weight_version``) fan
  out to every worker; the answer is the owner's (a session deleted anywhere counts as deleted).
- ``GET /sessions`` and ``GET /metrics`` gather from every worker: the session lists joined,
  the metrics summed with each worker's own under ``workers``. ``GET /health`` (no token) says
  ``degraded`` and names any worker that does not answer.
- Anything else (``GET /v1/models``) goes to the first worker that answers.

The front neither checks tokens nor parses bodies: it forwards the ``Authorization`` header,
and every worker is started with the same admin token, so each accepts the admin token and
mints and verifies the same session tokens (their HMAC key is derived from it).

A worker that is gone is never waited on: a request for it gets a 503 (nothing listens) or a
502 (the connection broke mid-answer) naming the worker, its address and, when it has exited,
its exit status. Its sessions stay unreachable until the gateway is restarted; the other
workers' sessions are unaffected.

Example::

    workers = WorkerProcesses(lambda index: [sys.executable, "-m", "rllm_core", ...], 2)
    urls = workers.start()
    front = ShardFront(urls, processes=workers)
    # serve ``front`` with uvicorn (rllm_core.gateway.serving.AsgiServer)
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import hashlib
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import msgspec

__all__ = ["ShardFront", "ShardRing", "WorkerProcesses"]

log = logging.getLogger("rllm_core.gateway")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"upgrade", b"te"}
_JSON = (b"content-type", b"application/json")
_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class ShardRing:
    """Consistent hashing of session ids onto ``count`` workers, ``replicas`` points each.

    The same id always lands on the same worker for a given ``count``; adding a worker moves
    about ``1 / count`` of the ids, not all of them."""

    def __init__(self, count: int, *, replicas: int = 128) -> None:
        if count < 1:
            raise ValueError(f"a ring needs at least one worker, got {count}")
        points = sorted(
            (_hash(f"worker-{index}#{replica}"), index)
            for index in range(count)
            for replica in range(replicas)
        )
        self._hashes = [point for point, _ in points]
        self._owners = [owner for _, owner in points]
        self.count = count

    def owner(self, session_id: str) -> int:
        """The index of the worker that serves ``session_id``."""
        slot = bisect.bisect(self._hashes, _hash(session_id))
        return self._owners[slot % len(self._owners)]


class WorkerProcesses:
    """``count`` gateway worker processes; ``argv(index)`` is worker ``index``'s command line.

    Each must print its base URL as the first line on stdout in ``gateway serve``'s banner
    form (``... gateway on http://127.0.0.1:PORT ...``). ``env`` is added to the
    environment (the admin token travels there, never on a command line)."""

    def __init__(
        self,
        argv: Callable[[int], list[str]],
        count: int,
        *,
        env: dict[str, str] | None = None,
        start_timeout_s: float = 120.0,
    ) -> None:
        self.argv = argv
        self.count = count
        self.env = {**os.environ, **(env or {})}
        self.start_timeout_s = start_timeout_s
        self.processes: list[subprocess.Popen[str]] = []
        self.urls: list[str] = []

    def start(self) -> list[str]:
        """Start every worker; returns their base URLs once each serves. A worker that exits
        first stops the others and raises :class:`RuntimeError` with its output."""
        for index in range(self.count):
            self.processes.append(
                subprocess.Popen(
                    self.argv(index),
                    stdout=subprocess.PIPE,
                    text=True,
                    env=self.env,
                    start_new_session=True,
                )
            )
        try:
            self.urls = [self._wait_ready(index) for index in range(self.count)]
        except BaseException:
            self.stop()
            raise
        return self.urls

    def _wait_ready(self, index: int) -> str:
        process = self.processes[index]
        assert process.stdout is not None
        found: list[str] = []

        def read() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                if not found and " on http" in line:
                    found.append(line.split(" on ", 1)[1].split()[0])
            # Keep reading (and dropping) the banner so the worker never blocks on a full pipe.

        reader = threading.Thread(target=read, name=f"gateway-worker-{index}", daemon=True)
        reader.start()
        waited = 0.0
        while not found:
            if process.poll() is not None:
                raise RuntimeError(
                    f"gateway worker {index} exited with status {process.returncode} before"
                    " serving; its error is above"
                )
            if waited > self.start_timeout_s:
                raise RuntimeError(
                    f"gateway worker {index} did not serve within {self.start_timeout_s:.0f}s"
                )
            reader.join(0.02)
            waited += 0.02
        return found[0]

    def describe(self, index: int) -> str:
        """``gateway worker I (URL, pid P[, exited with status S])``."""
        url = self.urls[index] if index < len(self.urls) else "?"
        process = self.processes[index]
        status = process.poll()
        exited = f", exited with status {status}" if status is not None else ""
        return f"gateway worker {index} ({url}, pid {process.pid}{exited})"

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM every worker (each closes its trace store), then SIGKILL what is left."""
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


class _Gone(Exception):
    """A worker did not answer: the error to send instead."""

    def __init__(self, status: int, body: bytes) -> None:
        self.status = status
        self.body = body


class ShardFront:
    """The ASGI front over gateway workers at ``urls`` (see the module docstring).

    ``processes``, when given, names each worker's pid and exit status in errors.
    ``request_timeout_s`` bounds a forwarded call (the workers time out first, with their own
    504); ``connect_timeout_s`` how long a worker may take to accept a connection."""

    def __init__(
        self,
        urls: Sequence[str],
        *,
        processes: WorkerProcesses | None = None,
        request_timeout_s: float = 1800.0,
        connect_timeout_s: float = 5.0,
        max_connections: int = 1024,
        max_body_bytes: int = 8 * 1024 * 1024,
    ) -> None:
        if not urls:
            raise ValueError("the front needs at least one gateway worker URL")
        self.urls = [url.rstrip("/") for url in urls]
        self.ring = ShardRing(len(self.urls))
        self.processes = processes
        self.request_timeout_s = request_timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.max_connections = max_connections
        self.max_body_bytes = max_body_bytes
        self._client: Any = None

    # ---------------------------------------------------------------- ASGI entry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await self.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return

    def _http_client(self) -> Any:
        if self._client is None:
            import httpx

            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(
                    self.request_timeout_s + 30, connect=self.connect_timeout_s, pool=None
                ),
                limits=httpx.Limits(
                    max_connections=self.max_connections,
                    max_keepalive_connections=self.max_connections,
                ),
            )
        return self._client

    async def aclose(self) -> None:
        """Close the connections to the workers."""
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def owner(self, session_id: str) -> int:
        """The index of the worker that serves ``session_id``."""
        return self.ring.owner(session_id)

    def session_url(self, session_id: str, host: str | None = None) -> str:
        """The OpenAI ``base_url`` of ``session_id`` on the worker that owns it,
        ``http://HOST:PORT/sessions/{id}/v1``: a client that uses it skips the front. ``host``
        is the name by which the client reaches this machine (default: the worker's bound
        address); the port is the worker's."""
        url = self.urls[self.owner(session_id)]
        if host is not None:
            url = f"http://{_with_port(host, url.rsplit(':', 1)[1])}"
        return f"{url}/sessions/{session_id}/v1"

    def _worker_host(self, index: int, scope: Scope) -> str:
        """``host:port`` of worker ``index`` under the name the client gave the front."""
        port = self.urls[index].rsplit(":", 1)[1]
        for name, value in scope["headers"]:
            if name == b"host":
                return _with_port(value.decode("latin-1"), port)
        return self.urls[index].split("://", 1)[1]

    def _name(self, index: int) -> str:
        if self.processes is not None and index < len(self.processes.processes):
            return self.processes.describe(index)
        return f"gateway worker {index} ({self.urls[index]})"

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"]
        path = scope["path"]
        parts = path.rstrip("/").split("/") if len(path) > 1 else ["", ""]
        body = await _read_body(receive, self.max_body_bytes)
        if body is None:
            message = (
                f"the request body is over the gateway's limit of {self.max_body_bytes} bytes;"
                " shorten the conversation or restart the gateway with a larger --max-body-bytes"
            )
            error = {"message": message, "type": "invalid_request_error", "param": None}
            return await _full(send, 413, _encode({"error": {**error, "code": "body_too_large"}}))
        headers = [(k, v) for k, v in scope["headers"] if k not in _HOP_BY_HOP and k != b"host"]
        query = scope.get("query_string", b"")
        target = path + ("?" + query.decode("latin-1") if query else "")
        try:
            if len(parts) >= 3 and parts[1] == "sessions":
                owner = self.owner(parts[2])
                if method == "DELETE" and len(parts) == 3:
                    return await self._fan_out(method, target, headers, body, send, owner)
                if method == "POST" and len(parts) == 4 and parts[3] == "token":
                    # The owner answers with its own address as this client reaches it, so the
                    # session's traffic goes there without passing through the front.
                    headers.append((b"host", self._worker_host(owner, scope).encode()))
                return await self._forward(owner, method, target, headers, body, receive, send)
            if path in ("/sessions", "/metrics", "/health") and method in ("GET", "HEAD"):
                return await self._gather(path, target, headers, send)
            if method in ("GET", "HEAD"):
                return await self._any(method, target, headers, body, receive, send)
            return await self._fan_out(method, target, headers, body, send, 0)
        except _Gone as gone:
            await _full(send, gone.status, gone.body)

    # ---------------------------------------------------------------- one worker

    def _gone(self, index: int, exc: BaseException, *, listening: bool) -> _Gone:
        status = 502 if listening else 503
        what = "broke the connection" if listening else "is not reachable"
        message = (
            f"{self._name(index)} {what} ({type(exc).__name__}: {exc}); its sessions are"
            " unavailable until the gateway is restarted, other sessions are served"
        )
        log.error("%s", message)
        return _Gone(
            status,
            _encode(
                {
                    "error": {
                        "message": message,
                        "type": "upstream_error",
                        "param": None,
                        "code": "gateway_worker_unavailable",
                    }
                }
            ),
        )

    async def _open(
        self, index: int, method: str, target: str, headers: list[Any], body: bytes
    ) -> Any:
        """Send a request to worker ``index``; the response is streamed (close it)."""
        import httpx

        client = self._http_client()
        request = client.build_request(
            method, self.urls[index] + target, headers=headers, content=body
        )
        try:
            return await client.send(request, stream=True)
        except httpx.ConnectError as exc:
            raise self._gone(index, exc, listening=False) from None
        except httpx.TransportError as exc:
            raise self._gone(index, exc, listening=True) from None

    async def _call(
        self, index: int, method: str, target: str, headers: list[Any], body: bytes
    ) -> tuple[int, bytes]:
        import httpx

        response = await self._open(index, method, target, headers, body)
        try:
            return response.status_code, await response.aread()
        except httpx.TransportError as exc:
            raise self._gone(index, exc, listening=True) from None
        finally:
            await response.aclose()

    async def _forward(
        self,
        index: int,
        method: str,
        target: str,
        headers: list[Any],
        body: bytes,
        receive: Receive,
        send: Send,
    ) -> None:
        """Relay worker ``index``'s answer as it arrives (streams included)."""
        import httpx

        response = await self._open(index, method, target, headers, body)
        watcher = None
        try:
            out = [(k, v) for k, v in response.headers.raw if k.lower() not in _HOP_BY_HOP]
            await send(
                {"type": "http.response.start", "status": response.status_code, "headers": out}
            )
            if response.headers.get("content-type", "").startswith("text/event-stream"):
                # A client that leaves mid-stream closes the worker's connection too, so the
                # worker abandons the call as it would for a direct client.
                watcher = asyncio.get_running_loop().create_task(
                    _close_on_disconnect(receive, response)
                )
            try:
                async for chunk in response.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except httpx.TransportError as exc:
                log.error("%s broke off an answer: %s", self._name(index), exc)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            if watcher is not None:
                watcher.cancel()
            await response.aclose()

    async def _any(
        self,
        method: str,
        target: str,
        headers: list[Any],
        body: bytes,
        receive: Receive,
        send: Send,
    ) -> None:
        """The first worker that answers serves a route no session owns."""
        last: _Gone | None = None
        for index in range(len(self.urls)):
            try:
                return await self._forward(index, method, target, headers, body, receive, send)
            except _Gone as gone:
                last = gone
        assert last is not None
        raise last

    # ---------------------------------------------------------------- every worker

    async def _all(
        self, method: str, target: str, headers: list[Any], body: bytes
    ) -> list[tuple[int, bytes] | _Gone]:
        async def one(index: int) -> tuple[int, bytes] | _Gone:
            try:
                return await self._call(index, method, target, headers, body)
            except _Gone as gone:
                return gone

        return list(await asyncio.gather(*(one(i) for i in range(len(self.urls)))))

    async def _fan_out(
        self,
        method: str,
        target: str,
        headers: list[Any],
        body: bytes,
        send: Send,
        owner: int,
    ) -> None:
        """Send the request to every worker. The answer: the first refusal (401/403, the same
        on every worker), else the first unreachable worker's error, else the owner's answer,
        or, for a delete the owner did not know, any worker's success."""
        answers = await self._all(method, target, headers, body)
        for answer in answers:
            if not isinstance(answer, _Gone) and answer[0] in (401, 403):
                return await _full(send, *answer)
        gone = [answer for answer in answers if isinstance(answer, _Gone)]
        if gone:
            raise gone[0]
        chosen = answers[owner]
        assert not isinstance(chosen, _Gone)
        if chosen[0] >= 400:
            chosen = next((a for a in answers if a[0] < 400), chosen)  # type: ignore[index]
        await _full(send, *chosen)  # type: ignore[misc]

    async def _gather(self, path: str, target: str, headers: list[Any], send: Send) -> None:
        answers = await self._all("GET", target, headers, b"")
        if path == "/health":
            workers = []
            for index, answer in enumerate(answers):
                if isinstance(answer, _Gone):
                    error = _decode(answer.body)["error"]["message"]
                    workers.append({"worker": index, "status": "down", "error": error})
                else:
                    workers.append({"worker": index, **_decode(answer[1])})
            degraded = any(w.get("status") != "ok" for w in workers)
            return await _full(
                send,
                200,
                _encode(
                    {
                        "status": "degraded" if degraded else "ok",
                        "in_flight": sum(w.get("in_flight", 0) for w in workers),
                        "requests_served": sum(w.get("requests_served", 0) for w in workers),
                        "workers": workers,
                    }
                ),
            )
        for answer in answers:
            if isinstance(answer, _Gone):
                raise answer
            if answer[0] != 200:
                return await _full(send, *answer)
        bodies = [_decode(answer[1]) for answer in answers]  # type: ignore[index]
        if path == "/sessions":
            ids = list(dict.fromkeys(sid for body in bodies for sid in body["data"]))
            return await _full(send, 200, _encode({"object": "list", "data": ids}))
        return await _full(send, 200, _encode(_sum_metrics(bodies)))


def _with_port(host: str, port: str) -> str:
    """``host`` (a ``Host`` header: a name, an IPv4 or a bracketed IPv6 address, with or
    without a port) with its port replaced by ``port``."""
    if host.startswith("["):
        name = host[: host.index("]") + 1]
    elif host.count(":") > 1:
        name = f"[{host}]"
    else:
        name = host.split(":", 1)[0]
    return f"{name}:{port}"


def _sum_metrics(bodies: list[dict[str, Any]]) -> dict[str, Any]:
    """Every worker's metrics under ``workers``, with counts summed across them at the top."""
    total: dict[str, Any] = {}
    for body in bodies:
        for key, value in body.items():
            if isinstance(value, bool):
                continue
            if isinstance(value, int):
                total[key] = total.get(key, 0) + value
            elif isinstance(value, dict) and key in ("resets", "status", "denied"):
                merged = total.setdefault(key, {})
                for name, count in value.items():
                    if isinstance(count, int) and not isinstance(count, bool):
                        merged[name] = merged.get(name, 0) + count
    total["workers"] = [{"worker": index, **body} for index, body in enumerate(bodies)]
    return total


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole request body; ``None`` once it grows over ``limit``."""
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def _close_on_disconnect(receive: Receive, response: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    await response.aclose()


async def _full(send: Send, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [_JSON, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})
