"""The gateway's HTTP surface: a raw ASGI application over a :class:`GatewayEngine`.

Routes (``{sid}`` is a session id: letters, digits and ``._:@-``, at most 256 characters)::

    POST   /sessions/{sid}/v1/chat/completions   OpenAI chat completions, plain or SSE
    POST   /sessions/{sid}/v1/completions        OpenAI (legacy) completions, plain or SSE
    POST   /sessions/{sid}/v1/responses          OpenAI Responses, plain or SSE events
    GET    /v1/models, /sessions/{sid}/v1/models the served model
    GET    /sessions                             session ids
    GET    /sessions/{sid}                       a session's statistics
    GET    /sessions/{sid}/traces                traces with full prompt ids (?format=chain:
                                                 the stored delta chain)
    DELETE /sessions/{sid}                       forget a session and delete its traces
    POST   /sessions/{sid}/token                 open a session and mint its session token;
                                                 the answer's ``base_url`` is its OpenAI URL
    POST   /sessions/{sid}/configure             open a session and enforce ``{"enforced":
                                                 {sampling params} | null}`` on its calls
    POST   /sessions/{sid}/release               forget a session's live state (its token is
                                                 refused from then on), keep its traces; the
                                                 answer holds what it was ``denied``; with
                                                 ``?take=traces`` also its stored records
                                                 (chain form), deleted here
    POST   /weight_version                       announce the weight version ``{"version": N}``
                                                 that results report from now on; with
                                                 ``"model"`` also the model name sent upstream
    GET    /health                               liveness, load and event-loop lag (no auth)
    GET    /metrics                              counters, lag, denials, upstream workers

Auth (unless built without a token): the admin token (``token``) reaches every route. A session
token (:mod:`rllm_core.gateway.tokens`) reaches only its own session's model routes,
``/sessions/{sid}/v1/...``, and ``GET /v1/models``, and only while that session is open (see
:mod:`rllm_core.gateway.engine`): after ``release_session`` it is refused. Every refusal is
counted in :class:`~rllm_core.gateway.metrics.GatewayMetrics` and logged as one WARNING.

Every error is JSON in the OpenAI shape ``{"error": {"message", "type", "param", "code"}}``:
400 for a malformed body, a field of the wrong type or value, or an over-long prompt; 401 for a
missing or wrong bearer token or a session token whose session is closed; 403 for a session
token outside its reach; 404 for an unknown route or session; 405 for a wrong method;
413 for a body over ``max_body_bytes``; 502/503 when the upstream fails, 504 when it or the
call times out; 500 (logged with its traceback) for anything unexpected. The server keeps
serving after any of them.

Raw ASGI rather than a framework: on a 2-core machine a Starlette route measured ~4x the CPU per
request of this dispatch (0.16 vs 0.04 ms), and the gateway's budget is under a millisecond.

Slow calls: the status of a plain (non-streamed) answer is sent only once it is known, so a
failure always gets its own status (502/503 from the upstream, 504 past ``request_timeout_s``)
and never a 200 with an error body; nothing is sent while the call runs, so a client's read
timeout must cover the call (the official clients wait 600 s), or the client streams. A stream
starts (status 200) with its first event, or after ``heartbeat_interval_s`` with an SSE comment
line, then one every interval, so proxies and clients do not time it out; an error before the
start gets its own status, one after it an SSE ``data: {"error": ...}`` event before ``[DONE]``
(the official clients raise it). After ``request_timeout_s`` the call is abandoned.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any
from urllib.parse import parse_qs

import msgspec

from rllm_core.errors import (
    UpstreamError,
    UpstreamRejectedError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from rllm_core.gateway import protocol, responses
from rllm_core.gateway.engine import (
    MAX_SESSION_ID,
    GatewayEngine,
    GatewayError,
    InvalidChatRequestError,
    PromptTooLongError,
    SessionClosedError,
    UnknownSessionError,
    calls_open_sessions,
    is_session_id,
)
from rllm_core.gateway.engine import ChatRequest as EngineChatRequest
from rllm_core.gateway.metrics import GatewayMetrics
from rllm_core.gateway.protocol import HTTPError
from rllm_core.gateway.tokens import SessionTokens
from rllm_core.ports import SharedPool, WorkerPool
from rllm_core.ports.rendering import StreamsToolCalls
from rllm_core.routing import routing_key
from rllm_core.types import SamplingParams

__all__ = ["GatewayApp"]

log = logging.getLogger("rllm_core.gateway")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

_JSON = (b"content-type", b"application/json")
_SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]
_HEARTBEAT_SSE = b": keep-alive\n\n"
LOGGED_DENIALS = 20
"""Refusals logged per open session (without one: per reason) before one in 1000 is."""


class _Response:
    """Tracks what was sent on one request, so errors after the headers are handled right."""

    __slots__ = ("send", "started", "status", "stream")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = False
        self.status = 0
        self.stream = False

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.started = True
        self.status = status
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def full(
        self, status: int, body: bytes, headers: Sequence[tuple[bytes, bytes]] = (_JSON,)
    ) -> None:
        await self.start(status, [*headers, (b"content-length", str(len(body)).encode())])
        await self.send({"type": "http.response.body", "body": body})

    async def chunk(self, body: bytes, more: bool = True) -> None:
        await self.send({"type": "http.response.body", "body": body, "more_body": more})


class _Heartbeat:
    """Starts a stream (status 200) and sends SSE comment lines while a slow call runs. Only
    streams get one: a plain answer's status must wait for the outcome."""

    def __init__(self, response: _Response, interval_s: float) -> None:
        self.response = response
        self.interval_s = interval_s
        self._stopped = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._timer = asyncio.get_running_loop().call_later(interval_s, self._begin)

    def _begin(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        response = self.response
        await response.start(200, list(_SSE_HEADERS))
        while not self._stopped.is_set():
            await response.chunk(_HEARTBEAT_SSE)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await self._stopped.wait()

    async def stop(self) -> None:
        self._timer.cancel()
        self._stopped.set()
        if self._task is not None:
            try:
                await self._task
            except Exception:  # a client gone mid-heartbeat must not fail the request
                log.debug("heartbeat ended early", exc_info=True)


class GatewayApp:
    """The ASGI application. Build it through :class:`~rllm_core.gateway.server.Gateway`,
    or directly for a custom server.

    ``token`` is the admin token: the bearer token that reaches every route but ``/health``,
    which needs none (``None``: no auth at all). :attr:`session_tokens` mints the tokens that
    reach one session (see the module docstring).
    ``default_params`` fills the sampling fields a request leaves out. ``upstreams`` (the sampler,
    when it is a :class:`~rllm_core.ports.WorkerPool`) is reported by ``/health`` and
    ``/metrics``.
    """

    def __init__(
        self,
        engine: GatewayEngine,
        *,
        token: str | None,
        max_body_bytes: int = 8 * 1024 * 1024,
        heartbeat_interval_s: float = 10.0,
        request_timeout_s: float = 1800.0,
        default_params: SamplingParams | None = None,
        upstreams: WorkerPool | None = None,
    ) -> None:
        self.engine = engine
        self.model = engine.model
        self.token = token
        self._expected_auth = f"Bearer {token}".encode() if token else None
        self.session_tokens = SessionTokens(token) if token else None
        self.max_body_bytes = max_body_bytes
        self.heartbeat_interval_s = heartbeat_interval_s
        self.request_timeout_s = request_timeout_s
        self.default_params = default_params or SamplingParams()
        self.upstreams = upstreams
        self.metrics = GatewayMetrics()
        self._decode_one = engine.renderer.decode

    # ---------------------------------------------------------------- ASGI entry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.metrics.lag.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.metrics.lag.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        metrics = self.metrics
        metrics.request_started()
        response = _Response(send)
        try:
            await self._dispatch(scope, receive, response)
        except HTTPError as exc:
            await self._error(response, exc)
        except Exception as exc:
            log.exception("%s %s failed", scope.get("method"), scope.get("path"))
            await self._error(
                response,
                HTTPError(
                    500,
                    f"internal error: {type(exc).__name__}: {exc}; the gateway logged the"
                    " traceback",
                    type="server_error",
                    code="internal_error",
                ),
            )
        finally:
            metrics.request_finished(response.status or 500)

    async def _error(self, response: _Response, exc: HTTPError) -> None:
        if not response.started:
            await response.full(exc.status, exc.body(), [_JSON, *exc.headers])
        elif response.stream:
            await response.chunk(b"data: " + exc.body() + b"\n\n" + protocol.SSE_DONE, False)
        else:
            # A plain answer starts only with its whole body: nothing more can be sent.
            log.warning("error after a complete answer was sent: %s", exc.message)

    # ---------------------------------------------------------------- routing

    def _authorized(self, scope: Scope, method: str, path: str) -> str | None:
        """The session a session token reaches; ``None`` for the admin token or without auth.
        A missing or wrong token, or a session token whose session is closed, is a 401."""
        if self._expected_auth is None or self.session_tokens is None:
            return None
        for name, value in scope["headers"]:
            if name == b"authorization":
                if hmac.compare_digest(value, self._expected_auth):
                    return None
                session_id = None
                if value.startswith(b"Bearer "):
                    session_id = self.session_tokens.session_of(value[7:].decode("latin-1"))
                if session_id is None:
                    raise self._deny(
                        401,
                        "invalid_token",
                        method,
                        path,
                        None,
                        "the bearer token is wrong; use the admin token the gateway printed or"
                        " was started with, or a session token it minted",
                        type="authentication_error",
                        code="invalid_api_key",
                    )
                if not self.engine.is_open(session_id):
                    raise self._closed(session_id, method, path)
                return session_id
        raise self._deny(
            401,
            "missing_token",
            method,
            path,
            None,
            "missing bearer token: send 'Authorization: Bearer <token>' (the OpenAI client's"
            " api_key)",
            type="authentication_error",
            code="missing_api_key",
        )

    def _check_reach(self, session_id: str, method: str, path: str, parts: list[str]) -> None:
        """Refuse (403) a session token's request outside its own model routes."""
        if path == "/v1/models" or parts[1:4] == ["sessions", session_id, "v1"]:
            return
        other = len(parts) >= 3 and parts[1] == "sessions" and parts[2] not in ("", session_id)
        shown = _shown(path)
        raise self._deny(
            403,
            "other_session" if other else "admin_only",
            method,
            path,
            session_id,
            f"this token belongs to session {session_id!r} and reaches only"
            f" /sessions/{session_id}/v1/... (chat/completions, completions, responses, models)"
            f" and GET /v1/models; {method} {shown} "
            + ("is another session's" if other else "needs the gateway's admin token"),
            type="permission_error",
            code="forbidden",
        )

    def _closed(self, session_id: str, method: str, path: str) -> HTTPError:
        return self._deny(
            401,
            "session_closed",
            method,
            path,
            session_id,
            f"the session token of session {session_id!r} has expired: the session was"
            " released (its episode ended) or is not open on this gateway; a session token"
            " works only while its session is open",
            type="authentication_error",
            code="session_closed",
        )

    def _deny(
        self,
        status: int,
        reason: str,
        method: str,
        path: str,
        session_id: str | None,
        message: str,
        *,
        type: str,
        code: str,
    ) -> HTTPError:
        """Count and log one refused request; returns the error to raise."""
        self.metrics.record_denial(
            status=status, reason=reason, method=method, path=path, session_id=session_id
        )
        count = self.engine.note_denied(session_id) if session_id is not None else 0
        if count == 0:
            count = self.metrics.denied_by_reason[reason]
        # An agent can send refused requests as fast as it likes: every one is counted, the
        # first few logged, so the log cannot be grown without bound.
        if count <= LOGGED_DENIALS or count % 1000 == 0:
            owner = f", a token of session {session_id!r}" if session_id is not None else ""
            log.warning("denied %s %r: %d %s%s", method, _shown(path), status, reason, owner)
        elif count == LOGGED_DENIALS + 1:
            whose = f"session {session_id!r}" if session_id is not None else reason
            log.warning(
                "denied: further refusals of %s are counted in /metrics, one logged in 1000",
                whose,
            )
        return HTTPError(status, message, type=type, code=code)

    async def _dispatch(self, scope: Scope, receive: Receive, response: _Response) -> None:
        method = scope["method"]
        path = scope["path"]
        if len(path) > 1 and path.endswith("/"):
            path = path.rstrip("/")
        if path == "/health":
            _allow(method, "GET", path)
            return await response.full(200, protocol.encode(self._health()))
        reach = self._authorized(scope, method, path)
        # parts[0] is "" for the leading slash.
        parts = path.split("/")
        if reach is None:
            return await self._route(method, path, parts, scope, receive, response)
        self._check_reach(reach, method, path, parts)
        # A call that arrives after the release must not open the session again.
        opens = calls_open_sessions.set(False)
        try:
            await self._route(method, path, parts, scope, receive, response)
        except SessionClosedError:
            raise self._closed(reach, method, path) from None
        finally:
            calls_open_sessions.reset(opens)

    async def _route(
        self,
        method: str,
        path: str,
        parts: list[str],
        scope: Scope,
        receive: Receive,
        response: _Response,
    ) -> None:
        if len(parts) >= 3 and parts[1] == "sessions":
            sid = parts[2]
            if not is_session_id(sid):
                raise HTTPError(
                    400,
                    f"session id {sid!r} is invalid: use letters, digits and '._:@-', at most"
                    f" {MAX_SESSION_ID} characters, starting with a letter or digit",
                    param="session_id",
                    code="invalid_session_id",
                )
            rest = "/".join(parts[3:])
            if rest == "v1/chat/completions":
                _allow(method, "POST", path)
                self.metrics.model_calls += 1
                return await self._chat(sid, scope, receive, response)
            if rest == "v1/completions":
                _allow(method, "POST", path)
                self.metrics.model_calls += 1
                return await self._complete(sid, scope, receive, response)
            if rest == "v1/responses":
                _allow(method, "POST", path)
                self.metrics.model_calls += 1
                return await self._respond(sid, scope, receive, response)
            if rest == "v1/models":
                _allow(method, "GET", path)
                return await response.full(200, self._models())
            if rest == "traces":
                _allow(method, "GET", path)
                return await response.full(200, self._traces(sid, scope))
            if rest == "token":
                _allow(method, "POST", path)
                return await response.full(200, self._mint(sid, scope))
            if rest == "configure":
                _allow(method, "POST", path)
                body = await self._body(scope, receive)
                return await response.full(200, self._configure(sid, body))
            if rest == "release":
                _allow(method, "POST", path)
                return await response.full(200, self._release(sid, scope))
            if rest == "":
                _allow(method, ("GET", "DELETE"), path)
                if method == "DELETE":
                    return await response.full(200, self._delete(sid))
                return await response.full(200, self._stats(sid))
        elif path == "/sessions":
            _allow(method, "GET", path)
            return await response.full(
                200, protocol.encode({"object": "list", "data": self.engine.session_ids()})
            )
        elif path == "/v1/models":
            _allow(method, "GET", path)
            return await response.full(200, self._models())
        elif path == "/metrics":
            _allow(method, "GET", path)
            return await response.full(200, protocol.encode(self._metrics()))
        elif path == "/weight_version":
            _allow(method, "POST", path)
            body = await self._body(scope, receive)
            return await response.full(200, protocol.encode(self._announce(body)))
        hint = ""
        if path.startswith("/v1/"):
            hint = f"; model calls go to /sessions/{{session_id}}{path}"
        raise HTTPError(404, f"no route {method} {path}{hint}", code="not_found")

    # ---------------------------------------------------------------- bodies

    async def _body(self, scope: Scope, receive: Receive) -> bytes:
        limit = self.max_body_bytes
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    raise HTTPError(400, "the Content-Length header is not a number") from None
                if declared > limit:
                    raise _too_large(declared, limit)
                break
        chunks = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise HTTPError(400, "the client disconnected before sending the whole body")
            chunk = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > limit:
                    raise _too_large(size, limit)
                chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    # ---------------------------------------------------------------- model calls

    async def _chat(self, sid: str, scope: Scope, receive: Receive, response: _Response) -> None:
        body = protocol.decode_chat(await self._body(scope, receive))
        messages, tools, choice, params = protocol.to_chat_parts(body, self.default_params)
        request = EngineChatRequest(
            messages=messages,
            tools=tools,
            params=params,
            tool_choice="auto" if choice.mode == "none" else choice.mode,
            tool_name=choice.name,
        )
        if body.stream:
            renderer = self.engine.renderer
            parse = functools.partial(renderer.parse_response, tools=tools)

            def writer_for(trace_id: str) -> protocol.ChatStream:
                calls = None
                if isinstance(renderer, StreamsToolCalls):
                    calls = protocol.StreamedText(
                        renderer.tool_call_stream(tools=tools),
                        renderer.decode,
                        renderer.stop_token_ids(),
                    )
                return protocol.ChatStream(
                    trace_id=trace_id,
                    model=self.model,
                    parse=parse,
                    decode=self._decode_one,
                    logprobs=bool(body.logprobs),
                    include_usage=bool(body.stream_options and body.stream_options.include_usage),
                    token_ids=bool(body.return_token_ids),
                    tool_calls=calls,
                )

            return await self._stream_chat(sid, request, writer_for, response, receive)
        result = await self._call(sid, self.engine.chat(sid, request), response, False)
        await self._reply(
            response,
            result,
            body,
            logprobs=bool(body.logprobs),
            chunks=None,
            whole=protocol.chat_completion,
        )

    async def _respond(self, sid: str, scope: Scope, receive: Receive, response: _Response) -> None:
        body = responses.decode_responses(await self._body(scope, receive))
        messages, tools, choice, params = responses.to_responses_parts(body, self.default_params)
        request = EngineChatRequest(
            messages=messages,
            tools=tools,
            params=params,
            tool_choice="auto" if choice.mode == "none" else choice.mode,
            tool_name=choice.name,
        )
        if body.stream:

            def writer_for(trace_id: str) -> responses.ResponsesStream:
                return responses.ResponsesStream(
                    trace_id=trace_id,
                    model=self.model,
                    body=body,
                    choice=choice,
                    tools=tools,
                    parse=functools.partial(self.engine.renderer.parse_response, tools=tools),
                )

            return await self._stream_chat(sid, request, writer_for, response, receive)
        result = await self._call(sid, self.engine.chat(sid, request), response, False)
        payload = responses.response_body(
            result, model=self.model, body=body, choice=choice, tools=tools
        )
        await self._finish(response, payload, stream=False)

    async def _complete(
        self, sid: str, scope: Scope, receive: Receive, response: _Response
    ) -> None:
        body = protocol.decode_completion(await self._body(scope, receive))
        prompt, params = protocol.to_completion_parts(body, self.default_params)
        stream = bool(body.stream)
        result = await self._call(sid, self.engine.complete(sid, prompt, params), response, stream)
        await self._reply(
            response,
            result,
            body,
            logprobs=body.logprobs is not None,
            chunks=protocol.completion_chunks,
            whole=protocol.completion_response,
        )

    async def _reply(
        self,
        response: _Response,
        result: Any,
        body: Any,
        *,
        logprobs: bool,
        chunks: Callable[..., Any] | None,
        whole: Callable[..., Any],
    ) -> None:
        """Send ``result`` as server-sent ``chunks`` when the request streams, else ``whole``."""
        options = {
            "model": self.model,
            "logprobs": logprobs,
            "decode": self._decode_one,
            "token_ids": bool(body.return_token_ids),
        }
        if body.stream and chunks is not None:
            usage = body.stream_options is not None and body.stream_options.include_usage
            payload = chunks(result, include_usage=usage, **options)
        else:
            payload = whole(result, **options)
        await self._finish(response, payload, stream=bool(body.stream))

    async def _call(self, sid: str, call: Awaitable[Any], response: _Response, stream: bool) -> Any:
        """Run one engine call under the session's routing key, with heartbeats and the
        timeout; engine and upstream errors become :class:`HTTPError`."""
        response.stream = stream
        heartbeat = _Heartbeat(response, self.heartbeat_interval_s) if stream else None
        token = routing_key.set(sid)
        try:
            async with asyncio.timeout(self.request_timeout_s):
                return await call
        except Exception as exc:
            mapped = self._mapped(sid, exc)
            if mapped is None:
                raise
            raise mapped from None
        finally:
            routing_key.reset(token)
            if heartbeat is not None:
                await heartbeat.stop()

    @contextlib.contextmanager
    def _mapped_errors(self, sid: str) -> Iterator[None]:
        try:
            yield
        except Exception as exc:
            mapped = self._mapped(sid, exc)
            if mapped is None:
                raise
            raise mapped from None

    def _mapped(self, sid: str, exc: Exception) -> HTTPError | None:
        """The HTTP error an engine or upstream error becomes; ``None`` for any other."""
        if isinstance(exc, TimeoutError):
            return HTTPError(
                504,
                f"the model call of session {sid!r} did not finish within"
                f" {self.request_timeout_s}s; retry, or raise the gateway's request timeout",
                type="timeout_error",
                code="timeout",
            )
        if isinstance(exc, PromptTooLongError):
            return HTTPError(400, str(exc), param="messages", code="prompt_too_long")
        if isinstance(exc, InvalidChatRequestError):
            return HTTPError(400, str(exc), code="invalid_request")
        if isinstance(exc, UnknownSessionError):
            return HTTPError(404, str(exc), code="unknown_session")
        if isinstance(exc, GatewayError):
            return HTTPError(400, str(exc), code="invalid_request")
        if isinstance(exc, ValueError):
            # A renderer refusing the conversation (a template without tools, say).
            return HTTPError(400, f"the request cannot be rendered: {exc}", code="unrenderable")
        if isinstance(exc, UpstreamRejectedError):
            status = 400 if exc.status in (400, 413, 422) else 502
            return HTTPError(
                status,
                f"the model server rejected the request: {exc.detail}",
                type="upstream_error",
                code="upstream_rejected",
            )
        if isinstance(exc, UpstreamTimeoutError):
            return HTTPError(504, str(exc), type="timeout_error", code="upstream_timeout")
        if isinstance(exc, UpstreamUnavailableError):
            return HTTPError(
                503,
                str(exc),
                type="upstream_error",
                code="upstream_unavailable",
                headers=[(b"retry-after", b"5")],
            )
        if isinstance(exc, UpstreamError):
            return HTTPError(502, str(exc), type="upstream_error", code="upstream_error")
        return None

    async def _stream_chat(
        self,
        sid: str,
        request: EngineChatRequest,
        writer_for: Callable[[str], Any],
        response: _Response,
        receive: Receive,
    ) -> None:
        """Stream a chat call as the sampler produces it, through the writer ``writer_for``
        makes from the trace id (:class:`protocol.ChatStream` or
        :class:`responses.ResponsesStream`). The response starts with the first sampled
        tokens, so errors before that get their own status."""
        response.stream = True
        heartbeat = _Heartbeat(response, self.heartbeat_interval_s)
        token = routing_key.set(sid)
        writer: Any = None
        gone = asyncio.Event()
        watcher = asyncio.get_running_loop().create_task(_watch_disconnect(receive, gone))
        try:
            with self._mapped_errors(sid):
                async with asyncio.timeout(self.request_timeout_s):
                    items = self.engine.chat_stream(sid, request)
                    async with contextlib.aclosing(items):
                        async for item in items:
                            if isinstance(item, str):
                                writer = writer_for(item)
                                continue
                            assert writer is not None
                            if isinstance(item, tuple):
                                payload = writer.piece(*item)
                            else:
                                payload = writer.finish(item)
                            if not payload:
                                continue
                            await heartbeat.stop()
                            if not response.started:
                                await response.start(200, list(_SSE_HEADERS))
                            await response.chunk(payload)
                            if gone.is_set():
                                # Closing the iterator abandons the call: nothing is recorded.
                                log.info("session %s: the client left mid-stream", sid)
                                return
            await response.chunk(b"", False)
        finally:
            watcher.cancel()
            routing_key.reset(token)
            await heartbeat.stop()

    async def _finish(self, response: _Response, payload: bytes, *, stream: bool) -> None:
        if response.started:
            await response.chunk(payload, False)
        elif stream:
            await response.start(200, list(_SSE_HEADERS))
            await response.chunk(payload, False)
        else:
            await response.full(200, payload)

    # ---------------------------------------------------------------- reads

    def _models(self) -> bytes:
        return protocol.encode(
            {
                "object": "list",
                "data": [
                    {"id": self.model, "object": "model", "created": 0, "owned_by": "rllm-core"}
                ],
            }
        )

    def _mint(self, sid: str, scope: Scope) -> bytes:
        self.engine.open_session(sid)
        token = self.session_tokens.mint(sid) if self.session_tokens is not None else None
        base_url = f"{_origin(scope)}/sessions/{sid}/v1"
        return protocol.encode({"session_id": sid, "token": token, "base_url": base_url})

    def _configure(self, sid: str, body: bytes) -> bytes:
        try:
            given = msgspec.json.decode(body, type=_Configure).enforced
            unknown = sorted(set(given or ()) - set(SamplingParams.__struct_fields__))
            if unknown:
                raise msgspec.ValidationError(f"unknown field(s) {unknown} in `$.enforced`")
            enforced = msgspec.convert(given, SamplingParams) if given is not None else None
        except msgspec.DecodeError as exc:
            raise HTTPError(
                400,
                f'the body must be {{"enforced": {{sampling params}} | null}}: {exc}',
                param="enforced",
                code="invalid_value",
            ) from None
        self.engine.configure_session(sid, enforced=enforced)
        return protocol.encode({"session_id": sid, "object": "session", "enforced": enforced})

    def _release(self, sid: str, scope: Scope) -> bytes:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        take = query.get("take", [""])[-1]
        if take not in ("", "traces"):
            raise HTTPError(
                400,
                f"take={take!r} is unknown; use take=traces or leave it out",
                param="take",
                code="invalid_value",
            )
        answer: dict[str, Any] = {
            "session_id": sid,
            "object": "session",
            "released": True,
            "denied": self.engine.denied(sid),
        }
        self.engine.release_session(sid)
        if take:
            store = self.engine.trace_store
            answer["records"] = store.chain(sid)
            store.delete_session(sid)
        return protocol.encode(answer)

    def _stats(self, sid: str) -> bytes:
        try:
            stats = self.engine.session_stats(sid)
        except UnknownSessionError as exc:
            raise HTTPError(404, str(exc), param="session_id", code="unknown_session") from None
        return protocol.encode(stats)

    def _delete(self, sid: str) -> bytes:
        try:
            self.engine.delete_session(sid)
        except UnknownSessionError as exc:
            raise HTTPError(404, str(exc), param="session_id", code="unknown_session") from None
        return protocol.encode({"id": sid, "object": "session", "deleted": True})

    def _traces(self, sid: str, scope: Scope) -> bytes:
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        fmt = query.get("format", ["full"])[-1]
        if fmt not in ("full", "chain"):
            raise HTTPError(
                400,
                f"format={fmt!r} is unknown; use format=full (the default) or format=chain",
                param="format",
                code="invalid_value",
            )
        store = self.engine.trace_store
        if fmt == "chain":
            records = store.chain(sid)
            if not records:
                self._stats(sid)
            return protocol.encode({"session_id": sid, "format": "chain", "records": records})
        traces = store.session(sid)
        if not traces:
            self._stats(sid)
        rows = []
        for trace in traces:
            row = msgspec.structs.asdict(trace.record)
            del row["prompt_delta_token_ids"]
            row["prompt_token_ids"] = trace.prompt_token_ids
            row["chain_complete"] = trace.chain_complete
            rows.append(row)
        return protocol.encode({"session_id": sid, "format": "full", "traces": rows})

    def _announce(self, body: bytes) -> dict[str, Any]:
        """Set the sampler's ``weight_version`` (what results report until the model server
        reports a newer one)."""
        try:
            announced = msgspec.json.decode(body)
            version = announced.get("version")
        except (msgspec.DecodeError, AttributeError):
            announced, version = {}, None
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise HTTPError(
                400,
                'the body must be {"version": N} with N a weight version (an integer >= 0)',
                param="version",
                code="invalid_value",
            )
        sampler = self.engine.sampler
        if "model" in announced:
            model = announced["model"]
            if model is not None and not isinstance(model, str):
                raise HTTPError(
                    400,
                    '"model" must be the model name to send upstream (a string) or null',
                    param="model",
                    code="invalid_value",
                )
            if not isinstance(sampler, SharedPool):
                raise HTTPError(
                    409,
                    f"this gateway's sampler ({type(sampler).__name__}) cannot be told which"
                    " model to send (it is not a rllm_core.ports.SharedPool); announce the"
                    " version alone",
                    code="no_model_switch",
                )
            sampler.use(model, version)
            return {"object": "weight_version", "version": version, "model": model}
        if not hasattr(sampler, "weight_version"):
            raise HTTPError(
                409,
                f"this gateway's sampler ({type(sampler).__name__}) keeps no weight version"
                " to announce; its results carry their own",
                code="no_weight_version",
            )
        sampler.weight_version = version  # type: ignore[attr-defined]
        return {"object": "weight_version", "version": version}

    def _health(self) -> dict[str, Any]:
        snapshot = self.metrics.snapshot()
        health: dict[str, Any] = {
            "status": "ok",
            "in_flight": snapshot["in_flight"],
            "requests_served": snapshot["requests_served"],
            "event_loop_lag": snapshot["event_loop_lag"],
        }
        if self.upstreams is not None:
            workers = self.upstreams.status()
            healthy = sum(w.healthy for w in workers)
            health["upstreams"] = {"healthy": healthy, "total": len(workers)}
            if not healthy:
                health["status"] = "degraded"
        return health

    def _metrics(self) -> dict[str, Any]:
        snapshot = self.metrics.snapshot()
        snapshot["sessions"] = len(self.engine.session_ids())
        snapshot["resets"] = dict(sorted(self.engine.resets.items()))
        snapshot["weight_version"] = getattr(self.engine.sampler, "weight_version", None)
        if self.upstreams is not None:
            snapshot["upstreams"] = self.upstreams.status()
        return snapshot


class _Configure(msgspec.Struct, forbid_unknown_fields=True):
    enforced: dict[str, Any] | None


async def _watch_disconnect(receive: Receive, gone: asyncio.Event) -> None:
    """Set ``gone`` when the client disconnects (the request body was already read)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    gone.set()


def _origin(scope: Scope) -> str:
    """``scheme://host[:port]`` as the client addressed this server (its ``Host`` header),
    else the bound address."""
    scheme = scope.get("scheme", "http")
    for name, value in scope["headers"]:
        if name == b"host":
            return f"{scheme}://{value.decode('latin-1')}"
    host, port = scope.get("server") or ("127.0.0.1", 80)
    host = f"[{host}]" if ":" in host else host
    return f"{scheme}://{host}:{port}"


def _allow(method: str, allowed: str | tuple[str, ...], path: str) -> None:
    names = (allowed,) if isinstance(allowed, str) else allowed
    if method in names or (method == "HEAD" and "GET" in names):
        return
    raise HTTPError(
        405,
        f"{path} does not accept {method}; use {' or '.join(names)}",
        code="method_not_allowed",
        headers=[(b"allow", ", ".join(names).encode())],
    )


def _shown(path: str) -> str:
    """A request path as errors and logs quote it: at most 200 characters."""
    return path if len(path) <= 200 else path[:200] + "..."


def _too_large(size: int, limit: int) -> HTTPError:
    return HTTPError(
        413,
        f"the request body has {size} bytes, over the gateway's limit of {limit};"
        " shorten the conversation or restart the gateway with a larger --max-body-bytes",
        code="body_too_large",
    )
