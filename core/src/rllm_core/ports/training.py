"""Contracts for sampling and training backends."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from rllm_core.ports.losses import Loss
from rllm_core.types import Datum, SampleRequest, SampleResult

__all__ = ["BusyClock", "Sampler", "TrainerBackend", "WeightedLoss"]


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

    Example::

        result = await sampler.sample(SampleRequest(prompt_token_ids=ids,
                                                    params=SamplingParams(max_tokens=64)))
    """

    @property
    def weight_version(self) -> int: ...

    async def sample(self, request: SampleRequest) -> SampleResult: ...


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


WeightedLoss = tuple[Loss, float]
"""An auxiliary loss and its coefficient."""


@runtime_checkable
class TrainerBackend(Protocol):
    """Owns the policy weights: computes gradients, steps the optimizer, serves a sampler.

    Contract:

    - ``forward_backward(datums, loss, aux_losses)`` recomputes per-token logprobs under the
      current weights, calls ``loss`` (and each auxiliary loss, scaled by its coefficient) with
      a :class:`~rllm_core.ports.losses.LossContext`, and accumulates gradients. One call takes
      a whole optimizer step's datums: the backend splits them into micro-batches itself and
      counts the aggregation normalizers over all of them first, so how the step is split into
      micro-batches does not change the gradient. Further calls before ``optim_step`` add their
      gradients, each normalized over its own datums. An auxiliary loss with coefficient 0 is
      not computed, so the result equals the policy loss alone bitwise. ``aggregation`` and
      ``norm_length`` are the plan's ``[algorithm]`` keys (see
      :func:`~rllm_core.algorithms.aggregation.make_aggregate`). Returns float metrics, each
      loss's own prefixed with its name (``dppo-tv/clip_frac``): a loss's ``name`` attribute
      when it has one, else the installed component that builds its class.
    - ``optim_step()`` applies and clears the gradients, increments ``weight_version`` and
      makes the new weights visible to ``sampler()``. Returns float metrics (grad norm, lr).
    - ``save_state(path)`` / ``load_state(path)`` cover weights, optimizer, scheduler, RNG and
      counters: save, load and continue is bitwise equal to never stopping.

    Example::

        metrics = backend.forward_backward(batch, loss, aux_losses=[(echo, 0.05)])
        metrics |= backend.optim_step()
    """

    @property
    def weight_version(self) -> int: ...

    def sampler(self) -> Sampler: ...

    def forward_backward(
        self,
        datums: Sequence[Datum],
        loss: Loss,
        aux_losses: Sequence[WeightedLoss] = (),
        *,
        aggregation: str = "token-mean",
        norm_length: float | None = None,
    ) -> Mapping[str, float]: ...

    def optim_step(self) -> Mapping[str, float]: ...

    def save_state(self, path: str) -> None: ...

    def load_state(self, path: str) -> None: ...

    def close(self) -> None: ...
