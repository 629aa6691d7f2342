"""A run's gateway over several processes: ``[gateway].workers = N``.

:func:`open_gateway_workers` starts N gateway worker processes (``rllm-core gateway worker``,
:func:`serve_worker`) on free ports of ``[gateway].host`` and serves a
:class:`~rllm_core.gateway.shards.ShardFront` over them on ``[gateway].host`` and
``[gateway].port`` (health, gathered metrics, relayed session routes). Each worker builds the
plan's renderer and a client of the plan's ``[sampler]`` (a
:class:`~rllm_core.ports.SharedPool`: :meth:`~rllm_core.ports.SharedPool.client_options`)
and records into a memory trace store of its own. The run talks to them through
:class:`WorkerSessions`, which a :class:`~rllm_core.rollout.runner.RolloutRunner` takes as its
gateway and, through :attr:`WorkerSessions.traces`, as its trace store:

- every session belongs to the worker its id hashes to (:class:`~rllm_core.gateway.shards.
  ShardRing`), and the harness gets that worker's URL and the session's token, so model calls
  cost the run's process nothing;
- ``configure_session``, ``endpoint``, ``denied`` and ``release_session`` are admin calls to
  the owning worker (``POST /sessions/{id}/configure``, ``POST /sessions/{id}/token``,
  ``GET /sessions/{id}``, ``POST /sessions/{id}/release?take=traces``). They block the run's
  event loop for one loopback round trip, as the port is synchronous; the workers are other
  processes, so nothing waits on the loop meanwhile;
- a session's traces come home to the run's ``[trace_store]`` when the runner reads them and
  when it is released (the release hands them over and deletes them in the worker), so the
  run's store holds every trace as with one gateway, and a worker holds only open sessions;
- after every policy update (:attr:`~rllm_core.rollout.policy_sync.PolicySync.followers`)
  every worker is told the model name and version to send (``POST /weight_version``).

A worker that stops answering fails the call with :class:`GatewayWorkerError`, naming the
worker, its address and its exit status; its sessions are not moved to another worker (their
token accumulators live in it). An admin call gets ``ADMIN_TIMEOUT_S`` to be answered; a
worker that let one time out (alive but hung: stopped, or its loop blocked) fails every later
call at once, so that it stalls the run's loop once, not once per session. Each worker exits
when the run's process is gone, however it went. At the end the run logs how many model calls
each worker served.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import httpx
import msgspec

from rllm_core.gateway.serving import AsgiServer
from rllm_core.gateway.shards import ShardFront, ShardRing, WorkerProcesses
from rllm_core.ports import SharedPool, TraceStore
from rllm_core.types import ExportedWeights, LLMEndpoint, SamplingParams, Trace, TraceRecord

__all__ = [
    "ADMIN_TIMEOUT_S",
    "GATEWAY_CALLS_PREFIX",
    "SPEC_ENV",
    "GatewayWorkerError",
    "WorkerSessions",
    "WorkerSpec",
    "build_worker",
    "follower",
    "open_gateway_workers",
]

log = logging.getLogger("rllm_core.gateway")

SPEC_ENV = "RLLM_GATEWAY_WORKER"
"""The environment variable a worker reads its :class:`WorkerSpec` from (JSON)."""
GATEWAY_CALLS_PREFIX = "gateway/calls/"
"""``gateway/calls/<i>``: the model calls gateway worker ``i`` served since the previous
batch's line (a session's calls all go to one worker, so the figures show how evenly the
sessions spread)."""
TOKEN_ENV = "RLLM_GATEWAY_TOKEN"
"""The admin token of every worker (never on a command line)."""


class GatewayWorkerError(RuntimeError):
    """A gateway worker of the run did not answer, or refused an admin call."""


class Component(msgspec.Struct, frozen=True):
    """An installed component by ``name`` and its ``options``."""

    name: str
    options: dict[str, Any]


class WorkerSpec(msgspec.Struct, frozen=True, kw_only=True):
    """What one worker serves: the plan's ``renderer``, a client of its ``sampler``, the token
    mode, the prompt limit, the served ``model`` name, the ``host`` to bind, and ``parent``,
    the run's process id (the worker exits once it is gone)."""

    renderer: Component
    sampler: Component
    cumulative: bool
    max_prompt_tokens: int | None
    model: str
    host: str
    parent: int


class _Released(msgspec.Struct):
    denied: int
    records: list[TraceRecord] = []


class _Chain(msgspec.Struct):
    records: list[TraceRecord]


def _build(kind: str, component: Component) -> Any:
    from rllm_core.plugins.manager import get_plugin_manager

    spec = get_plugin_manager().get(kind, component.name)
    return spec.factory(spec.validate_config(component.options))


def build_worker(spec: WorkerSpec, token: str) -> Any:
    """The :class:`~rllm_core.gateway.server.Gateway` of one worker (not yet serving), on a
    free port of ``spec.host``, with ``token`` as its admin token."""
    from rllm_core.gateway.server import Gateway

    return Gateway(
        renderer=_build("renderer", spec.renderer),
        sampler=_build("sampler", spec.sampler),
        trace_store=_build("trace_store", Component("memory", {})),
        cumulative=spec.cumulative,
        model=spec.model,
        max_prompt_tokens=spec.max_prompt_tokens,
        host=spec.host,
        port=0,
        token=token,
    )


async def serve_worker(environ: Mapping[str, str]) -> None:
    """Serve the worker ``environ`` describes (:data:`SPEC_ENV`, :data:`TOKEN_ENV`) until it is
    told to stop or the run's process is gone; prints ``... gateway worker on URL`` once it
    serves."""
    spec = msgspec.json.decode(environ[SPEC_ENV], type=WorkerSpec)
    try:
        server = build_worker(spec, environ[TOKEN_ENV])
        url = await server.astart()
    except Exception as exc:
        # One line for the run's terminal; the run names the worker and its exit status.
        print(f"gateway worker: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    print(f"rllm-core gateway worker on {url}", flush=True)
    try:
        while os.getppid() == spec.parent:
            await asyncio.sleep(0.5)
        log.warning("gateway worker %s: the run's process is gone; stopping", url)
    finally:
        await server.astop()


ADMIN_TIMEOUT_S = 10.0
"""How long an admin call to a worker waits for its answer. The calls are small and local
(a release carries one session's traces); a worker that takes longer is hung."""


class WorkerSessions:
    """The run's sessions on gateway workers at ``urls`` (see the module docstring): a
    :class:`~rllm_core.rollout.gateway.SessionGateway`, with :attr:`traces` the
    :class:`~rllm_core.ports.TraceStore` its runner reads, over the run's ``store``.

    ``processes`` (when given) names a worker that stopped answering by its exit status.
    ``timeout_s`` bounds each admin call; a worker that let one time out fails every later
    call at once.
    """

    def __init__(
        self,
        urls: list[str],
        *,
        token: str,
        store: TraceStore,
        model: str = "policy",
        processes: WorkerProcesses | None = None,
        timeout_s: float = ADMIN_TIMEOUT_S,
    ) -> None:
        self.urls = urls
        self.model = model
        self.store = store
        self.ring = ShardRing(len(urls))
        self.processes = processes
        headers = {"authorization": f"Bearer {token}"}
        self._clients = [
            httpx.Client(base_url=url, headers=headers, timeout=timeout_s) for url in urls
        ]
        self._endpoints: dict[str, LLMEndpoint] = {}
        self._open: set[str] = set()
        self._kept: dict[str, dict[str, TraceRecord]] = {}
        self._lock = threading.Lock()
        self._taken = [0] * len(urls)
        self._hung: dict[int, str] = {}
        self.timeout_s = timeout_s
        self.traces = WorkerTraces(self)

    # ---------------------------------------------------------------- calls

    def _describe(self, index: int) -> str:
        if self.processes is not None:
            return self.processes.describe(index)
        return f"gateway worker {index} ({self.urls[index]})"

    def _call(self, index: int, method: str, path: str, **kwargs: Any) -> httpx.Response:
        hung = self._hung.get(index)
        if hung is not None:
            raise GatewayWorkerError(
                f"{self._describe(index)} stopped answering ({hung} got no answer within"
                f" {self.timeout_s:g}s), so {method} {path} was not sent; its process may be"
                " stopped or its loop blocked"
            )
        try:
            return self._clients[index].request(method, path, **kwargs)
        except httpx.TimeoutException:
            self._hung[index] = f"{method} {path}"
            raise GatewayWorkerError(
                f"{self._describe(index)} did not answer {method} {path} within"
                f" {self.timeout_s:g}s (alive but hung: its process may be stopped or its loop"
                " blocked); its later calls fail at once"
            ) from None
        except httpx.HTTPError as exc:
            raise GatewayWorkerError(
                f"{self._describe(index)} did not answer {method} {path}: {exc}"
            ) from None

    def _answer(self, index: int, method: str, path: str, **kwargs: Any) -> bytes | None:
        """The answer's body, ``None`` for a 404; any other error raises."""
        response = self._call(index, method, path, **kwargs)
        if response.status_code == 404:
            return None
        if response.status_code >= 400:
            raise GatewayWorkerError(
                f"{self._describe(index)} refused {method} {path} with {response.status_code}:"
                f" {response.text[:500]}"
            )
        return response.content

    def _ok(self, index: int, method: str, path: str, **kwargs: Any) -> bytes:
        """The answer's body; any error, a 404 included, raises."""
        body = self._answer(index, method, path, **kwargs)
        if body is None:
            raise GatewayWorkerError(f"{self._describe(index)} has no {method} {path} (404)")
        return body

    def _owner(self, session_id: str) -> int:
        return self.ring.owner(session_id)

    # ---------------------------------------------------------------- SessionGateway

    def configure_session(self, session_id: str, *, enforced: SamplingParams | None) -> None:
        self._ok(
            self._owner(session_id),
            "POST",
            f"/sessions/{session_id}/configure",
            content=msgspec.json.encode({"enforced": enforced}),
        )
        self._open.add(session_id)

    def endpoint(self, session_id: str) -> LLMEndpoint:
        known = self._endpoints.get(session_id)
        if known is None:
            answer = msgspec.json.decode(
                self._ok(self._owner(session_id), "POST", f"/sessions/{session_id}/token")
            )
            known = LLMEndpoint(
                base_url=answer["base_url"], api_key=answer["token"] or "none", model=self.model
            )
            self._endpoints[session_id] = known
            self._open.add(session_id)
        return known

    def denied(self, session_id: str) -> int:
        body = self._answer(self._owner(session_id), "GET", f"/sessions/{session_id}")
        return int(msgspec.json.decode(body).get("denied", 0)) if body is not None else 0

    def release_session(self, session_id: str) -> None:
        """Release the session on its worker and bring the traces it still held home."""
        released = msgspec.json.decode(
            self._ok(
                self._owner(session_id), "POST", f"/sessions/{session_id}/release?take=traces"
            ),
            type=_Released,
        )
        self._keep(session_id, released.records)
        self._endpoints.pop(session_id, None)
        self._open.discard(session_id)
        self._kept.pop(session_id, None)

    # ---------------------------------------------------------------- traces

    def fetch(self, session_id: str) -> None:
        """Bring the records an open session's worker holds into the run's store."""
        if session_id not in self._open:
            return
        path = f"/sessions/{session_id}/traces?format=chain"
        body = self._answer(self._owner(session_id), "GET", path)
        if body is not None:
            self._keep(session_id, msgspec.json.decode(body, type=_Chain).records)

    def _keep(self, session_id: str, records: list[TraceRecord]) -> None:
        with self._lock:
            kept = self._kept.setdefault(session_id, {})
            for record in records:
                if kept.get(record.trace_id) != record:
                    self.store.append(record)
                    kept[record.trace_id] = record

    # ---------------------------------------------------------------- policy and figures

    def announce(self, model: str | None, version: int) -> None:
        """Tell every worker the model name and weight version to send from now on."""
        body = msgspec.json.encode({"version": version, "model": model})
        for index in range(len(self.urls)):
            self._ok(index, "POST", "/weight_version", content=body)

    def take_calls(self) -> dict[str, float]:
        """``gateway/calls/<i>``: the model calls worker ``i`` served since the last call (a
        worker that does not answer is left out)."""
        figures: dict[str, float] = {}
        for index, served in enumerate(self.served()):
            if served is not None:
                figures[f"{GATEWAY_CALLS_PREFIX}{index}"] = float(served - self._taken[index])
                self._taken[index] = served
        return figures

    def served(self) -> list[int | None]:
        """The model calls each worker took so far (``None``: it did not answer)."""
        counts: list[int | None] = []
        for index in range(len(self.urls)):
            try:
                body = self._ok(index, "GET", "/metrics")
                counts.append(int(msgspec.json.decode(body)["model_calls"]))
            except (GatewayWorkerError, msgspec.DecodeError, ValueError, KeyError):
                counts.append(None)
        return counts

    def close(self) -> None:
        for client in self._clients:
            client.close()


class WorkerTraces:
    """The run's trace store as its runner reads it while sessions live on gateway workers:
    reading an open session first brings its worker's records home; everything else is the
    run's store."""

    def __init__(self, sessions: WorkerSessions) -> None:
        self._sessions = sessions
        self._store = sessions.store

    def append(self, record: TraceRecord) -> None:
        self._store.append(record)

    def session(self, session_id: str) -> list[Trace]:
        self._sessions.fetch(session_id)
        return self._store.session(session_id)

    def chain(self, session_id: str) -> list[TraceRecord]:
        self._sessions.fetch(session_id)
        return self._store.chain(session_id)

    def sessions(self) -> list[str]:
        return self._store.sessions()

    def delete_session(self, session_id: str) -> None:
        self._store.delete_session(session_id)

    def close(self) -> None:
        self._store.close()


@asynccontextmanager
async def open_gateway_workers(
    count: int,
    *,
    renderer: Component,
    sampler: SharedPool,
    sampler_name: str,
    store: TraceStore,
    cumulative: bool = True,
    max_prompt_tokens: int | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    model: str = "policy",
    admin_timeout_s: float = ADMIN_TIMEOUT_S,
) -> AsyncIterator[tuple[WorkerSessions, str]]:
    """Start ``count`` workers and the front on ``host``:``port`` (a free loopback port by
    default), in ``cumulative`` token mode unless told otherwise; yields the run's
    :class:`WorkerSessions` (its admin calls bounded by ``admin_timeout_s``) and the front's
    URL. Everything stops when the block exits.
    A bind error of the front is the ``OSError`` itself; a worker that fails to start raises
    :class:`GatewayWorkerError` with its exit status."""
    from rllm_core.gateway.server import new_token

    token = new_token()
    spec = WorkerSpec(
        renderer=renderer,
        sampler=Component(sampler_name, sampler.client_options()),
        cumulative=cumulative,
        max_prompt_tokens=max_prompt_tokens,
        model=model,
        host=host,
        parent=os.getpid(),
    )
    env = {SPEC_ENV: msgspec.json.encode(spec, enc_hook=str).decode(), TOKEN_ENV: token}
    argv = [sys.executable, "-m", "rllm_core", "gateway", "worker"]
    processes = WorkerProcesses(lambda index: argv, count, env=env)
    try:
        urls = await asyncio.to_thread(processes.start)
    except RuntimeError as exc:
        raise GatewayWorkerError(f"[gateway] workers = {count}: {exc}") from None
    sessions = WorkerSessions(
        urls,
        token=token,
        store=store,
        model=model,
        processes=processes,
        timeout_s=admin_timeout_s,
    )
    front = ShardFront(urls, processes=processes)
    server = AsgiServer(
        front, host=host, port=port, on_close=front.aclose, name="rllm-gateway-front"
    )
    try:
        url = await server.astart()
        log.info("gateway: %d workers (%s) behind %s", count, ", ".join(urls), url)
        sessions.announce(*sampler.served_policy())
        yield sessions, url
    finally:
        with contextlib.suppress(Exception):
            for index, served in enumerate(sessions.served()):
                log.info("gateway worker %d (%s) served %s model calls", index, urls[index], served)
        sessions.close()
        await server.astop()
        await asyncio.to_thread(processes.stop)


def follower(
    sessions: WorkerSessions, sampler: SharedPool
) -> Callable[[ExportedWeights], Awaitable[None]]:
    """A :attr:`PolicySync.followers` entry telling ``sessions``' workers what ``sampler``
    serves after an update."""

    async def follow(exported: ExportedWeights) -> None:
        sessions.announce(*sampler.served_policy())

    return follow
