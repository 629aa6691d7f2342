"""Checking a loss against its published reference formula (verl 0.9, ``core_algos.py``).

A reference test restates a loss's per-token formula in plain torch, reduces it with
:func:`verl_agg_loss` (verl's ``agg_loss`` on one rank, the batch being the whole step), and
checks with :func:`assert_matches_reference` that our loss, run on the context a trainer builds
(:func:`trainer_context`), agrees with it in value and in gradient on the current logprobs.
:func:`reference_inputs` makes the seeded, ragged inputs such a test runs on.

verl's aggregation, ``m`` the response mask and ``L`` the per-token losses::

    token-mean            sum(L * m) / sum(m)
    seq-mean-token-mean   sum over rows with m of (sum_t(L * m) / (sum_t(m) + 1e-8)) / rows with m
    seq-mean-token-sum    sum(L * m) / rows with m

Needs torch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from rllm_core.algorithms.aggregation import MaskAwareAggregate, make_aggregate, step_normalizers
from rllm_core.ports.losses import LossContext, LossOutput

__all__ = [
    "REFERENCE_LENGTHS",
    "REFERENCE_MODES",
    "assert_matches_reference",
    "reference_inputs",
    "trainer_context",
    "verl_agg_loss",
]

REFERENCE_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
"""The aggregation modes both verl and rllm-core have."""

REFERENCE_LENGTHS: tuple[int, ...] = (12, 7, 10, 3, 12, 9, 5, 11)
"""Real tokens per row of :func:`reference_inputs`."""

ReferencePerToken = Callable[[torch.Tensor, Mapping[str, torch.Tensor]], torch.Tensor]
"""``reference(log_prob, inputs)``: the per-token losses of a restated formula."""


def verl_agg_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    """verl's ``agg_loss`` on one rank, the batch being the whole step (module docstring)."""
    m = mask.to(loss_mat.dtype)
    rows = (m.sum(dim=-1) > 0).to(loss_mat.dtype)
    if mode == "token-mean":
        return (loss_mat * m).sum() / m.sum()
    if mode == "seq-mean-token-sum":
        return ((loss_mat * m).sum(dim=-1) * rows).sum() / rows.sum()
    if mode == "seq-mean-token-mean":
        row_means = (loss_mat * m).sum(dim=-1) / (m.sum(dim=-1) + 1e-8)
        return (row_means * rows).sum() / rows.sum()
    raise ValueError(f"aggregation mode {mode!r} is not one of {REFERENCE_MODES}")


def reference_inputs(
    *,
    seed: int,
    spread: float = 0.6,
    per_sequence_advantages: bool = False,
    max_logprob: float | None = None,
    lengths: Sequence[int] = REFERENCE_LENGTHS,
) -> dict[str, torch.Tensor]:
    """Seeded float64 inputs, right-padded rows of ``lengths`` real tokens.

    Token 0 of each row is prompt, tokens 5-6 of long rows an observation span, the rest
    actions; padding holds large finite values a missing mask would reveal. ``old_logprobs``
    are uniform in ``[-2.52, -0.02]``; ``logprobs`` are ``old_logprobs`` plus Gaussian noise of
    std ``spread`` (clamped above at ``max_logprob`` when given); ``rollout_logprobs`` differ
    from ``old_logprobs`` (noise of std 0.3). Advantages are one centred value per row, plus
    per-token noise unless ``per_sequence_advantages``.
    """
    g = torch.Generator().manual_seed(seed)
    batch, width = len(lengths), max(lengths)
    positions = torch.arange(width)
    real = positions[None, :] < torch.tensor(list(lengths))[:, None]
    observation = real & ((positions[None, :] == 5) | (positions[None, :] == 6))
    action = real & (positions[None, :] > 0) & ~observation
    old = -(0.02 + 2.5 * torch.rand(batch, width, generator=g, dtype=torch.float64))
    current = old + spread * torch.randn(batch, width, generator=g, dtype=torch.float64)
    if max_logprob is not None:
        current = current.clamp(max=max_logprob)
    rollout = old + 0.3 * torch.randn(batch, width, generator=g, dtype=torch.float64)
    row_advantage = torch.randn(batch, 1, generator=g, dtype=torch.float64)
    row_advantage = row_advantage - row_advantage.mean()
    if per_sequence_advantages:
        advantages = row_advantage.expand(batch, width).clone()
    else:
        noise = torch.randn(batch, width, generator=g, dtype=torch.float64)
        advantages = row_advantage + noise
    pad = ~real
    current = torch.where(pad, torch.full_like(current, 4.0), current)
    old = torch.where(pad, torch.full_like(old, -30.0), old)
    advantages = torch.where(pad, torch.full_like(advantages, 50.0), advantages)
    return {
        "logprobs": current,
        "old_logprobs": old,
        "rollout_logprobs": rollout,
        "advantages": advantages,
        "action_mask": action.to(torch.float64),
        "observation_mask": observation.to(torch.float64),
    }


def trainer_context(inputs: Mapping[str, torch.Tensor], mode: str) -> LossContext:
    """The context a trainer builds from ``inputs``, the step being this one micro-batch: a
    :class:`~rllm_core.algorithms.aggregation.MaskAwareAggregate` over step normalizers, and
    ``logprobs`` a fresh leaf that requires grad."""
    action, observation = inputs["action_mask"], inputs["observation_mask"]
    aggregates = {}
    for name, mask in (("action", action), ("observation", observation)):
        tokens, sequences = step_normalizers([mask])
        aggregates[name] = make_aggregate(mode, total_tokens=tokens, total_sequences=sequences)
    return LossContext(
        logprobs=inputs["logprobs"].clone().requires_grad_(True),
        old_logprobs=inputs["old_logprobs"].clone(),
        rollout_logprobs=inputs["rollout_logprobs"].clone(),
        advantages=inputs["advantages"].clone(),
        action_mask=action,
        observation_mask=observation,
        aggregate=MaskAwareAggregate(
            action=aggregates["action"],
            observation=aggregates["observation"],
            action_mask=action,
            observation_mask=observation,
        ),
    )


def assert_matches_reference(
    loss: Any,
    reference: ReferencePerToken,
    inputs: Mapping[str, torch.Tensor],
    mode: str,
) -> tuple[LossOutput, torch.Tensor]:
    """Assert that ``loss`` on :func:`trainer_context` and ``reference`` reduced with
    :func:`verl_agg_loss` over the action mask agree in value and in gradient on the current
    logprobs, and that no gradient falls outside the action mask. Returns our loss's output and
    its gradient, for further checks."""
    ctx = trainer_context(inputs, mode)
    out = loss(ctx)
    (ours,) = torch.autograd.grad(out.loss, ctx.logprobs)

    leaf = inputs["logprobs"].clone().requires_grad_(True)
    mask = inputs["action_mask"] > 0
    expected = verl_agg_loss(reference(leaf, inputs), mask, mode)
    (theirs,) = torch.autograd.grad(expected, leaf)

    # verl adds 1e-8 to each row's token count in seq-mean-token-mean, ours divides by the
    # exact count: each row's term differs by a relative 1e-8 at most there, none elsewhere.
    rtol, atol = (1e-7, 1e-9) if mode == "seq-mean-token-mean" else (1e-12, 1e-14)
    torch.testing.assert_close(out.loss.detach(), expected.detach(), rtol=rtol, atol=atol)
    torch.testing.assert_close(ours, theirs, rtol=rtol, atol=atol)
    assert torch.equal(ours[~mask], torch.zeros_like(ours[~mask]))
    return out, ours
