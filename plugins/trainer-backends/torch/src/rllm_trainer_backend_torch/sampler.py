"""The torch backend's sampler: continuous batching over a slot KV cache.

One decode thread owns the model while there is work; it ends after a short idle spell and
the next request starts another. Callers (any number of asyncio tasks, on any loops, or
threads through :meth:`TorchSampler.sample_many`) enqueue requests and wait on futures the
thread settles. Between decode steps the thread admits queued requests into free slots:
each distinct prompt runs through the model alone (so its prompt states are exactly those of
a lone forward pass, with logits for the last position only, whatever else arrived with it;
with prefix reuse on, only its part after a stored start runs);
newcomers with the same prompt, like the rollouts of one group, share that forward and get
copies of its cache. From then on each decodes in the shared batch, one token per row per
step. A row that finishes frees its slot at once. A streamed request also hands each token to its
caller's loop as soon as it is chosen.

Weights: a sequence takes the gate's shared access when it is admitted and gives it back when
it finishes, so every token of a completion comes from the version read at admission, which
is the version reported. While the trainer holds or waits for exclusive access, no sequence
is admitted; sequences already decoding run to their end.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import random
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from rllm_core.errors import UpstreamRejectedError
from rllm_core.types import SampleRequest, SampleResult

from rllm_trainer_backend_torch.gate import WeightGate
from rllm_trainer_backend_torch.kv_cache import SlotKVCache
from rllm_trainer_backend_torch.loading import release_free_memory
from rllm_trainer_backend_torch.prefix_cache import PrefixCache, PrefixHit
from rllm_trainer_backend_torch.token_choice import choose_tokens

__all__ = ["TorchSampler"]

_IDLE_GATE_WAIT_S = 0.05
"""How often an idle decode thread blocked by the trainer rechecks for close()."""

_IDLE_EXIT_S = 0.2
"""An idle decode thread ends after this long. While it lives, its OpenMP worker threads
count against the cores, and GNU OpenMP shortens its spin-waits once its threads outnumber
them: a train step on 2 cores took 12 s beside an idle sampler thread and 9 s without one."""


@dataclass(eq=False)
class _Job:
    """A validated request waiting for a slot."""

    prompt: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    stop: frozenset[int]
    seed: int
    deliver: Callable[[SampleResult | BaseException], None]
    abandoned: Callable[[], bool]
    stream: Callable[[int, float], None] | None = None


@dataclass(eq=False)
class _Row:
    """An admitted sequence; ``length`` is how many of its positions the cache holds."""

    job: _Job
    version: int
    random: random.Random
    length: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class TorchSampler:
    """Batched sampling from an in-process Hugging Face causal LM (plain or peft-wrapped).

    Implements the :class:`~rllm_core.ports.training.Sampler` port and its
    :class:`~rllm_core.ports.training.StreamingSampler` extension. Behaviour:

    - ``temperature`` 0 is greedy: the argmax token, whose logprob is reported under the
      untempered softmax. Otherwise the logprob is under ``softmax(logits / temperature)``,
      before top-p truncation.
    - A stop token ends the completion and is included in it (``finish_reason="stop"``);
      otherwise it runs to ``max_tokens`` (``"length"``). With no ``stop_token_ids`` the
      sampler stops on none, not even the model's end-of-sequence token: the caller (the
      gateway) passes the renderer's stop ids.
    - Context: prompt plus completion fit in ``max_seq_len`` (default: the model's
      ``max_position_embeddings``). ``max_tokens`` beyond that is clipped, and the completion
      then ends with ``"length"``; a prompt that leaves no room raises
      :class:`~rllm_core.errors.UpstreamRejectedError` (status 400), as a model server
      refuses it, so that the gateway answers ``upstream_rejected``.
    - Seeds: each row draws one uniform number per sampled token from its own
      ``random.Random`` seeded with the request's ``seed`` (a random one when absent), so its
      draws never depend on other requests. Repeating a seeded request with the same batch
      composition (the same requests admitted at the same steps, e.g. alone) reproduces it
      exactly. Under another composition the model's arithmetic runs at another batch shape,
      so logits can differ in the last bits: the tokens match unless such a difference moves
      a draw across a token boundary (rare), and the logprobs agree to rounding. Either way
      the weights must be the same version.
    - Invalid requests (a token id outside ``[0, vocab)``, an empty prompt, ``max_tokens``
      below 1, a negative temperature, ``top_p`` outside ``(0, 1]``) raise ``ValueError`` in
      the caller before anything is queued.
    - An exception while decoding fails exactly the requests it touched (a prefill: the
      requests sharing that prompt; a batched step: every row in it) with that exception;
      the sampler goes on serving the rest of the queue.
    - ``sample_stream`` samples exactly as ``sample`` does (same admission, batching and
      seeds); it only also hands out each token as it is chosen. A caller that stops waiting
      (a cancelled ``sample``, a closed ``sample_stream``) abandons its request: a queued one
      is never started, a decoding one leaves the batch at the next step.

    ``busy_seconds`` (the :class:`~rllm_core.ports.training.BusyClock` extension) sums the wall
    time of every prefill and decode step, token choice included.

    The model is called under ``torch.inference_mode()`` with its train/eval mode untouched;
    the trainer keeps it in eval mode outside ``gate.exclusive()``. Memory for the KV cache
    grows on demand up to ``max_batch_size`` slots of ``max_seq_len`` positions and is kept
    for reuse. Call :meth:`close` to stop the decode thread.

    Prefix reuse (``prefix_cache_bytes`` > 0): finished sequences keep their keys and values,
    up to that many bytes (least recently used dropped first), and a prompt that begins with
    one, like the next turn of a multi-turn episode, runs only its remaining tokens through
    the model. Its prompt states then come from two forwards instead of one, so its logprobs
    agree with a lone forward's to rounding, not bit for bit. Stored prefixes belong to one
    weight version and are dropped when the trainer takes the weights.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        gate: WeightGate,
        device: torch.device | str = "cpu",
        max_batch_size: int = 32,
        max_seq_len: int | None = None,
        prefix_cache_bytes: int = 0,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        embeddings = model.get_input_embeddings()
        self._vocab_size = int(embeddings.weight.shape[0])
        self._dtype = embeddings.weight.dtype
        if max_seq_len is None:
            max_seq_len = getattr(model.config, "max_position_embeddings", None)
            if max_seq_len is None:
                raise ValueError(
                    f"{type(model).__name__}'s config has no max_position_embeddings; pass"
                    " max_seq_len to TorchSampler"
                )
        if max_seq_len < 2:
            raise ValueError(f"max_seq_len must be at least 2, got {max_seq_len}")
        self._model = model
        self._gate = gate
        self._device = torch.device(device)
        self._max_batch = max_batch_size
        self._max_seq_len = int(max_seq_len)
        self._cache = SlotKVCache(max_batch_size, self._max_seq_len)
        self._prefixes = PrefixCache(prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        self._rows: list[_Row] = []
        self._seeds = random.Random()
        self._pending: deque[_Job] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._busy_s = 0.0
        self._thread: threading.Thread | None = None

    # ----------------------------------------------------------------------------------------
    # Public API
    # ----------------------------------------------------------------------------------------

    @property
    def weight_version(self) -> int:
        """The newest published weight version (a new request samples from it)."""
        return self._gate.version

    @property
    def busy_seconds(self) -> float:
        """Wall seconds spent on prefill and decode steps since the sampler started."""
        return self._busy_s

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def max_seq_len(self) -> int:
        return self._max_seq_len

    async def sample(self, request: SampleRequest) -> SampleResult:
        """Queue ``request`` and wait for its completion; see the class docstring."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[SampleResult] = loop.create_future()

        def deliver(outcome: SampleResult | BaseException) -> None:
            # A closed loop raises RuntimeError: its caller is gone, nobody is waiting.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, future, outcome)

        self._submit([self._job(request, deliver, future.done)])
        return await future

    async def sample_stream(
        self, request: SampleRequest
    ) -> AsyncIterator[tuple[list[int], list[float]] | SampleResult]:
        """Queue ``request`` and yield ``(token_ids, logprobs)`` as the tokens are chosen (all
        chosen since the previous read, at least one), then the :class:`SampleResult`; see the
        :class:`~rllm_core.ports.training.StreamingSampler` port.

        The tokens, logprobs and result are those :meth:`sample` gives. Errors are raised
        from the iterator, after the tokens chosen before them. Closing the iterator early
        abandons the request and frees its slot.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[int, float] | SampleResult | BaseException] = asyncio.Queue()
        left = False

        def put(item: tuple[int, float] | SampleResult | BaseException) -> None:
            # A closed loop raises RuntimeError: its caller is gone, nobody is waiting.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(queue.put_nowait, item)

        def token(token_id: int, logprob: float) -> None:
            if not left:
                put((token_id, logprob))

        job = self._job(request, put, lambda: left)
        job.stream = token
        self._submit([job])
        try:
            item = await queue.get()
            while True:
                if isinstance(item, SampleResult):
                    yield item
                    return
                if isinstance(item, BaseException):
                    raise item
                ids, logprobs = [item[0]], [item[1]]
                item = None
                while not queue.empty():
                    item = queue.get_nowait()
                    if not isinstance(item, tuple):
                        break
                    ids.append(item[0])
                    logprobs.append(item[1])
                    item = None
                yield ids, logprobs
                if item is None:
                    item = await queue.get()
        finally:
            left = True

    def sample_many(self, requests: Sequence[SampleRequest]) -> list[SampleResult]:
        """Sample every request concurrently from a thread; results in request order.

        All requests are queued at once, so they are admitted together as slots allow. The
        first failure is raised after every request has finished.
        """
        futures = [concurrent.futures.Future() for _ in requests]
        jobs = [
            self._job(request, _settler(future), lambda: False)
            for request, future in zip(requests, futures, strict=True)
        ]
        self._submit(jobs)
        concurrent.futures.wait(futures)
        return [future.result() for future in futures]

    def drop_prefixes(self) -> None:
        """Forget every stored prefix (call it holding the gate's exclusive access, as the
        trainer does before a pass over a batch: no sequence decodes then)."""
        if self._prefixes is not None:
            self._prefixes.clear()

    def close(self) -> None:
        """Stop the decode thread; queued and running requests fail. Idempotent."""
        with self._cond:
            self._closed = True
            thread = self._thread
            self._cond.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        self.drop_prefixes()

    # ----------------------------------------------------------------------------------------
    # Caller side
    # ----------------------------------------------------------------------------------------

    def _job(
        self,
        request: SampleRequest,
        deliver: Callable[[SampleResult | BaseException], None],
        abandoned: Callable[[], bool],
    ) -> _Job:
        prompt = list(request.prompt_token_ids)
        params = request.params
        if not prompt:
            raise ValueError("the prompt is empty: a request needs at least one token id")
        low, high = min(prompt), max(prompt)
        if low < 0 or high >= self._vocab_size:
            bad = low if low < 0 else high
            raise ValueError(
                f"token id {bad} is outside the vocabulary of {self._vocab_size} ids"
                f" (valid: 0..{self._vocab_size - 1}); check the tokenizer matches the model"
            )
        if params.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {params.max_tokens}")
        if not (params.temperature >= 0.0 and math.isfinite(params.temperature)):
            raise ValueError(f"temperature must be finite and >= 0, got {params.temperature}")
        if not 0.0 < params.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {params.top_p}")
        room = self._max_seq_len - len(prompt)
        if room < 1:
            # What a model server answers with 400: the gateway passes it on as
            # upstream_rejected, which clients and harnesses read as a context overflow.
            message = (
                f"the prompt has {len(prompt)} tokens but the context holds {self._max_seq_len}"
                " (prompt and completion together); shorten the prompt"
            )
            raise UpstreamRejectedError(message, status=400, detail=message)
        seed = params.seed if params.seed is not None else self._seeds.getrandbits(64)
        return _Job(
            prompt=prompt,
            max_tokens=min(params.max_tokens, room),
            temperature=float(params.temperature),
            top_p=float(params.top_p),
            stop=frozenset(params.stop_token_ids),
            seed=seed,
            deliver=deliver,
            abandoned=abandoned,
        )

    def _submit(self, jobs: list[_Job]) -> None:
        with self._cond:
            if self._closed:
                raise RuntimeError("TorchSampler is closed; create a new one to sample")
            self._pending.extend(jobs)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="rllm-torch-sampler", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    # ----------------------------------------------------------------------------------------
    # Decode thread
    # ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                try:
                    admitted = self._admit()
                    if admitted is None:
                        return
                    if not admitted:
                        break
                    if self._rows:
                        started = time.perf_counter()
                        self._step()
                        self._busy_s += time.perf_counter() - started
                except Exception as exc:
                    # Forwards fail their own rows; this is a fault in the bookkeeping around
                    # them. Failing what is in flight keeps callers from waiting forever.
                    self._fail_rows(exc)
        closed = RuntimeError("TorchSampler was closed before this request finished")
        self._fail_rows(closed)
        with self._cond:
            pending, self._pending = list(self._pending), deque()
        for job in pending:
            job.deliver(closed)

    def _admit(self) -> bool | None:
        """Start queued jobs while slots are free; False once closed, ``None`` when the
        thread should end because it has been idle for ``_IDLE_EXIT_S``.

        Blocks while there is nothing to do. While the trainer holds or wants the weights,
        admits nothing: with rows decoding it returns to them, otherwise it waits for the
        trainer.
        """
        while True:
            with self._cond:
                idle = False
                while not self._closed and not self._pending and not self._rows:
                    if not self._cond.wait(timeout=_IDLE_EXIT_S) and not self._pending:
                        # Nothing decodes, so the cache goes: its memory (189 MB for the
                        # quickstart's 64 slots) would otherwise sit through the train step.
                        # The next request allocates it again and starts a new thread (see
                        # _submit).
                        self._cache.release()
                        self._thread = None
                        idle = True
                        break
                if idle:
                    break
                if self._closed:
                    return False
                if not self._pending or len(self._rows) >= self._max_batch:
                    return True
            claimed = self._claim()
            if claimed:
                started = time.perf_counter()
                self._start(claimed)
                self._busy_s += time.perf_counter() - started
            elif self._rows:
                return True
        release_free_memory()
        return None

    def _claim(self) -> list[tuple[_Job, int]]:
        """Take queued jobs while slots are free, each with shared access to the weights.

        Fewer, possibly none, when the trainer holds or wants the weights (with nothing
        decoding, waits ``_IDLE_GATE_WAIT_S`` for it first).
        """
        claimed: list[tuple[_Job, int]] = []
        while len(self._rows) + len(claimed) < self._max_batch:
            with self._cond:
                if not self._pending:
                    break
                job = self._pending[0]
            if job.abandoned():
                self._pop(job)
                continue
            version = self._gate.try_acquire_shared()
            if version is None:
                if self._prefixes is not None:
                    # The trainer is about to change the weights: stored prefixes go stale.
                    self._prefixes.clear()
                if claimed or self._rows:
                    break
                try:
                    version = self._gate.acquire_shared(timeout=_IDLE_GATE_WAIT_S)
                except TimeoutError:
                    break
            self._pop(job)
            claimed.append((job, version))
        return claimed

    def _pop(self, job: _Job) -> None:
        with self._cond:
            if self._pending and self._pending[0] is job:
                self._pending.popleft()

    def _start(self, claimed: list[tuple[_Job, int]]) -> None:
        """Prefill the claimed jobs into the next free slots and choose their first tokens.

        Each distinct prompt runs through the model once, alone; the jobs that share it (a
        group's rollouts) share that forward: its cache is copied into their slots and its
        last logits give each job its own first draw.
        """
        by_prompt: dict[tuple[int, ...], list[tuple[_Job, int]]] = {}
        for job, version in claimed:
            by_prompt.setdefault(tuple(job.prompt), []).append((job, version))
        for same in by_prompt.values():
            self._prefill(same)

    def _prefill(self, same: list[tuple[_Job, int]]) -> None:
        """One lone forward over the prompt the jobs of ``same`` share, or over its part
        after the longest start the prefix cache holds for their weight version."""
        prompt = same[0][0].prompt
        version = same[0][1]
        first = len(self._rows)
        rows = [
            _Row(job=job, version=version, random=random.Random(job.seed), length=len(prompt))
            for job, version in same
        ]
        try:
            self._cache.reserve(first + len(same), max(len(prompt) + j.max_tokens for j, _ in same))
            hit = self._prefixes.lookup(prompt, version) if self._prefixes is not None else None
            output = self._forward_prompt(first, prompt, hit)
            self._cache.end()
            for offset in range(1, len(same)):
                self._cache.move(first, first + offset, len(prompt))
            self._accept(rows, output.logits[:, -1].expand(len(same), -1))
        except Exception as exc:
            self._cache.end()
            for job, _ in same:
                self._gate.release_shared()
                job.deliver(exc)
            return
        self._rows.extend(rows)
        self._retire([first + i for i, row in enumerate(rows) if self._finished(row)])

    def _forward_prompt(self, slot: int, prompt: list[int], hit: PrefixHit | None) -> Any:
        if hit is None:
            self._cache.begin_prefill(slot, len(prompt))
            ids = torch.tensor([prompt], dtype=torch.long, device=self._device)
            positions = torch.arange(len(prompt), device=self._device)[None]
            return self._model(
                input_ids=ids, position_ids=positions, cache=self._cache, logits_to_keep=1
            )
        start, rest = hit.length, len(prompt) - hit.length
        self._cache.load(slot, hit.keys, hit.values, start)
        self._cache.begin_extend(slot, start, rest)
        ids = torch.tensor([prompt[start:]], dtype=torch.long, device=self._device)
        positions = torch.arange(start, len(prompt), device=self._device)
        visible = torch.arange(len(prompt), device=self._device)[None, :] <= positions[:, None]
        mask = torch.zeros(visible.shape, dtype=self._dtype, device=self._device)
        mask.masked_fill_(~visible, torch.finfo(self._dtype).min)
        return self._model(
            input_ids=ids,
            position_ids=positions[None],
            attention_mask=mask[None, None],
            cache=self._cache,
            logits_to_keep=1,
        )

    def _step(self) -> None:
        """Feed every row its last token and choose the next one."""
        rows = self._rows
        lengths = [row.length for row in rows]
        try:
            positions = torch.tensor(lengths, dtype=torch.long, device=self._device)
            kv_len = max(lengths) + 1
            visible = torch.arange(kv_len, device=self._device)[None, :] <= positions[:, None]
            mask = torch.zeros(visible.shape, dtype=self._dtype, device=self._device)
            mask.masked_fill_(~visible, torch.finfo(self._dtype).min)
            ids = torch.tensor(
                [row.tokens[-1] for row in rows], dtype=torch.long, device=self._device
            )
            self._cache.begin_decode(len(rows), positions, kv_len)
            output = self._model(
                input_ids=ids[:, None],
                position_ids=positions[:, None],
                attention_mask=mask[:, None, None, :],
                cache=self._cache,
            )
            self._cache.end()
            for row in rows:
                row.length += 1
            self._accept(rows, output.logits[:, -1])
        except Exception as exc:
            self._cache.end()
            self._fail_rows(exc)
            return
        self._retire([i for i, row in enumerate(rows) if self._finished(row)])

    def _accept(self, rows: list[_Row], logits: torch.Tensor) -> None:
        """Choose each row's next token from its ``logits`` row and append it."""
        jobs = [row.job for row in rows]
        token_ids, logprobs = choose_tokens(
            logits,
            [job.temperature for job in jobs],
            [job.top_p for job in jobs],
            [row.random.random() if row.job.temperature > 0 else 0.0 for row in rows],
        )
        for row, token, logprob in zip(rows, token_ids.tolist(), logprobs.tolist(), strict=True):
            row.tokens.append(token)
            row.logprobs.append(logprob)
            if row.job.stream is not None:
                row.job.stream(token, logprob)

    def _fail_rows(self, exc: BaseException) -> None:
        rows, self._rows = self._rows, []
        for row in rows:
            self._gate.release_shared()
            row.job.deliver(exc)

    def _finished(self, row: _Row) -> bool:
        return (
            row.tokens[-1] in row.job.stop
            or len(row.tokens) >= row.job.max_tokens
            or row.job.abandoned()
        )

    def _retire(self, indices: list[int]) -> None:
        """Finish the rows at ``indices``, keeping the live rows packed in slots ``0..n-1``."""
        rows = self._rows
        for index in sorted(indices, reverse=True):
            row = rows[index]
            if self._prefixes is not None and not row.job.abandoned():
                keys, values = self._cache.snapshot(index, row.length)
                held = (row.job.prompt + row.tokens)[: row.length]
                self._prefixes.put(held, row.version, keys, values)
            last = len(rows) - 1
            if index != last:
                self._cache.move(last, index, rows[last].length)
                rows[index] = rows[last]
            rows.pop()
            self._gate.release_shared()
            if not row.job.abandoned():
                stopped = row.tokens[-1] in row.job.stop
                row.job.deliver(
                    SampleResult(
                        completion_token_ids=row.tokens,
                        logprobs=row.logprobs,
                        finish_reason="stop" if stopped else "length",
                        weight_version=row.version,
                    )
                )


def _settle(future: asyncio.Future, outcome: SampleResult | BaseException) -> None:
    if future.done():
        return
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


def _settler(
    future: concurrent.futures.Future,
) -> Callable[[SampleResult | BaseException], None]:
    def deliver(outcome: SampleResult | BaseException) -> None:
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    return deliver
