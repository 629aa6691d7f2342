"""Contracts for sampling and training backends."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from rllm_core.types import Datum, ExportedWeights, SampleRequest, SampleResult, WorkerStatus

if TYPE_CHECKING:
    from rllm_core.algorithms.native_losses import LossRoute
    from rllm_core.algorithms.objective import Objective

__all__ = [
    "BusyClock",
    "LogprobScorer",
    "LossRouting",
    "NumericsReport",
    "ParallelSettings",
    "ParallelTrainer",
    "PolicyFollower",
    "ReferenceScorer",
    "Sampler",
    "SharedPool",
    "StreamingSampler",
    "SupervisedTrainer",
    "SyncCounters",
    "TrainerBackend",
    "WeightExporter",
    "WeightReleaser",
    "WorkerPool",
]


@runtime_checkable
class Sampler(Protocol):
    """Token ids in, token ids and per-token logprobs out.

    Contract:

    - ``sample`` is safe to call concurrently; a backend may batch concurrent requests.
    - The result's ``logprobs[i]`` is the logprob the sampling distribution gave
      ``completion_token_ids[i]`` (after temperature, before top-p truncation).
    - It always samples from the newest published weights and reports their
      ``weight_version``.
    - Stop tokens that ended the completion are included in it, with ``finish_reason="stop"``.
    - A sampler over several servers may read :data:`rllm_core.routing.routing_key` (the
      gateway sets it to the session id around each call) to keep a session on one server, so
      that the server's prefix cache keeps serving it; the key never changes what is sampled.
    - A sampler whose model servers fail raises :class:`~rllm_core.errors.UpstreamError`:
      :class:`~rllm_core.errors.UpstreamRejectedError` when a server refused the request
      itself, :class:`~rllm_core.errors.UpstreamUnavailableError` when none could be reached,
      :class:`~rllm_core.errors.UpstreamTimeoutError` when one did not answer in time.

    Example::

        result = await sampler.sample(SampleRequest(prompt_token_ids=ids,
                                                    params=SamplingParams(max_tokens=64)))
    """

    @property
    def weight_version(self) -> int: ...

    async def sample(self, request: SampleRequest) -> SampleResult: ...


@runtime_checkable
class StreamingSampler(Sampler, Protocol):
    """A sampler that can hand out tokens while it is still sampling; optional.

    ``sample_stream(request)`` is an async iterator. While the completion is being sampled it
    yields ``(token_ids, logprobs)`` pairs: the tokens sampled since the previous pair (at
    least one) and their logprobs. It then yields exactly one
    :class:`~rllm_core.types.SampleResult` for the whole completion, whose
    ``completion_token_ids`` and ``logprobs`` are the pairs concatenated, and ends. Everything
    else follows the :class:`Sampler` contract (stop tokens included, errors raised as
    :class:`~rllm_core.errors.UpstreamError`). A consumer that stops early closes the
    iterator (``aclose``); the sampler then abandons the request. The gateway streams a chat
    completion's deltas from this when the sampler offers it, and otherwise sends the
    finished completion.

    Example::

        async for item in sampler.sample_stream(request):
            if isinstance(item, SampleResult):
                result = item
            else:
                token_ids, logprobs = item
    """

    def sample_stream(
        self, request: SampleRequest
    ) -> AsyncIterator[tuple[list[int], list[float]] | SampleResult]: ...


@runtime_checkable
class WorkerPool(Protocol):
    """What a sampler over model servers may also offer: their state, and a way to close it.

    ``status()`` returns one :class:`~rllm_core.types.WorkerStatus` per server, in a fixed
    order; the gateway reports them on ``/health`` (healthy and total) and ``/metrics`` (all of
    them), and reports itself degraded when none is healthy. ``aclose()`` stops background work
    and closes connections; it is idempotent, and the gateway calls it when it stops.
    """

    def status(self) -> Sequence[WorkerStatus]: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class DrainablePool(Protocol):
    """What a :class:`WorkerPool` may also offer: lending one of its servers away, as a run
    with convertible nodes does when the node that server runs on becomes the trainer
    (:mod:`rllm_core.training.node_agent`). ``url`` is one of :meth:`WorkerPool.status`'s
    urls; any other raises ``KeyError`` naming the pool's urls.

    - ``drain(url)``: no new request goes to the server. A routing key that stuck to it moves
      to another server at its next request. Requests already running there go on.
    - ``in_flight(url)``: how many requests are running on the server now.
    - ``cut(url)``: ends the requests still running on the server; each one is sent again to
      another server, as after a connection error, so the trajectory it belongs to goes on.
      A streamed completion that had already handed out tokens cannot start over and fails
      with :class:`~rllm_core.errors.UpstreamError`. Returns how many requests it ended.
    - ``admit(url)``: the server takes requests again; a drained server counts as healthy
      as it was before the drain (a server that went down meanwhile comes back through the
      health checks).

    ``drain`` and ``admit`` are idempotent. A drained server reports ``healthy`` false in
    :meth:`WorkerPool.status` and ``last_error`` ``"drained"``.
    """

    def drain(self, url: str) -> None: ...

    def in_flight(self, url: str) -> int: ...

    async def cut(self, url: str) -> int: ...

    def admit(self, url: str) -> None: ...


@runtime_checkable
class SharedPool(Protocol):
    """What a sampler over model servers may also offer: clients of the same servers in other
    processes, as a run's gateway workers are (``[gateway].workers``,
    :mod:`rllm_core.rollout.gateway_workers`).

    - ``client_options()``: the options of this sampler's own component (the same name) that
      build, in another process, a sampler sending to the same servers. That sampler starts,
      stops and loads weights into none of them: this one keeps owning them.
    - ``served_policy()``: ``(model, version)``, what requests starting now are sent with: the
      request's ``model`` field (a LoRA adapter's name; ``None``: none sent) and the weight
      version results report. It changes when the sampler follows a new policy.
    - ``use(model, version)``: from now on send requests with ``model`` and report
      ``version``; a request already running keeps what it started with. A client built from
      ``client_options()`` is told this after every policy change of the owning sampler.

    Example::

        options = owner.client_options()  # in the run's process
        client = build("sampler", name, options)  # in a gateway worker
        client.use(*owner.served_policy())  # after every weight update
    """

    def client_options(self) -> dict[str, Any]: ...

    def served_policy(self) -> tuple[str | None, int]: ...

    def use(self, model: str | None, version: int) -> None: ...


@runtime_checkable
class BusyClock(Protocol):
    """What a sampler may also offer: how long it has been working.

    ``busy_seconds`` is the wall time, summed since the sampler started, during which it was
    running the model for requests (prompt processing, decoding, choosing tokens); it never
    decreases. Time spent waiting for requests or for the trainer to release the weights does
    not count. ``rllm-core run`` reports ``sampler_utilization``, the busy seconds of a rollout
    phase over its wall time, for samplers that offer it.
    """

    @property
    def busy_seconds(self) -> float: ...


@runtime_checkable
class SyncCounters(Protocol):
    """What a sampler that follows the policy (a :class:`PolicyFollower`) may also offer:
    counts of the weight updates it made.

    ``sync_metrics()`` returns figures summed since the sampler started, each never
    decreasing, under keys prefixed with the sampler's name (``vllm/weight_syncs``,
    ``vllm/sync_s``, ``vllm/restores``). ``rllm-core run`` adds them to every batch's line of
    ``metrics.jsonl``, as they stand when the batch's rollouts are done.
    """

    def sync_metrics(self) -> Mapping[str, float]: ...


@runtime_checkable
class TrainerBackend(Protocol):
    """Owns the policy weights: computes gradients, steps the optimizer, serves a sampler.

    Contract:

    - ``forward_backward(datums, objective)`` computes per-token logprobs under the current
      weights and evaluates the :class:`~rllm_core.algorithms.objective.Objective` on them:
      ``step = objective.begin(action_masks, observation_masks)`` with the masks of every
      micro-batch of the call, then ``step.evaluate(LossInputs(...))`` per micro-batch and a
      backward pass of its result, then ``step.metrics()``. The backend never builds a
      :class:`~rllm_core.ports.losses.LossContext` itself and never composes losses. One call
      takes one optimizer step's datums: the backend splits them into micro-batches itself, so
      how they are split does not change the gradient. Further calls before ``optim_step`` add
      their gradients, each normalized over its own datums. A datum's ``proximal_logprobs``,
      when set, go to ``LossInputs.proximal_logprobs``. Returns float metrics: those of
      ``step.metrics()`` plus ``tokens`` and ``sequences`` (and the backend's own, prefixed
      with its name).
    - With ``proximal = "recompute"`` the run also needs :class:`LogprobScorer`; a backend
      without it leaves ``"recompute"`` out of its spec's ``proximal_modes``, and ``plan
      check`` refuses the choice.
    - ``optim_step()`` applies and clears the gradients, increments ``weight_version`` and
      makes the new weights visible to ``sampler()``. Returns float metrics (grad norm, lr).
      A backend that left every datum since the last ``optim_step`` out of its calls (a
      service would have rejected them, see :mod:`rllm_core.kit.token_hygiene`) may skip the
      step instead: no update, ``weight_version`` unchanged, nothing published, and the
      metrics hold ``<name>/skipped_step = 1.0``; the run goes on to the next step.
    - ``save_state(path)`` / ``load_state(path)`` cover weights, optimizer, scheduler, RNG and
      counters: save, load and continue is bitwise equal to never stopping.
    - A backend whose config has a ``deterministic`` key receives ``[run].deterministic``
      there. True: the same datums in the same order, the same seed and the same conditions
      (machine type, thread count, library versions; see :class:`NumericsReport`) give
      bitwise equal metrics and weights, also across processes. False: the backend may take
      faster paths that give up that equality.

    Example::

        metrics = backend.forward_backward(batch, objective)
        metrics |= backend.optim_step()
    """

    @property
    def weight_version(self) -> int: ...

    def sampler(self) -> Sampler: ...

    def forward_backward(
        self, datums: Sequence[Datum], objective: Objective
    ) -> Mapping[str, float]: ...

    def optim_step(self) -> Mapping[str, float]: ...

    def save_state(self, path: str) -> None: ...

    def load_state(self, path: str) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class LogprobScorer(Protocol):
    """What a trainer backend may also offer: logprobs under its current weights.

    ``compute_logprobs(datums)`` returns, per datum, the logprob of each token given those
    before it (0.0 at position 0), at the temperature the backend trains with, without
    gradient and without changing any state: the ratio denominator of
    ``[algorithm].proximal = "recompute"``.
    """

    def compute_logprobs(self, datums: Sequence[Datum]) -> list[list[float]]: ...


@runtime_checkable
class ReferenceScorer(Protocol):
    """What a trainer backend may also offer: logprobs under the reference model, for the KL
    of ``[algorithm.kl]``.

    ``compute_ref_logprobs(datums)`` returns, per datum, the logprob of each token given those
    before it (0.0 at position 0) under the reference model: the policy's starting weights
    (with LoRA, the model with its adapters disabled), at the temperature the backend trains
    with, without gradient and without changing any state. The reference never moves, so a
    run calls it once per batch, before the batch's first update. A backend offering it
    declares the trait ``reference_kl`` in its spec (the placements it honours, ``("loss",
    "reward")`` or a part); ``plan check`` refuses ``[algorithm.kl] coef > 0`` elsewhere. A
    backend that passes ``LossInputs.entropy`` declares the trait ``entropy``.
    """

    def compute_ref_logprobs(self, datums: Sequence[Datum]) -> list[list[float]]: ...


@runtime_checkable
class LossRouting(Protocol):
    """What a trainer backend may also offer: the choice between a service's own loss kernels
    and its custom-loss path, made once per objective and said out loud.

    Contract:

    - ``loss_route(objective)`` returns the :class:`~rllm_core.algorithms.native_losses.LossRoute`
      the backend trains ``objective`` on: ``"native"`` (one fused pass in the service's
      kernel) or ``"custom"`` (the loss evaluated on this machine), with the reason (see
      :func:`~rllm_core.algorithms.native_losses.route_objective`). It calls no service and changes
      nothing; the same objective always gets the same route.
    - Every later ``forward_backward(datums, objective)`` trains on that route; either route
      returns the same metric names and the same gradient up to floating-point summation order.
    - When the backend's ``loss_path = "native"`` asks for a route the objective cannot take,
      it raises :class:`~rllm_core.algorithms.native_losses.NativeLossError` saying why; the
      run then fails naming ``[trainer].loss_path`` (``plan check`` refuses such a plan before).
    - ``rllm-core run`` calls it once at the start of a training run, on the trainer thread,
      before the first ``forward_backward``; it prints :meth:`LossRoute.line` to stderr,
      writes ``loss_path.json`` into the run folder (:meth:`LossRoute.write`) and adds the
      record to ``summary.json`` as ``loss_path``.

    Example::

        route = backend.loss_route(objective)
        print(route.line(), file=sys.stderr)
    """

    def loss_route(self, objective: Objective) -> LossRoute: ...


@runtime_checkable
class WeightReleaser(Protocol):
    """What a trainer backend may also offer: its policy weights as files that another backend
    of the same model loads to sample with (a policy release).

    Contract:

    - ``save_weights(path)`` writes the trainable weights of the current ``weight_version``
      into the folder ``path`` (created when missing): the adapter tensors for LoRA training,
      every weight for full training, with what a loader needs to recognize the model and
      shape they belong to. No optimizer state; nothing of the backend changes.
    - ``load_weights(path, version)`` replaces the trainable weights with those a backend of
      the same model, dtype and shape saved in ``path`` and sets ``weight_version`` to
      ``version``: sequences its sampler admits from then on use them and report
      ``version``. Weights of another model or shape are refused with an error naming both,
      and nothing changes. Pending gradients are dropped; the optimizer state is kept.

    Example::

        trainer.save_weights("/tmp/release")
        sampler_side.load_weights("/tmp/release", trainer.weight_version)
    """

    def save_weights(self, path: str) -> None: ...

    def load_weights(self, path: str, version: int) -> None: ...


@runtime_checkable
class Interruptible(Protocol):
    """What a trainer backend may also offer: a long call stopped early, so that a run told to
    stop does not first finish minutes of training.

    Contract:

    - ``interrupt()`` may be called from any thread and returns at once. A ``forward_backward``
      or ``compute_logprobs`` running on another thread then stops at its next safe point
      (between two forward passes, so within one micro-batch's time) and raises
      :class:`~rllm_core.errors.TrainingInterrupted`; one that starts while the request is
      pending raises it before any forward pass. Either way the request is used up.
    - An interrupted ``forward_backward`` leaves no pending gradient (those of earlier calls
      are cleared too, as after a failed call); weights, optimizer state and
      ``weight_version`` are as before the call. ``optim_step`` and the other calls are not
      interrupted, and a request made while none of the two calls runs waits for the next.
    - ``rllm-core run`` calls it on SIGINT / SIGTERM while a step trains; the step is then
      not recorded and, when the step had already moved the weights (``mini_batches`` or
      ``epochs`` above 1), no checkpoint is written for it.
    """

    def interrupt(self) -> None: ...


@runtime_checkable
class NumericsReport(Protocol):
    """What a component may also offer: the conditions its numbers depend on.

    ``numerics()`` returns JSON-able values: library versions, thread count, device, and each
    numeric mode as the library itself reports it (not as it was asked for). ``rllm-core
    run`` writes them to the run folder's ``numerics.json`` and, on resume, warns about every
    one that changed: bitwise equality holds only under the same conditions.
    """

    def numerics(self) -> Mapping[str, Any]: ...


@runtime_checkable
class ParallelTrainer(Protocol):
    """What a trainer backend may also offer: training in several processes at once
    (``torch.distributed`` ranks, one per device), launched by ``torchrun`` or by ``rllm-core
    run`` itself.

    Contract:

    - ``rank`` and ``world_size`` are the process's place in the group (``0`` and ``1`` for a
      backend that runs alone).
    - Rank 0 is the only rank the run talks to: it owns the gateway, the run folder and the
      loggers, and uses the backend as any :class:`TrainerBackend`. Every call it makes
      (``forward_backward``, ``optim_step``, ``save_state`` ...) is carried out by all ranks
      together: the backend hands the call to the others itself, and raises on rank 0 when
      any rank failed, naming the rank.
    - On every other rank the run builds the same backend from the same plan and calls
      ``follow()``, which carries out rank 0's calls until rank 0 closes its backend, then
      returns (or raises when rank 0 is gone).
    - The result does not depend on ``world_size``: one ``forward_backward`` call's datums are
      split across the ranks, with the normalizers of the whole call, and metrics are those of
      the whole call; weights after an optimizer step equal those of one process up to
      floating-point summation order.
    - Only rank 0 has a sampler.
    """

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    def follow(self) -> None: ...


class ParallelSettings(BaseModel):
    """The ``parallel`` table of a trainer backend that trains in several processes
    (:class:`ParallelTrainer`): a backend's config declares it as ``parallel:
    ParallelSettings``, and ``rllm-core run`` reads ``world_size`` from it:
    above 1, and when not already started by ``torchrun``, it starts ``world_size`` processes
    on this machine through ``torch.distributed.run``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    world_size: int = Field(
        1,
        ge=1,
        description=(
            "Processes that train together (data parallel), one per device. Under torchrun it"
            " must equal the WORLD_SIZE torchrun sets; otherwise `rllm-core run` starts them on"
            " this machine."
        ),
    )
    strategy: Literal["auto", "ddp", "fsdp"] = Field(
        "auto",
        description=(
            "How the ranks share the model: `ddp` replicates it (DistributedDataParallel),"
            " `fsdp` shards parameters, gradients and optimizer state (FSDP2 `fully_shard`);"
            " `auto` picks ddp for LoRA and fsdp for full training."
        ),
    )
    backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto",
        description="torch.distributed backend: `auto` is nccl on CUDA and gloo on the CPU.",
    )
    timeout_s: float = Field(
        1800.0,
        gt=0,
        description=(
            "Seconds a rank waits for the others at one collective call before the run fails."
        ),
    )


@runtime_checkable
class WeightExporter(Protocol):
    """What a trainer backend may also offer: its current policy in the layout model servers
    load (Hugging Face folders), for samplers that are not the backend's own.

    Contract:

    - ``export_weights(path)`` writes the current ``weight_version`` into the folder ``path``
      (created when missing, written completely before it returns): with LoRA training a PEFT
      adapter folder (``adapter_config.json``, ``adapter_model.safetensors``) for the base model
      the backend loaded; with full training a model folder (``config.json``, safetensors
      weights, the tokenizer files) that loads on its own. It returns the
      :class:`~rllm_core.types.ExportedWeights` describing it. Nothing of the backend changes.
    - ``export_weights(path, merge=True)`` always writes a model folder that loads on its own
      (``kind = "full"``): with LoRA training the adapter merged into the base weights. It
      holds the tokenizer and its chat template, so ``AutoModelForCausalLM.from_pretrained``,
      ``AutoTokenizer.from_pretrained`` and vLLM load it, and its logits equal the backend's.
    - A backend that offers it declares the spec trait ``exports_weights = True``; ``plan
      check`` refuses a ``[sampler]`` section with a backend that does not, naming both.
    """

    def export_weights(self, path: str, *, merge: bool = False) -> ExportedWeights: ...


@runtime_checkable
class PolicyFollower(Protocol):
    """What a sampler (a ``[sampler]`` section of a training run) may also offer: model servers
    kept on the trainer's current policy.

    Contract:

    - ``export_path(version)`` is the folder the trainer writes weight version ``version``
      into (:meth:`WeightExporter.export_weights`), on storage the servers read.
    - ``await update_weights(exported)`` makes every server sample from those weights. Once it
      returns, every request the sampler starts uses them and reports ``exported.version`` as
      its ``weight_version``; a request already in flight finishes on the weights it started
      with and reports their version. Transient failures are retried; when the retries are
      spent it raises :class:`~rllm_core.errors.UpstreamError` naming the server and what it
      answered, and the run fails with it.
    - A server that lost the weights it was given (it restarted) gets them again before it
      serves another request.
    - ``rllm-core run`` calls it once before the first rollout (with the weights the run starts
      or resumes from) and after every optimizer step, before any rollout samples from the new
      version.
    """

    def export_path(self, version: int) -> str: ...

    async def update_weights(self, exported: ExportedWeights) -> None: ...


@runtime_checkable
class SupervisedTrainer(Protocol):
    """What a trainer backend may also offer: supervised fine-tuning steps on its own
    cross-entropy path (a service's fused kernel), for ``rllm-core sft``.

    Contract:

    - ``forward_backward_supervised(datums)`` adds the gradient of the mean negative
      log-likelihood of the datums' trained tokens: those whose ``action_mask`` is true (what
      the renderer marks as sampled: assistant content and its closing token). The mean is over
      every trained token of the call (``token-mean``), whatever micro-batches the backend
      splits it into; every other token is context only. ``logprobs``, ``advantages`` and
      ``proximal_logprobs`` are ignored. Returns float metrics: ``nll`` (that mean), ``tokens``
      (trained tokens) and ``sequences``, plus the backend's own, prefixed with its name.
    - Further calls before ``optim_step`` add their gradients, each normalized over its own
      datums; ``optim_step`` is :meth:`TrainerBackend.optim_step`.
    - A backend without it is trained through :meth:`TrainerBackend.forward_backward` with
      the core's negative log-likelihood objective, which computes the same quantity; a backend
      that has it gives the same gradient as that path up to floating-point summation order.

    Example::

        metrics = backend.forward_backward_supervised(batch)
        metrics |= backend.optim_step()
    """

    def forward_backward_supervised(self, datums: Sequence[Datum]) -> Mapping[str, float]: ...
