"""The vLLM sampler: :class:`HttpWorkerPool`, the :class:`~rllm_core.ports.Sampler` port over
one or more vLLM OpenAI-compatible servers (``vllm serve``, or anything that answers the same
way), sending and reading token ids. The exchange is described in this package's README.

Routing: a request is routed by :data:`rllm_core.routing.routing_key` (the gateway session),
else by its request id. A key sticks to the worker that served it first while that worker is
healthy, so the worker's prefix cache keeps serving the session; a new key goes to the healthy
worker with the fewest requests in flight (then the fewest sessions).

Failures: a connection error marks the worker down and the request moves to another worker at
once (or, when none is up, after a backoff); a request :meth:`HttpWorkerPool.cut` ended moves
the same way, but its worker is not marked down and the move counts neither as a retry nor as
a failure, so it is re-sent even with ``retries = 0`` (it waits for a worker within
``retry_budget_s`` only when none is up); a ``429`` or ``5xx`` answer is retried after the
worker's ``Retry-After`` (seconds or an HTTP date) or a jittered backoff, through
:func:`rllm_core.kit.retry.retry_async`. Retries are bounded by ``retries`` and by
``retry_budget_s``, counted from the request's first failure (or from the moment it first
found no worker up), so a long generation that fails late is retried like a short one. A
background task checks ``GET {worker}/health`` every ``health_interval_s`` and brings workers
back. When no worker is up the request waits for one within the budget, then fails with
:class:`~rllm_core.errors.UpstreamUnavailableError`, which names every worker and its last error.

Lending a server: the pool is a :class:`~rllm_core.ports.DrainablePool`. :meth:`drain
<HttpWorkerPool.drain>` takes a worker out of routing (its sticky keys move to the least loaded
worker at their next request, health checks go on but do not route to it, and
:meth:`~HttpWorkerPool.status` shows it unhealthy with ``last_error`` ``"drained"``);
:meth:`~HttpWorkerPool.in_flight` counts what still runs there; :meth:`~HttpWorkerPool.cut`
ends it: a plain request is re-sent to another worker and its caller gets that worker's
answer, a stream that has not handed out a token yet is served by :meth:`sample` instead, and
one that has fails with :class:`~rllm_core.errors.UpstreamError`. :meth:`~HttpWorkerPool.admit`
routes to the worker again. While drained, a worker that was down and comes back is not given
its weights (:meth:`~HttpWorkerPool.restore`): it stays down until admitted, when the next
health check restores it.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
from rllm_core.errors import (
    UpstreamError,
    UpstreamRejectedError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from rllm_core.kit.retry import RetrySettings, retry_async
from rllm_core.routing import routing_key
from rllm_core.types import SampleRequest, SampleResult, WorkerStatus

from rllm_sampler_vllm.httpclient import (
    HttpClient,
    HttpConnectError,
    HttpProtocolError,
    HttpResponse,
    HttpStream,
    Origin,
)

if TYPE_CHECKING:
    from rllm_sampler_vllm.plugin import VllmSamplerConfig

__all__ = ["HttpWorkerPool", "completion_body", "parse_retry_after"]

log = logging.getLogger(__name__)

# When health checks are off, a request waiting for a worker probes at most this often.
_MIN_PROBE_INTERVAL_S = 0.05


class _AttemptFailed(UpstreamError):
    """One attempt failed in a way a later attempt may not: a connection error (``moved``: the
    worker is marked down) or a 429/5xx answer (with the worker's ``Retry-After``, if any)."""

    def __init__(self, message: str, *, retry_after: float | None = None, moved: bool = False):
        super().__init__(message)
        self.retry_after = retry_after
        self.moved = moved


class _Cut(_AttemptFailed):
    """The request was ended by :meth:`HttpWorkerPool.cut`; it goes to another worker and is
    no failure of its own."""

    def __init__(self, url: str) -> None:
        super().__init__(f"{url}: cut (the server was lent away)", moved=True)


class _ModelMissing(UpstreamError):
    """The worker answered that the model the request named does not exist: it lost the
    weights it was given (it restarted)."""


class _OverBudget(Exception):
    """The next wait would end past ``retry_budget_s``."""

    def __init__(self, delay: float) -> None:
        super().__init__(delay)
        self.delay = delay


# ------------------------------------------------------------------------------ wire format


class _RequestBody(msgspec.Struct, omit_defaults=True, kw_only=True):
    # Fields without a default are always sent; seed and model only when set.
    prompt: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    # Neutral on purpose: a server started with --generation-config auto (vLLM's default)
    # fills whatever a request leaves out from the model's generation_config.json, which would
    # truncate the distribution and make its logprobs disagree with the trainer's.
    top_k: int
    min_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    stop_token_ids: list[int]
    n: int
    stream: bool
    logprobs: int
    return_token_ids: bool
    return_tokens_as_token_ids: bool
    skip_special_tokens: bool
    seed: int | None = None
    model: str | None = None


class _LogProbs(msgspec.Struct):
    token_logprobs: list[float | None] = []
    tokens: list[str] = []


class _Choice(msgspec.Struct):
    finish_reason: str | None = None
    token_ids: list[int] | None = None
    logprobs: _LogProbs | None = None


class _ResponseBody(msgspec.Struct):
    choices: list[_Choice]
    weight_version: int | None = None


class _ErrorBody(msgspec.Struct):
    error: dict | str | None = None
    message: str | None = None
    detail: str | list | None = None


_encoder = msgspec.json.Encoder()
_response_decoder = msgspec.json.Decoder(_ResponseBody)
_chunk_decoder = msgspec.json.Decoder(_ResponseBody)
_error_decoder = msgspec.json.Decoder(_ErrorBody)


def completion_body(
    request: SampleRequest, *, model: str | None = None, stream: bool = False
) -> bytes:
    """The ``POST /v1/completions`` body the pool sends a worker for ``request``: the token-id
    prompt and sampling settings (every other sampling knob at its neutral value), one choice,
    streamed only with ``stream``, the sampled tokens' logprobs and ids
    (``return_tokens_as_token_ids``: each ``token_id:<n>``), special tokens kept; ``seed`` and
    ``model`` only when set. Not ``return_token_ids``: with it vLLM also echoes the whole
    prompt's ids, which the answer would carry for nothing (reading past them cost the gateway
    4% of its CPU per call at 3,000-token prompts)."""
    params = request.params
    return _encoder.encode(
        _RequestBody(
            prompt=request.prompt_token_ids,
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=-1,
            min_p=0.0,
            repetition_penalty=1.0,
            presence_penalty=0.0,
            frequency_penalty=0.0,
            stop_token_ids=list(params.stop_token_ids),
            n=1,
            stream=stream,
            logprobs=0,
            return_token_ids=False,
            return_tokens_as_token_ids=True,
            skip_special_tokens=False,
            seed=params.seed,
            model=model,
        )
    )


def _error_detail(response: HttpResponse) -> str:
    """The worker's own error message, whatever shape it used."""
    try:
        body = _error_decoder.decode(response.body)
    except msgspec.DecodeError:
        text = response.body[:300].decode("utf-8", "replace").strip()
        return text or "(empty body)"
    if isinstance(body.error, dict) and isinstance(body.error.get("message"), str):
        return body.error["message"]
    for value in (body.error, body.message, body.detail):
        if value:
            return str(value)
    return response.body[:300].decode("utf-8", "replace")


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


# ------------------------------------------------------------------------------ the pool


@dataclass(frozen=True)
class Policy:
    """What a request is sent with: the ``model`` field (``None``: none) and the weight
    version its result reports."""

    model: str | None
    version: int


class _Call:
    """One request running on a worker, for :meth:`HttpWorkerPool.cut`. ``task`` is the task
    to cancel while the request waits on the worker (``None`` while a stream is handed out
    and its reader is elsewhere), ``stream`` the response a stream reads."""

    __slots__ = ("cancelled", "cut", "ended", "stream", "task")

    def __init__(self, task: asyncio.Task | None) -> None:
        self.task = task
        self.cut = False
        self.cancelled = False
        self.stream: HttpStream | None = None
        self.ended: asyncio.Future[None] | None = None


@dataclass
class _Worker:
    url: str
    origin: Origin
    healthy: bool = True
    drained: bool = False
    sessions: int = 0
    served: int = 0
    failures: int = 0
    last_error: str | None = None
    restores: int = 0
    restoring: asyncio.Future[str | None] | None = None
    calls: set[_Call] = field(default_factory=set)

    @property
    def in_flight(self) -> int:
        return len(self.calls)

    @property
    def routable(self) -> bool:
        return self.healthy and not self.drained

    def enter(self, task: asyncio.Task | None) -> _Call:
        call = _Call(task)
        self.calls.add(call)
        return call

    def leave(self, call: _Call) -> None:
        """``call`` no longer runs here (idempotent)."""
        self.calls.discard(call)
        if call.ended is not None and not call.ended.done():
            call.ended.set_result(None)


class HttpWorkerPool:
    """A :class:`~rllm_core.ports.Sampler`, :class:`~rllm_core.ports.WorkerPool` and
    :class:`~rllm_core.ports.DrainablePool` over vLLM servers; see the module docstring.

    ``model`` is sent as the request's ``model`` field (vLLM's served model name) when given;
    ``api_key`` as a bearer token. ``weight_version`` is what results report unless a worker
    answers with its own ``weight_version`` field. :meth:`use` changes both for the requests
    that start afterwards; a request keeps the model and version it started with (a
    :class:`Policy`). ``retry`` holds the retry keys (``retries``, ``retry_backoff_s``,
    ``retry_backoff_max_s``).

    A subclass that gives the workers their weights overrides :meth:`holds_weights` and
    :meth:`restore`: a worker that answers 404 "does not exist" for a model other than
    ``model`` (an adapter it was given), or that comes back after being down, is restored
    before it serves another request.

    The pool belongs to the event loop it is first used in. :meth:`start` begins health
    checks (the first :meth:`sample` starts them too); :meth:`aclose` stops them and closes
    connections.

    Example::

        pool = HttpWorkerPool(["http://10.0.0.5:8000", "http://10.0.0.6:8000"])
        with rllm_core.routing.routed("session-1"):
            result = await pool.sample(SampleRequest(prompt_token_ids=ids))
    """

    def __init__(
        self,
        urls: Sequence[str],
        *,
        model: str | None = None,
        api_key: str | None = None,
        weight_version: int = 0,
        retry: RetrySettings | None = None,
        retry_budget_s: float = 60.0,
        connect_timeout_s: float = 5.0,
        request_timeout_s: float = 900.0,
        health_interval_s: float = 5.0,
        health_path: str = "/health",
        completions_path: str = "/v1/completions",
        max_connections_per_worker: int = 512,
        max_sticky_sessions: int = 100_000,
    ) -> None:
        if isinstance(urls, str):
            urls = [urls]
        if not urls:
            raise ValueError("the vLLM sampler needs at least one worker URL")
        workers = []
        for url in urls:
            try:
                workers.append(_Worker(url=url.rstrip("/"), origin=Origin.parse(url)))
            except ValueError as exc:
                raise ValueError(
                    f"worker URL {url!r} is invalid: {exc}; write it as http://host:port"
                ) from None
        self._workers = workers
        self.model = model
        self.retry = retry if retry is not None else RetrySettings()
        self.retry_budget_s = retry_budget_s
        self.request_timeout_s = request_timeout_s
        self.health_interval_s = health_interval_s
        self.health_path = health_path
        self.completions_path = completions_path
        self.max_sticky_sessions = max_sticky_sessions
        self._policy = Policy(model=model, version=weight_version)
        self._api_key = api_key
        self._headers = {"content-type": "application/json"}
        if api_key:
            self._headers["authorization"] = f"Bearer {api_key}"
        self._client = HttpClient(
            max_connections=max_connections_per_worker, connect_timeout_s=connect_timeout_s
        )
        self._sticky: OrderedDict[str, _Worker] = OrderedDict()
        self._health_task: asyncio.Task[None] | None = None
        self._health_changed: asyncio.Event | None = None
        self._closed = False

    @classmethod
    def from_config(cls, config: VllmSamplerConfig) -> HttpWorkerPool:
        """The pool the ``sampler:vllm`` keys describe."""
        return cls(
            config.urls,
            model=config.model,
            api_key=config.api_key,
            retry=config,
            retry_budget_s=config.retry_budget_s,
            request_timeout_s=config.request_timeout_s,
            health_interval_s=config.health_interval_s,
        )

    # ---------------------------------------------------------------- policy

    @property
    def weight_version(self) -> int:
        return self._policy.version

    @weight_version.setter
    def weight_version(self, version: int) -> None:
        self._policy = Policy(model=self._policy.model, version=version)

    @property
    def policy(self) -> Policy:
        """The model name and version requests starting now are sent with."""
        return self._policy

    def use(self, model: str | None, version: int) -> None:
        """Send requests that start from now on with ``model`` and report ``version``."""
        self._policy = Policy(model=model, version=version)

    def served_policy(self) -> tuple[str | None, int]:
        """``(model, version)`` requests starting now are sent with (the ``SharedPool`` port)."""
        return self._policy.model, self._policy.version

    def client_options(self) -> dict[str, Any]:
        """The ``sampler:vllm`` keys of a pool in another process over the same servers (the
        ``SharedPool`` port): their URLs, the name, key, timeouts and retries of this one, and
        nothing that starts a server or loads weights."""
        retry = {name: getattr(self.retry, name) for name in RetrySettings.model_fields}
        return {
            **retry,
            "urls": [worker.url for worker in self._workers],
            "model": self.model,
            "api_key": self._api_key,
            "retry_budget_s": self.retry_budget_s,
            "request_timeout_s": self.request_timeout_s,
            "health_interval_s": self.health_interval_s,
        }

    def holds_weights(self) -> bool:
        """Whether this pool gave the workers weights that :meth:`restore` gives back to one
        that lost them. The base pool gives none."""
        return False

    async def restore(self, url: str) -> None:
        """Give the worker at ``url`` the current weights again (it restarted). Raises when it
        cannot; the worker then stays down until a health check restores it."""

    def restores(self) -> int:
        """How many times a worker was given its weights again."""
        return sum(w.restores for w in self._workers)

    async def _restore_worker(self, worker: _Worker) -> str | None:
        """Restore ``worker`` once however many requests found it lost its weights; the error,
        or ``None``."""
        if worker.restoring is None:
            worker.restoring = asyncio.ensure_future(self._run_restore(worker))
        return await asyncio.shield(worker.restoring)

    async def _run_restore(self, worker: _Worker) -> str | None:
        log.warning(
            "upstream worker %s lost its policy weights (it restarted?); giving it %s again",
            worker.url,
            self._policy.model or f"version {self._policy.version}",
        )
        try:
            await self.restore(worker.url)
        except Exception as exc:
            error = f"restoring the policy weights failed: {exc}"
            self._mark_down(worker, error)
            return error
        else:
            worker.restores += 1
            return None
        finally:
            worker.restoring = None

    # ---------------------------------------------------------------- Sampler port

    async def sample(self, request: SampleRequest) -> SampleResult:
        if self._closed:
            raise UpstreamError("the worker pool is closed")
        self._ensure_health_checks()
        loop = asyncio.get_running_loop()
        key = routing_key.get() or request.request_id or None
        policy = self._policy
        body = completion_body(request, model=policy.model)
        headers = self._headers
        if request.request_id:
            headers = {**headers, "x-request-id": request.request_id}
        started = loop.time()
        # The budget bounds the time spent recovering, not the generation: it starts at the
        # first failure, so a completion that ran past it before failing still gets its retries.
        first_failure: float | None = None
        failures: list[str] = []
        attempts = 0

        async def attempt() -> SampleResult:
            nonlocal attempts, policy, body, first_failure
            while True:
                worker = self._pick(key)
                if worker is None:
                    if first_failure is None:
                        first_failure = loop.time()
                    worker = await self._worker_for(key, first_failure)
                if worker.restoring is not None:
                    error = await self._restore_worker(worker)
                    if error is not None:
                        failures.append(f"{worker.url}: {error}")
                        raise _AttemptFailed(f"{worker.url}: {error}", moved=True)
                attempts += 1
                try:
                    return await self._post(worker, body, headers, policy)
                except _Cut:
                    # Not the request's failure: sent again at once, outside the retries.
                    attempts -= 1
                    continue
                except _ModelMissing as exc:
                    failures.append(str(exc))
                    error = await self._restore_worker(worker)
                    if error is not None:
                        raise _AttemptFailed(f"{worker.url}: {error}", moved=True) from None
                    # The request starts over on the weights the worker was given back.
                    policy = self._policy
                    body = completion_body(request, model=policy.model)
                    raise _AttemptFailed(str(exc), retry_after=0.0) from None
                except _AttemptFailed as exc:
                    failures.append(str(exc))
                    raise

        def within_budget(number: int, error: BaseException, delay: float) -> None:
            nonlocal first_failure
            if first_failure is None:
                first_failure = loop.time()
            if loop.time() - first_failure + delay > self.retry_budget_s:
                raise _OverBudget(delay)

        try:
            return await retry_async(
                attempt,
                self.retry,
                transient=lambda error: isinstance(error, _AttemptFailed),
                what="a vLLM completion",
                on_retry=within_budget,
                hint=self._next_wait,
            )
        except _AttemptFailed:
            raise self._gave_up(attempts, started, failures, None) from None
        except _OverBudget as over:
            raise self._gave_up(attempts, started, failures, over.delay) from None

    async def sample_stream(
        self, request: SampleRequest
    ) -> AsyncIterator[tuple[list[int], list[float]] | SampleResult]:
        """The :class:`~rllm_core.ports.StreamingSampler` port: the completion streamed from
        the worker :meth:`sample` would pick, ``(token_ids, logprobs)`` as the worker sends
        them, then the whole :class:`SampleResult`.

        Retries work as in :meth:`sample` until the first token: a request the worker does
        not answer with a stream (a connection error, an error status, no healthy worker) is
        served by :meth:`sample` instead, as one piece. A stream that breaks off after tokens
        were handed out raises :class:`~rllm_core.errors.UpstreamError`.
        """
        if self._closed:
            raise UpstreamError("the worker pool is closed")
        self._ensure_health_checks()
        key = routing_key.get() or request.request_id or None
        worker = self._pick(key)
        if worker is None or worker.restoring is not None:
            result = await self.sample(request)
            yield result.completion_token_ids, result.logprobs
            yield result
            return
        policy = self._policy
        headers = self._headers
        if request.request_id:
            headers = {**headers, "x-request-id": request.request_id}
        body = completion_body(request, model=policy.model, stream=True)
        ids: list[int] = []
        values: list[float] = []
        finish: str | None = None
        version: int | None = None
        streamed = False
        cut = False
        call = worker.enter(asyncio.current_task())
        try:
            async with self._client.stream(
                "POST",
                worker.origin,
                self.completions_path,
                body=body,
                headers=headers,
                timeout_s=self.request_timeout_s,
            ) as response:
                call.stream = response
                if response.status == 200:
                    streamed = True
                    async for chunk in _sse_chunks(worker, response):
                        piece_ids, piece_values = _choice_tokens(worker, chunk.choices[0])
                        finish = chunk.choices[0].finish_reason or finish
                        if chunk.weight_version is not None:
                            version = chunk.weight_version
                        if piece_ids:
                            ids += piece_ids
                            values += piece_values
                            # While the reader has the tokens, its task is doing other
                            # work: cut must not cancel it then.
                            call.task = None
                            yield piece_ids, piece_values
                            if call.cut:
                                raise _Cut(worker.url)
                            call.task = asyncio.current_task()
        except asyncio.CancelledError:
            if not _was_cut(call):
                raise
            cut = True
        except _Cut:
            cut = True
        except (HttpConnectError, HttpProtocolError) as exc:
            if ids:
                worker.failures += 1
                worker.last_error = str(exc)
                raise UpstreamError(
                    f"worker {worker.url} broke off a streamed completion after"
                    f" {len(ids)} tokens: {exc}"
                ) from None
            self._mark_down(worker, str(exc))
            streamed = False
        except TimeoutError:
            worker.failures += 1
            raise UpstreamTimeoutError(
                f"worker {worker.url} did not finish streaming within {self.request_timeout_s}s;"
                " raise request_timeout_s for long generations, or check the worker"
            ) from None
        finally:
            worker.leave(call)
        if cut:
            if ids:
                raise UpstreamError(
                    f"worker {worker.url} was cut (its server was lent away) after streaming"
                    f" {len(ids)} tokens; a started stream cannot be sent again"
                )
            streamed = False
        if not streamed:
            result = await self.sample(request)
            yield result.completion_token_ids, result.logprobs
            yield result
            return
        if finish not in ("stop", "length"):
            raise UpstreamError(
                f"worker {worker.url} ended a streamed completion with finish reason"
                f" {finish!r}, expected 'stop' or 'length'"
            )
        worker.served += 1
        if version is not None and version > self.weight_version:
            self.weight_version = version
        yield SampleResult(
            completion_token_ids=ids,
            logprobs=values,
            finish_reason=finish,  # type: ignore[arg-type]
            weight_version=policy.version if version is None else version,
        )

    async def _worker_for(self, key: str | None, since: float) -> _Worker:
        """The worker for ``key``, waiting for one to come back within the retry budget
        counted from ``since`` (the request's first failure)."""
        loop = asyncio.get_running_loop()
        while True:
            worker = self._pick(key)
            if worker is not None:
                return worker
            remaining = since + self.retry_budget_s - loop.time()
            if remaining <= 0:
                raise self._unavailable(since)
            await self._wait_for_health(remaining)

    async def _post(
        self, worker: _Worker, body: bytes, headers: dict[str, str], policy: Policy
    ) -> SampleResult:
        """One completion request to ``worker``; :class:`_AttemptFailed` when it may be
        retried, :class:`_ModelMissing` when the worker lost the model ``policy`` names,
        :class:`_Cut` when :meth:`cut` ended it."""
        call = worker.enter(asyncio.current_task())
        try:
            response = await self._client.request(
                "POST",
                worker.origin,
                self.completions_path,
                body=body,
                headers=headers,
                timeout_s=self.request_timeout_s,
            )
        except asyncio.CancelledError:
            if _was_cut(call):
                raise _Cut(worker.url) from None
            raise
        except (HttpConnectError, HttpProtocolError) as exc:
            self._mark_down(worker, str(exc))
            raise _AttemptFailed(f"{worker.url}: {exc}", moved=True) from None
        except TimeoutError:
            worker.failures += 1
            raise UpstreamTimeoutError(
                f"worker {worker.url} did not answer within {self.request_timeout_s}s;"
                " raise request_timeout_s for long generations, or check the worker"
            ) from None
        finally:
            worker.leave(call)
        if response.status == 200:
            worker.served += 1
            return self._result(worker, response, policy)
        detail = _error_detail(response)
        worker.failures += 1
        worker.last_error = f"HTTP {response.status}: {detail}"
        if (
            response.status == 404
            and "does not exist" in detail
            and policy.model not in (None, self.model)
            and self.holds_weights()
        ):
            raise _ModelMissing(f"{worker.url}: HTTP 404: {detail}")
        if response.status != 429 and response.status < 500:
            raise UpstreamRejectedError(
                f"worker {worker.url} rejected the request with HTTP {response.status}: {detail}",
                status=response.status,
                detail=detail,
            )
        raise _AttemptFailed(
            f"{worker.url}: HTTP {response.status}: {detail}",
            retry_after=parse_retry_after(response.headers.get("retry-after")),
        )

    def _next_wait(self, error: BaseException) -> float | None:
        """The wait before retrying after ``error``: the worker's ``Retry-After``; none after a
        connection error while another worker is up; else ``None`` (the jittered backoff)."""
        if not isinstance(error, _AttemptFailed):
            return None
        if error.retry_after is not None:
            return error.retry_after
        if error.moved and any(w.routable for w in self._workers):
            return 0.0
        return None

    def _gave_up(
        self, attempts: int, started: float, failures: list[str], delay: float | None
    ) -> UpstreamError:
        elapsed = asyncio.get_running_loop().time() - started
        limits = f"retries={self.retry.retries}, retry_budget_s={self.retry_budget_s}"
        if delay is not None:
            limits += f", next wait {delay:.1f}s"
        return UpstreamError(
            f"gave up after {attempts} attempt(s) in {elapsed:.1f}s ({limits}): "
            + "; ".join(failures[-3:])
        )

    # ---------------------------------------------------------------- routing

    def _pick(self, key: str | None) -> _Worker | None:
        sticky = self._sticky
        if key is not None:
            worker = sticky.get(key)
            if worker is not None:
                if worker.routable:
                    sticky.move_to_end(key)
                    return worker
                del sticky[key]
                worker.sessions -= 1
        best = None
        for worker in self._workers:
            if worker.routable and (
                best is None
                or (worker.in_flight, worker.sessions) < (best.in_flight, best.sessions)
            ):
                best = worker
        if best is not None and key is not None:
            sticky[key] = best
            best.sessions += 1
            if len(sticky) > self.max_sticky_sessions:
                _, evicted = sticky.popitem(last=False)
                evicted.sessions -= 1
        return best

    def _mark_down(self, worker: _Worker, error: str) -> None:
        worker.failures += 1
        worker.last_error = error
        if worker.healthy:
            worker.healthy = False
            log.warning("upstream worker %s is down: %s", worker.url, error)

    def _unavailable(self, started: float) -> UpstreamUnavailableError:
        waited = asyncio.get_running_loop().time() - started
        states = "; ".join(
            f"{w.url} ({'drained' if w.drained else w.last_error or 'not answering'})"
            for w in self._workers
        )
        return UpstreamUnavailableError(
            f"no upstream worker is reachable after {waited:.1f}s: {states};"
            " start the workers, or fix the sampler's urls (--upstream of gateway serve)"
        )

    def _result(self, worker: _Worker, response: HttpResponse, policy: Policy) -> SampleResult:
        try:
            body = _response_decoder.decode(response.body)
        except msgspec.DecodeError as exc:
            raise UpstreamError(
                f"worker {worker.url} answered with an unreadable completion: {exc}"
            ) from None
        if len(body.choices) != 1:
            raise UpstreamError(
                f"worker {worker.url} answered with {len(body.choices)} choices, expected 1"
            )
        choice = body.choices[0]
        logprobs = choice.logprobs
        ids = choice.token_ids
        if ids is None and logprobs is not None and logprobs.tokens:
            try:
                ids = [int(token.rpartition("token_id:")[2]) for token in logprobs.tokens]
            except ValueError:
                ids = None
        if ids is None:
            raise UpstreamError(
                f"worker {worker.url} returned no completion token ids; it must support"
                " return_token_ids or return_tokens_as_token_ids (vLLM does)"
            )
        values = logprobs.token_logprobs if logprobs is not None else []
        if len(values) != len(ids) or None in values:
            raise UpstreamError(
                f"worker {worker.url} returned {len(ids)} token ids but {len(values)} logprobs;"
                " it must honour logprobs=0"
            )
        if choice.finish_reason not in ("stop", "length"):
            raise UpstreamError(
                f"worker {worker.url} finished the completion with"
                f" {choice.finish_reason!r}, expected 'stop' or 'length'"
            )
        version = body.weight_version
        if version is not None and version > self.weight_version:
            self.weight_version = version
        return SampleResult(
            completion_token_ids=ids,
            logprobs=values,  # type: ignore[arg-type]
            finish_reason=choice.finish_reason,  # type: ignore[arg-type]
            weight_version=policy.version if version is None else version,
        )

    # ---------------------------------------------------------------- lending a server

    def _worker_at(self, url: str) -> _Worker:
        wanted = url.rstrip("/")
        for worker in self._workers:
            if worker.url == wanted:
                return worker
        urls = ", ".join(w.url for w in self._workers)
        raise KeyError(f"{url!r} is not a worker of this pool; its workers are {urls}")

    def drain(self, url: str) -> None:
        """Send no new request to the worker at ``url``; see
        :class:`~rllm_core.ports.DrainablePool`."""
        worker = self._worker_at(url)
        if not worker.drained:
            worker.drained = True
            log.info("upstream worker %s is drained (%d requests running)", url, worker.in_flight)

    def in_flight(self, url: str) -> int:
        """How many requests run on the worker at ``url`` now."""
        return self._worker_at(url).in_flight

    async def cut(self, url: str) -> int:
        """End the requests running on the worker at ``url`` and return how many, once they
        have left it; see :class:`~rllm_core.ports.DrainablePool`. Meant for a drained
        worker: a plain request is sent again to whichever worker routing picks, which on a
        worker still routable may be the same one."""
        worker = self._worker_at(url)
        loop = asyncio.get_running_loop()
        ending: list[asyncio.Future[None]] = []
        count = 0
        for call in list(worker.calls):
            if call.cut:  # a cut already under way
                if call.ended is not None:
                    ending.append(call.ended)
                continue
            call.cut = True
            count += 1
            task = call.task
            if task is None or task.done():
                # A stream whose reader has its tokens: it fails when read again.
                if call.stream is not None:
                    call.stream.abort()
                worker.leave(call)
                continue
            call.cancelled = True
            call.ended = loop.create_future()
            ending.append(call.ended)
            task.cancel()
        if ending:
            await asyncio.gather(*ending)
        if count:
            log.warning("cut %d requests running on upstream worker %s", count, url)
        return count

    def admit(self, url: str) -> None:
        """Route requests to the worker at ``url`` again; see
        :class:`~rllm_core.ports.DrainablePool`."""
        worker = self._worker_at(url)
        if not worker.drained:
            return
        worker.drained = False
        log.info("upstream worker %s is admitted again", url)
        if worker.healthy and self._health_changed is not None:
            self._health_changed.set()
            self._health_changed = None

    # ---------------------------------------------------------------- health

    def status(self) -> list[WorkerStatus]:
        """Every worker's health, load and last error."""
        return [
            WorkerStatus(
                url=w.url,
                healthy=w.routable,
                in_flight=w.in_flight,
                sessions=w.sessions,
                served=w.served,
                failures=w.failures,
                last_error="drained" if w.drained else w.last_error,
            )
            for w in self._workers
        ]

    async def check_health(self) -> None:
        """Probe every worker once and update its state."""
        results = await asyncio.gather(*(self._probe(w) for w in self._workers))
        changed = False
        for worker, error in zip(self._workers, results, strict=True):
            if error is None and not worker.healthy and self.holds_weights():
                if worker.drained:
                    continue  # given its weights once admitted, not while lent away
                error = await self._restore_worker(worker)
            if error is None:
                if not worker.healthy:
                    log.warning("upstream worker %s is back", worker.url)
                    changed = changed or not worker.drained
                worker.healthy = True
            elif worker.healthy:
                self._mark_down(worker, error)
            else:
                worker.last_error = error
        if changed and self._health_changed is not None:
            self._health_changed.set()
            self._health_changed = None

    async def _probe(self, worker: _Worker) -> str | None:
        try:
            response = await self._client.request(
                "GET",
                worker.origin,
                self.health_path,
                headers=self._headers,
                timeout_s=max(self.health_interval_s, 1.0),
            )
        except (HttpConnectError, HttpProtocolError, TimeoutError) as exc:
            return str(exc) or type(exc).__name__
        if response.status != 200:
            return f"health check answered HTTP {response.status}"
        return None

    async def _wait_for_health(self, timeout: float) -> None:
        """Wait until a health check brings a worker back, at most ``timeout`` seconds."""
        if self._health_task is None:
            interval = max(self.retry.retry_backoff_s, _MIN_PROBE_INTERVAL_S)
            await asyncio.sleep(min(timeout, interval))
            await self.check_health()
            return
        if self._health_changed is None:
            self._health_changed = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(min(timeout, self.health_interval_s)):
                await self._health_changed.wait()

    def _ensure_health_checks(self) -> None:
        if self._health_task is None and self.health_interval_s > 0:
            self._health_task = asyncio.get_running_loop().create_task(self._health_loop())

    async def _health_loop(self) -> None:
        while True:
            try:
                await self.check_health()
            except Exception:  # a probe bug must not end health checking
                log.exception("upstream health check failed")
            await asyncio.sleep(self.health_interval_s)

    async def start(self) -> None:
        """Probe every worker now and keep checking in the background."""
        await self.check_health()
        self._ensure_health_checks()

    async def aclose(self) -> None:
        """Stop health checks and close connections. Idempotent."""
        self._closed = True
        task, self._health_task = self._health_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._client.aclose()


async def _sse_chunks(worker: _Worker, response: HttpStream) -> AsyncIterator[_ResponseBody]:
    """The completion chunks of a worker's event stream, up to ``[DONE]``."""
    buffer = b""
    async for piece in response.pieces():
        buffer += piece
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            for line in event.splitlines():
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                try:
                    chunk = _chunk_decoder.decode(data)
                except msgspec.DecodeError as exc:
                    message = _stream_error(data)
                    if message is not None:
                        raise UpstreamError(
                            f"worker {worker.url} reported an error mid-stream: {message}"
                        ) from None
                    raise UpstreamError(
                        f"worker {worker.url} streamed an unreadable completion chunk: {exc}"
                    ) from None
                if len(chunk.choices) == 1:
                    yield chunk
                elif chunk.choices:
                    raise UpstreamError(
                        f"worker {worker.url} streamed {len(chunk.choices)} choices, expected 1"
                    )


def _was_cut(call: _Call) -> bool:
    """Whether the cancellation that just reached ``call`` came from :meth:`HttpWorkerPool.cut`;
    it is then taken back, unless the task is being cancelled from elsewhere too."""
    if not call.cancelled:
        return False
    call.cancelled = False
    task = asyncio.current_task()
    return task is not None and task.uncancel() == 0


def _stream_error(data: bytes) -> str | None:
    """The message of an ``{"error": ...}`` event (vLLM sends one when a stream fails after it
    started), else ``None``."""
    try:
        body = _error_decoder.decode(data)
    except msgspec.DecodeError:
        return None
    if isinstance(body.error, dict):
        return str(body.error.get("message") or body.error)
    return str(body.error) if body.error else None


def _choice_tokens(worker: _Worker, choice: _Choice) -> tuple[list[int], list[float]]:
    """The token ids and logprobs one streamed choice carries."""
    logprobs = choice.logprobs
    ids = choice.token_ids
    if ids is None and logprobs is not None:
        try:
            ids = [int(token.rpartition("token_id:")[2]) for token in logprobs.tokens]
        except ValueError:
            ids = None
    if ids is None:
        raise UpstreamError(
            f"worker {worker.url} streamed no completion token ids; it must support"
            " return_token_ids or return_tokens_as_token_ids (vLLM does)"
        )
    values = logprobs.token_logprobs if logprobs is not None else []
    if len(values) != len(ids) or None in values:
        raise UpstreamError(
            f"worker {worker.url} streamed {len(ids)} token ids but {len(values)} logprobs;"
            " it must honour logprobs=0"
        )
    return ids, values  # type: ignore[return-value]
