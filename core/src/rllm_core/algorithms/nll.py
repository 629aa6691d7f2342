"""The negative log-likelihood objective of supervised fine-tuning (``rllm-core sft``).

A backend without its own supervised path (:class:`~rllm_core.ports.SupervisedTrainer`) is
trained through :meth:`~rllm_core.ports.TrainerBackend.forward_backward` with
:func:`nll_objective`: minus the logprob of every token whose ``action_mask`` is true, averaged
over all of them in the call (``token-mean``). ``advantages``, the sampler's ``logprobs`` and
``observation_mask`` play no part, so supervised datums carry zeros there.
"""

from __future__ import annotations

from rllm_core.algorithms.objective import Objective, Term
from rllm_core.ports.losses import LossContext, LossOutput

__all__ = ["NLL_TERM", "NegativeLogLikelihood", "nll_objective"]

NLL_TERM = "nll"
"""The objective's term name: its metric ``nll/loss`` and the total ``loss`` are the mean NLL."""


class NegativeLogLikelihood:
    """Mean negative logprob of the action tokens, reduced through ``ctx.aggregate`` (so the
    mean is over every action token of the call, however it is split into micro-batches)."""

    name = NLL_TERM
    reads_observations = False

    def __call__(self, ctx: LossContext) -> LossOutput:
        return LossOutput(loss=ctx.aggregate(-ctx.logprobs, ctx.action_mask))


def nll_objective() -> Objective:
    """The supervised objective: :class:`NegativeLogLikelihood` alone, ``token-mean``."""
    return Objective(policy=Term(NLL_TERM, NegativeLogLikelihood()), aggregation="token-mean")
