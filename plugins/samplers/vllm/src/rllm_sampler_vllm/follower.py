"""The vLLM sampler of a training run: :class:`VllmSampler`, an
:class:`~rllm_sampler_vllm.pool.HttpWorkerPool` that also keeps its servers on the trainer's
policy (the :class:`~rllm_core.ports.PolicyFollower` port).

After every optimizer step the trainer writes weight version N to ``<weights_dir>/v<N>``
(:meth:`VllmSampler.export_path`) and the run awaits :meth:`VllmSampler.update_weights`:

- LoRA (``kind = "lora"``): ``POST /v1/load_lora_adapter`` of ``<adapter_prefix>-v<N>`` on
  every server at once; then requests that start name that adapter and report version N;
  then adapters older than the newest ``keep_adapters + 1`` are unloaded
  (``/v1/unload_lora_adapter``), so requests in flight finish on theirs.
- Full weights (``kind = "full"``): new requests wait; once the requests in flight have
  finished, every server gets ``POST /pause?mode=wait`` (vLLM drains what other clients sent),
  ``POST /collective_rpc`` ``reload_weights`` with ``{"weights_path": "<weights_dir>/v<N>"}``,
  ``rllm_refresh_tied_weights`` (the sampler's worker extension, which re-derives what vLLM
  computed from a tied embedding at startup; a server without it is warned about once),
  ``POST /reset_prefix_cache`` (its cached KV came from the old weights; an answer of
  ``{"success": false}`` is retried), ``POST /update_weight_version`` ``{"new_version": "N"}``
  and ``POST /resume``; then requests go on and report version N. A server older than
  ``/pause`` (404) is reloaded without it; one whose ``reload_weights`` takes no
  ``weights_path`` gets ``update_config`` with the folder first. The folder is checked here
  first (it must hold ``config.json``): a reload vLLM fails half-way leaves its engine dead.

Each call to a server is retried on a connection error, a 429 or a 5xx within the retry keys;
when they are spent the update raises :class:`~rllm_core.errors.UpstreamError` naming the
server, the adapter or folder, and the server's answer. A server that cannot be reached at all
is marked down instead and gets the weights when it comes back, unless no server took them.

A 5xx that carries an exception raised inside vLLM's worker (a LoRA rank above
``--max-lora-rank``, LoRA not enabled, a folder it cannot load) is permanent, not retried. An
adapter name vLLM says "has already been loaded" is checked against ``GET /v1/models``: when it
points at another folder (a server that outlived an earlier run) it is loaded again in place.

A server that restarted (a completion answers 404 "does not exist" for the adapter, a health
check sees it come back, or, with full weights, ``GET /weight_info`` no longer names the current
version) is given the current adapter or folder again before it serves another request;
:meth:`VllmSampler.sync_metrics` counts these restores.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rllm_core.errors import ComponentError, UpstreamError, UpstreamUnavailableError
from rllm_core.kit.retry import retry_async
from rllm_core.types import ExportedWeights, SampleRequest, SampleResult

from rllm_sampler_vllm.httpclient import HttpConnectError, HttpProtocolError
from rllm_sampler_vllm.pool import HttpWorkerPool, _error_detail, _Worker
from rllm_sampler_vllm.serve import (
    REFRESH_TIED_WEIGHTS,
    WORKER_EXTENSION,
    ServerProcesses,
    check_can_serve,
    resolve_python,
    serve_commands,
    worker_extension_launch,
)

if TYPE_CHECKING:
    from rllm_sampler_vllm.plugin import VllmSamplerConfig

__all__ = ["VllmSampler"]

log = logging.getLogger(__name__)

_LOAD_HINT = (
    "the server must run with --enable-lora, --max-lora-rank at least the adapter's rank and"
    " VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, and read the folder (weights_dir on storage the"
    " servers share)"
)
_RELOAD_HINT = (
    "the server must run with VLLM_SERVER_DEV_MODE=1 (for /collective_rpc and"
    " /reset_prefix_cache) and read the folder (weights_dir on storage the servers share)"
)
# vLLM wraps an exception its worker raised in a 500 with these words; calling again fails
# the same way.
_WORKER_RAISED = ("Worker failed with error", "method failed", "is greater than max_lora_rank")
_CACHE_RESET_TRIES = 20
_CACHE_RESET_WAIT_S = 0.25


class _CallFailed(Exception):
    def __init__(
        self, message: str, *, transient: bool, unreachable: bool = False, status: int = 0
    ) -> None:
        super().__init__(message)
        self.transient = transient
        self.unreachable = unreachable
        self.status = status


def _model_folder_problem(path: str) -> str | None:
    """Why vLLM could not load the model folder ``path`` (seen from this process), or
    ``None``."""
    folder = Path(path)
    if not folder.is_dir():
        return f"{path} is not a folder"
    if not (folder / "config.json").is_file():
        return f"{path} has no config.json"
    return None


class VllmSampler(HttpWorkerPool):
    """A :class:`~rllm_sampler_vllm.pool.HttpWorkerPool` that is also a
    :class:`~rllm_core.ports.PolicyFollower`; see the module docstring.

    ``weights_dir`` is where the trainer writes the versions (``None``: the sampler cannot
    follow a trainer, and :meth:`export_path` says so); ``servers`` are the processes it
    started itself (``[sampler.serve]``), started on first use and stopped by :meth:`aclose`;
    ``lora_rank`` is the largest adapter rank those accept (0: full weights only).

    Example::

        sampler = VllmSampler(["http://10.0.0.5:8000"], model="qwen", weights_dir="/shared/w")
        exported = trainer.export_weights(sampler.export_path(3))
        await sampler.update_weights(exported)   # requests now name "policy-v3"
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        weights_dir: str | None = None,
        adapter_prefix: str = "policy",
        keep_adapters: int = 1,
        sync_timeout_s: float = 600.0,
        servers: ServerProcesses | None = None,
        lora_rank: int | None = None,
        **pool: Any,
    ) -> None:
        super().__init__(urls, **pool)
        self.weights_dir = weights_dir
        self.adapter_prefix = adapter_prefix
        self.keep_adapters = keep_adapters
        self.sync_timeout_s = sync_timeout_s
        self.servers = servers
        self.lora_rank = lora_rank
        self._current: ExportedWeights | None = None
        self._adapters: deque[str] = deque()
        self._sync_lock: asyncio.Lock | None = None
        self._admitting: asyncio.Event | None = None
        self._idle: asyncio.Event | None = None
        self._active = 0
        self._starting: asyncio.Future[None] | None = None
        self._syncs = 0
        self._sync_seconds = 0.0
        self._without_extension: set[str] = set()

    @classmethod
    def from_config(cls, config: VllmSamplerConfig) -> VllmSampler:  # type: ignore[override]
        """The sampler the ``sampler:vllm`` keys describe; with ``serve``, refuses at once
        when this machine cannot run vLLM."""
        urls = config.urls
        servers = None
        lora_rank = None
        if config.serve is not None:
            python = resolve_python(config.serve)
            launches = serve_commands(
                config.serve,
                served_model_name=config.model,
                api_key=config.api_key,
                python=python,
                build=check_can_serve(python),
            )
            urls = [launch.url for launch in launches]
            servers = ServerProcesses(
                launches,
                log_dir=config.serve.log_dir or config.weights_dir,
                startup_timeout_s=config.serve.startup_timeout_s,
            )
            lora_rank = config.serve.max_lora_rank
        assert urls is not None
        model = config.model
        if config.serve is not None and model is None:
            model = config.serve.model
        return cls(
            urls,
            weights_dir=config.weights_dir,
            adapter_prefix=config.adapter_prefix,
            keep_adapters=config.keep_adapters,
            sync_timeout_s=config.sync_timeout_s,
            servers=servers,
            lora_rank=lora_rank,
            model=model,
            api_key=config.api_key,
            retry=config,
            retry_budget_s=config.retry_budget_s,
            request_timeout_s=config.request_timeout_s,
            health_interval_s=config.health_interval_s,
        )

    # ---------------------------------------------------------------- PolicyFollower port

    def export_path(self, version: int) -> str:
        if not self.weights_dir:
            raise ComponentError(
                "[sampler] vllm has no weights_dir, so the trainer has nowhere to write weight"
                f" version {version} for the vLLM servers: set [sampler] weights_dir to a folder"
                " this process and every server read (a shared file system)",
                kind="sampler",
                name="vllm",
            )
        return str(Path(self.weights_dir) / f"v{version}")

    async def update_weights(self, exported: ExportedWeights) -> None:
        self._check_servers_take(exported)
        await self._servers_up()
        if self._sync_lock is None:
            self._sync_lock = asyncio.Lock()
        started = time.monotonic()
        async with self._sync_lock:
            if exported.kind == "lora":
                await self._update_adapter(exported)
            else:
                await self._update_full(exported)
        self._syncs += 1
        self._sync_seconds += time.monotonic() - started

    def _check_servers_take(self, exported: ExportedWeights) -> None:
        """Refuse weights the servers this sampler started cannot load, naming the key."""
        if self.lora_rank is None:
            return
        if exported.kind == "lora" and self.lora_rank < max(exported.lora_rank, 1):
            raise ComponentError(
                f"the trainer exports LoRA adapters of rank {exported.lora_rank}, but"
                f" [sampler.serve] max_lora_rank = {self.lora_rank} starts vLLM"
                + (" without LoRA" if not self.lora_rank else " for lower ranks")
                + "; set max_lora_rank to at least the trainer's rank",
                kind="sampler",
                name="vllm",
            )
        if exported.kind == "full" and self.lora_rank:
            raise ComponentError(
                "the trainer exports full weights, but [sampler.serve] max_lora_rank ="
                f" {self.lora_rank} starts vLLM for LoRA adapters; set max_lora_rank = 0",
                kind="sampler",
                name="vllm",
            )

    def holds_weights(self) -> bool:
        return self._current is not None

    async def restore(self, url: str) -> None:
        """Give ``url`` the current weights. An update that lands while this runs may have
        missed the worker (it was down), so the restore repeats until it gave the version that
        is current when it ends."""
        worker = next(w for w in self._workers if w.url == url)
        given: ExportedWeights | None = None
        while (current := self._current) is not None and current is not given:
            if current.kind == "lora":
                await self._load(worker, self.adapter_name(current.version), current.path)
            else:
                await self._reload(worker, current)
            given = current

    async def _probe(self, worker: _Worker) -> str | None:
        """The pool's health probe; with full weights also ``GET /weight_info``, which tells a
        server that restarted (it serves its startup weights) from one on the current version.
        Reporting it as an error marks it down; the next probe restores it."""
        error = await super()._probe(worker)
        current = self._current
        if error is not None or current is None or current.kind != "full" or not worker.healthy:
            return error
        if self._sync_lock is not None and self._sync_lock.locked():
            return None
        served = await self.served_version(worker)
        if served is None or served == str(current.version):
            return None
        return f"it serves weight version {served!r}, not {current.version} (it restarted?)"

    def adapter_name(self, version: int) -> str:
        """The name weight version ``version`` is loaded as (LoRA training)."""
        return f"{self.adapter_prefix}-v{version}"

    def sync_metrics(self) -> Mapping[str, float]:
        """Weight updates done, the seconds they took, and restores of restarted servers."""
        return {
            "vllm/weight_syncs": float(self._syncs),
            "vllm/sync_s": self._sync_seconds,
            "vllm/restores": float(self.restores()),
        }

    # ---------------------------------------------------------------- updates

    async def _update_adapter(self, exported: ExportedWeights) -> None:
        name = self.adapter_name(exported.version)
        await self._everywhere(
            lambda worker: self._load(worker, name, exported.path),
            f"loading adapter {name!r} from {exported.path}",
        )
        self._current = exported
        self.use(name, exported.version)
        if name in self._adapters:
            self._adapters.remove(name)
        self._adapters.append(name)
        while len(self._adapters) > self.keep_adapters + 1:
            await self._unload_everywhere(self._adapters.popleft())

    async def _update_full(self, exported: ExportedWeights) -> None:
        admitting = self._admission()
        admitting.clear()
        try:
            if self._active:
                if self._idle is None:
                    self._idle = asyncio.Event()
                self._idle.clear()
                await self._idle.wait()
            await self._everywhere(
                lambda worker: self._reload(worker, exported),
                f"reloading the weights from {exported.path}",
            )
            self._current = exported
            self.use(self.model, exported.version)
        finally:
            admitting.set()

    async def _everywhere(self, call: Any, what: str) -> None:
        """``call(worker)`` on every worker at once. A worker that cannot be reached is marked
        down (a health check restores it when it is back); any other failure, or no worker
        taking the call, raises :class:`UpstreamError`."""
        results = await asyncio.gather(
            *(call(worker) for worker in self._workers), return_exceptions=True
        )
        errors = []
        reached = 0
        for worker, result in zip(self._workers, results, strict=True):
            if isinstance(result, _Unreachable):
                self._mark_down(worker, str(result))
            elif isinstance(result, BaseException):
                errors.append(result)
            else:
                reached += 1
        if errors:
            first = errors[0]
            if isinstance(first, UpstreamError | ComponentError):
                raise first
            raise UpstreamError(f"{what} failed: {first!r}") from first
        if not reached:
            states = "; ".join(f"{w.url} ({w.last_error})" for w in self._workers)
            raise UpstreamUnavailableError(
                f"{what} reached no vLLM server: {states}; start the servers or fix the"
                " sampler's urls"
            )

    async def _unload_everywhere(self, name: str) -> None:
        async def unload(worker: _Worker) -> None:
            try:
                await self._call(worker, "/v1/unload_lora_adapter", {"lora_name": name})
            except _CallFailed as exc:
                if "404" not in str(exc):
                    log.warning("vLLM server %s kept adapter %r: %s", worker.url, name, exc)

        await asyncio.gather(*(unload(w) for w in self._workers if w.healthy))

    async def _load(self, worker: _Worker, name: str, path: str) -> None:
        payload: dict[str, Any] = {"lora_name": name, "lora_path": path}
        what = f"loading adapter {name!r} from {path}"
        try:
            await self._call(worker, "/v1/load_lora_adapter", payload)
        except _CallFailed as exc:
            if "has already been loaded" not in str(exc):
                self._raise(worker, exc, what, _LOAD_HINT)
            try:
                if await self._adapter_root(worker, name) == path:
                    return
                log.warning(
                    "vLLM server %s holds an adapter %r from another folder; loading %s in"
                    " its place",
                    worker.url,
                    name,
                    path,
                )
                await self._call(worker, "/v1/load_lora_adapter", {**payload, "load_inplace": True})
            except _CallFailed as again:
                self._raise(worker, again, what, _LOAD_HINT)

    async def _adapter_root(self, worker: _Worker, name: str) -> str | None:
        """The folder the server loaded adapter ``name`` from (``GET /v1/models``)."""
        body = await self._call(worker, "/v1/models", None, method="GET")
        try:
            cards = json.loads(body).get("data", [])
        except (ValueError, AttributeError):
            return None
        for card in cards:
            if isinstance(card, dict) and card.get("id") == name:
                root = card.get("root")
                return root if isinstance(root, str) else None
        return None

    async def _reload(self, worker: _Worker, exported: ExportedWeights) -> None:
        path = exported.path
        what = f"reloading the weights from {path}"
        problem = _model_folder_problem(path)
        if problem is not None:
            raise UpstreamError(
                f"vLLM server {worker.url}: {what} refused before sending: {problem}; the"
                " trainer's export did not complete, or weights_dir is not the folder it wrote"
            )
        paused = False
        try:
            try:
                await self._call(worker, "/pause?mode=wait", None)
                paused = True
            except _CallFailed as exc:
                if exc.status != 404:
                    raise
            await self._reload_weights(worker, path)
            await self._refresh_tied_weights(worker)
            await self._reset_prefix_cache(worker)
            try:
                await self._call(
                    worker, "/update_weight_version", {"new_version": str(exported.version)}
                )
            except _CallFailed as exc:
                if exc.status not in (404, 405):
                    raise
        except _CallFailed as exc:
            self._raise(worker, exc, what, _RELOAD_HINT)
        finally:
            if paused:
                try:
                    await self._call(worker, "/resume", None)
                except _CallFailed as exc:
                    self._raise(worker, exc, f"resuming after {what}", _RELOAD_HINT)

    async def _reload_weights(self, worker: _Worker, path: str) -> None:
        reload = {"method": "reload_weights", "kwargs": {"weights_path": path}}
        try:
            await self._call(worker, "/collective_rpc", reload)
        except _CallFailed as exc:
            if "weights_path" not in str(exc) or "unexpected keyword" not in str(exc):
                raise
            # vLLM before reload_weights(weights_path=...): point the model config at the
            # folder, then reload from it.
            overrides = {"model_config": {"model": path}}
            await self._call(
                worker, "/collective_rpc", {"method": "update_config", "args": [overrides]}
            )
            await self._call(worker, "/collective_rpc", {"method": "reload_weights"})

    async def _refresh_tied_weights(self, worker: _Worker) -> None:
        """Redo the post-load processing of tied layers through the sampler's worker extension
        (:data:`~rllm_sampler_vllm.serve.WORKER_EXTENSION`); a server started without it is
        warned about once and reloaded without it."""
        if worker.url in self._without_extension:
            return
        try:
            await self._call(worker, "/collective_rpc", {"method": REFRESH_TIED_WEIGHTS})
        except _CallFailed as exc:
            if f"no attribute '{REFRESH_TIED_WEIGHTS}'" not in str(exc):
                raise
            self._without_extension.add(worker.url)
            args, env = worker_extension_launch()
            log.warning(
                "vLLM server %s runs without %s: after a full-weight reload, vLLM's CPU build"
                " keeps serving a tied output embedding (as SmolLM2's) from the startup"
                " weights; start it with %s and PYTHONPATH=%s (servers [sampler.serve]"
                " starts have both)",
                worker.url,
                WORKER_EXTENSION,
                " ".join(args),
                env["PYTHONPATH"],
            )

    async def _reset_prefix_cache(self, worker: _Worker) -> None:
        """``POST /reset_prefix_cache`` until vLLM says it reset; it answers ``{"success":
        false}`` while a request still holds cache blocks."""
        for _ in range(_CACHE_RESET_TRIES):
            body = await self._call(worker, "/reset_prefix_cache", None)
            try:
                answer = json.loads(body) if body.strip() else {}
            except ValueError:
                answer = {}
            if not isinstance(answer, dict) or answer.get("success", True) is not False:
                return
            await asyncio.sleep(_CACHE_RESET_WAIT_S)
        raise _CallFailed(
            'POST /reset_prefix_cache kept answering {"success": false} (requests still hold'
            f" its cache blocks) after {_CACHE_RESET_TRIES} tries; old-weight KV would be reused",
            transient=False,
        )

    async def served_version(self, worker: _Worker) -> str | None:
        """The weight version a server says it serves (``GET /weight_info``, which this sampler
        sets after each full-weight reload); ``None`` when it does not say. One attempt: it is
        part of a health probe."""
        try:
            response = await self._client.request(
                "GET",
                worker.origin,
                "/weight_info",
                headers=self._headers,
                timeout_s=max(self.health_interval_s, 1.0),
            )
        except (HttpConnectError, HttpProtocolError, TimeoutError):
            return None
        if response.status != 200:
            return None
        try:
            version = json.loads(response.body).get("weight_version")
        except (ValueError, AttributeError):
            return None
        return str(version) if version is not None else None

    def _raise(self, worker: _Worker, exc: _CallFailed, what: str, hint: str) -> None:
        if exc.unreachable:
            raise _Unreachable(f"{worker.url}: {exc}") from None
        raise UpstreamError(f"vLLM server {worker.url}: {what} failed: {exc}; {hint}") from None

    async def _call(
        self, worker: _Worker, path: str, payload: dict[str, Any] | None, *, method: str = "POST"
    ) -> bytes:
        """``method path`` to ``worker``, retried on a connection error, a 429 or a 5xx (not one
        carrying an exception vLLM's worker raised); the answer's body."""
        body = b"" if payload is None else json.dumps(payload).encode()
        headers = self._headers
        if payload is not None:
            headers = {**headers, "content-type": "application/json"}
        attempts = 0

        async def once() -> bytes:
            nonlocal attempts
            attempts += 1
            try:
                response = await self._client.request(
                    method,
                    worker.origin,
                    path,
                    body=body,
                    headers=headers,
                    timeout_s=self.sync_timeout_s,
                )
            except (HttpConnectError, HttpProtocolError) as exc:
                raise _CallFailed(
                    f"cannot reach it ({exc})", transient=True, unreachable=True
                ) from None
            except TimeoutError:
                raise _CallFailed(
                    f"POST {path} got no answer within {self.sync_timeout_s:.0f}s (sync_timeout_s)",
                    transient=False,
                ) from None
            if response.status == 200:
                return response.body
            detail = _error_detail(response)
            transient = response.status == 429 or response.status >= 500
            if any(words in detail for words in _WORKER_RAISED):
                transient = False
            raise _CallFailed(
                f"{method} {path} answered HTTP {response.status}: {detail}",
                transient=transient,
                status=response.status,
            )

        try:
            return await retry_async(
                once,
                self.retry,
                transient=lambda error: isinstance(error, _CallFailed) and error.transient,
                what=f"{method} {path} to {worker.url}",
            )
        except _CallFailed as exc:
            if attempts > 1:
                exc.args = (f"{exc} (after {attempts} attempts)",)
            raise

    # ---------------------------------------------------------------- sampling

    def _admission(self) -> asyncio.Event:
        if self._admitting is None:
            self._admitting = asyncio.Event()
            self._admitting.set()
        return self._admitting

    async def sample(self, request: SampleRequest) -> SampleResult:
        await self._servers_up()
        admitting = self._admission()
        while not admitting.is_set():
            await admitting.wait()
        self._active += 1
        try:
            return await super().sample(request)
        finally:
            self._active -= 1
            if not self._active and self._idle is not None:
                self._idle.set()

    async def sample_stream(
        self, request: SampleRequest
    ) -> AsyncIterator[tuple[list[int], list[float]] | SampleResult]:
        """:meth:`HttpWorkerPool.sample_stream` under the same admission as :meth:`sample`:
        a weight update waits for the stream to end."""
        await self._servers_up()
        admitting = self._admission()
        while not admitting.is_set():
            await admitting.wait()
        self._active += 1
        try:
            async for item in super().sample_stream(request):
                yield item
        finally:
            self._active -= 1
            if not self._active and self._idle is not None:
                self._idle.set()

    async def _servers_up(self) -> None:
        """Start the servers of ``[sampler.serve]`` once, whoever asks first."""
        if self.servers is None:
            return
        if self._starting is None:
            self._starting = asyncio.ensure_future(self.servers.start())
        await asyncio.shield(self._starting)

    async def start(self) -> None:
        """Start the servers of ``[sampler.serve]`` (once), then probe every server and keep
        checking in the background."""
        await self._servers_up()
        await super().start()

    async def aclose(self) -> None:
        await super().aclose()
        if self.servers is not None:
            await asyncio.to_thread(self.servers.stop)


class _Unreachable(UpstreamError):
    """A worker could not be reached for a weight update (it is down)."""
