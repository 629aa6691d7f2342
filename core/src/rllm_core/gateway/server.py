"""Running the gateway: uvicorn in-process, in a background thread or as a task.

:class:`Gateway` owns one :class:`~rllm_core.gateway.engine.GatewayEngine` (given, or built from
a renderer, a sampler and a trace store) and serves it over HTTP. ``start()`` runs uvicorn in a
background thread with its own event loop and returns the base URL once the server accepts
connections; ``await astart()`` runs it as a task on the caller's loop instead (use that when
the sampler is bound to the caller's loop, as an in-process trainer's is). Port 0 picks a free
port.

Auth: a bearer token is required unless the gateway is built with ``auth=False``, which is
refused on any host that is not a loopback address. ``token`` is the admin token, which reaches
every route; without one a random one is generated for the run. An agent gets a session token
instead (:meth:`Gateway.session_token`, or ``POST /sessions/{id}/token`` with the admin token),
which reaches only that session's model routes and only until the session is released; see
:mod:`rllm_core.gateway.app`.

Example::

    with Gateway(renderer=renderer, sampler=sampler, trace_store=store) as gateway:
        endpoint = gateway.endpoint("s-1")  # opens the session; api_key is its session token
        client = openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key)
        client.chat.completions.create(model="policy", messages=[...])
        gateway.release_session("s-1")  # the session token stops working
"""

from __future__ import annotations

import logging
import secrets
import sys
from collections.abc import Callable
from typing import TextIO

from rllm_core.addresses import is_loopback
from rllm_core.gateway.app import GatewayApp
from rllm_core.gateway.engine import GatewayEngine
from rllm_core.gateway.serving import AsgiServer
from rllm_core.ports import Renderer, Sampler, TraceStore, WorkerPool
from rllm_core.types import LLMEndpoint, SamplingParams

__all__ = ["Gateway", "is_loopback", "log_events", "new_token"]

log = logging.getLogger("rllm_core.gateway")


class _EventsHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """The handler :func:`log_events` adds (told apart from any other on the logger)."""


def log_events(level: str, stream: TextIO | None = None) -> logging.Handler:
    """Write the ``rllm_core`` loggers' records at ``level`` and above to ``stream`` (stderr),
    one timestamped line per record, as ``rllm-core gateway serve`` does; returns the handler.

    The ``rllm_core`` logger then stops propagating, so a handler on the root logger (the
    command line sets one up) does not write each record a second time. Calling it again
    replaces the handler it added before.
    """
    package = logging.getLogger("rllm_core")
    for old in list(package.handlers):
        if isinstance(old, _EventsHandler):
            package.removeHandler(old)
    handler = _EventsHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    package.addHandler(handler)
    package.setLevel(level.upper())
    package.propagate = False
    return handler


def new_token() -> str:
    """A fresh random bearer token (256 bits)."""
    return secrets.token_urlsafe(32)


class Gateway:
    """The session gateway, served by uvicorn in this process.

    Pass ``engine`` or the three components (``renderer``, ``sampler``, ``trace_store``) with
    the engine options (``cumulative``, ``model``, ``max_prompt_tokens``). ``upstreams`` is the
    sampler when it is a :class:`~rllm_core.ports.WorkerPool` (it is then reported by
    ``/health`` and closed on stop). The HTTP options are those of
    :class:`~rllm_core.gateway.app.GatewayApp`; ``token`` (also the attribute) is the admin
    token, which an agent must never see: give it :meth:`endpoint` or :meth:`session_token`.
    """

    def __init__(
        self,
        engine: GatewayEngine | None = None,
        *,
        renderer: Renderer | None = None,
        sampler: Sampler | None = None,
        trace_store: TraceStore | None = None,
        cumulative: bool = True,
        model: str = "policy",
        max_prompt_tokens: int | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        auth: bool = True,
        max_body_bytes: int = 8 * 1024 * 1024,
        heartbeat_interval_s: float = 10.0,
        request_timeout_s: float = 1800.0,
        default_params: SamplingParams | None = None,
        log_level: str = "warning",
        stop_timeout_s: float = 10.0,
    ) -> None:
        if engine is None:
            missing = [
                name
                for name, value in (
                    ("renderer", renderer),
                    ("sampler", sampler),
                    ("trace_store", trace_store),
                )
                if value is None
            ]
            if missing:
                raise ValueError(
                    f"Gateway needs an engine or a renderer, a sampler and a trace store;"
                    f" missing: {', '.join(missing)}"
                )
            engine = GatewayEngine(
                renderer=renderer,  # type: ignore[arg-type]
                sampler=sampler,  # type: ignore[arg-type]
                trace_store=trace_store,  # type: ignore[arg-type]
                cumulative=cumulative,
                model=model,
                max_prompt_tokens=max_prompt_tokens,
            )
        if not auth:
            if not is_loopback(host):
                raise ValueError(
                    f"refusing to serve without auth on {host!r}, which is reachable from other"
                    " machines; bind to 127.0.0.1 or keep auth on (a token is generated)"
                )
            if token is not None:
                raise ValueError("auth=False and a token contradict each other; pass one")
        elif token is None:
            token = new_token()
        elif not token.strip():
            raise ValueError("the bearer token is empty; pass a non-empty token or none")
        self.engine = engine
        self.host = host
        self.token = token
        self.upstreams = engine.sampler if isinstance(engine.sampler, WorkerPool) else None
        self.app = GatewayApp(
            engine,
            token=token,
            max_body_bytes=max_body_bytes,
            heartbeat_interval_s=heartbeat_interval_s,
            request_timeout_s=request_timeout_s,
            default_params=default_params,
            upstreams=self.upstreams,
        )
        self._server = AsgiServer(
            self.app,
            host=host,
            port=port,
            log_level=log_level,
            stop_timeout_s=stop_timeout_s,
            on_close=self.upstreams.aclose if self.upstreams is not None else None,
            name="rllm-gateway",
        )

    # ---------------------------------------------------------------- addresses

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the running server."""
        return self._server.base_url

    @property
    def port(self) -> int:
        """The bound port (known once started)."""
        return self._server.port

    def session_url(self, session_id: str) -> str:
        """The OpenAI ``base_url`` for one session: ``{base_url}/sessions/{id}/v1``."""
        return f"{self.base_url}/sessions/{session_id}/v1"

    def session_token(self, session_id: str) -> str | None:
        """Open the session and return its session token: the bearer token that reaches only
        ``/sessions/{session_id}/v1/...`` (and ``GET /v1/models``), until
        :meth:`release_session`. ``None`` when the gateway serves without auth. The same id
        always gives the same token (it is derived from the admin token, never stored).
        Raises :class:`ValueError` for an id the gateway does not accept."""
        if self.app.session_tokens is None:
            self.engine.open_session(session_id)
            return None
        token = self.app.session_tokens.mint(session_id)
        self.engine.open_session(session_id)
        return token

    def endpoint(self, session_id: str) -> LLMEndpoint:
        """What a harness needs to talk to one session; opens it. ``api_key`` is the session's
        token (see :meth:`session_token`), ``"none"`` without auth."""
        return LLMEndpoint(
            base_url=self.session_url(session_id),
            api_key=self.session_token(session_id) or "none",
            model=self.engine.model,
        )

    def configure_session(self, session_id: str, *, enforced: SamplingParams | None) -> None:
        """Enforce (or, with ``None``, stop enforcing) sampling parameters for a session; opens
        it."""
        self.engine.configure_session(session_id, enforced=enforced)

    def denied(self, session_id: str) -> int:
        """Requests the gateway refused to ``session_id``'s token (another session's routes,
        an admin route) while the session was open; 0 once it is released."""
        return self.engine.denied(session_id)

    def release_session(self, session_id: str) -> None:
        """Forget a finished session's live state; its traces stay in the trace store and its
        session token is refused from now on (a later :meth:`session_token` or
        :meth:`configure_session` opens it again). Unknown ids are ignored."""
        self.engine.release_session(session_id)

    # ---------------------------------------------------------------- serving

    def start(self) -> str:
        """Serve in a background thread; returns the base URL once connections are accepted."""
        url = self._server.start()
        log.info("gateway serving on %s", url)
        return url

    def stop(self) -> None:
        """Stop serving (in-flight requests get ``stop_timeout_s`` to finish). Idempotent."""
        self._server.stop()

    async def astart(self) -> str:
        """Serve as a task on the running event loop; returns the base URL."""
        return await self._server.astart()

    async def serve(self, ready: Callable[[str], None] | None = None) -> None:
        """Serve on the running loop until the server is told to exit (SIGINT or SIGTERM when
        this is the main thread); ``ready`` is called with the base URL once serving."""
        url = await self._server.astart()
        if ready is not None:
            ready(url)
        await self._server.wait()

    async def astop(self) -> None:
        """Stop a gateway started with :meth:`astart`. Idempotent."""
        await self._server.astop()

    def __enter__(self) -> Gateway:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> Gateway:
        await self.astart()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.astop()
