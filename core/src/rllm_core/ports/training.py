"""Contracts for sampling and training backends."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from rllm_core.ports.losses import Loss
from rllm_core.types import Datum, SampleRequest, SampleResult

__all__ = ["Sampler", "TrainerBackend", "WeightedLoss"]


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


WeightedLoss = tuple[Loss, float]
"""An auxiliary loss and its coefficient."""


@runtime_checkable
class TrainerBackend(Protocol):
    """Owns the policy weights: computes gradients, steps the optimizer, serves a sampler.

    Contract:

    - ``forward_backward(datums, loss, aux_losses)`` recomputes per-token logprobs under the
      current weights, calls ``loss`` (and each auxiliary loss, scaled by its coefficient) with
      a :class:`~rllm_core.ports.losses.LossContext`, and accumulates gradients. Several calls
      before one ``optim_step`` accumulate; normalization spans the whole optimizer step, so how
      datums are split across calls does not change the gradient. Returns float metrics.
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
        self, datums: Sequence[Datum], loss: Loss, aux_losses: Sequence[WeightedLoss] = ()
    ) -> Mapping[str, float]: ...

    def optim_step(self) -> Mapping[str, float]: ...

    def save_state(self, path: str) -> None: ...

    def load_state(self, path: str) -> None: ...

    def close(self) -> None: ...
