"""ppo-clip, cispo and gspo against the reference formulas of verl 0.9 (``core_algos.py``).

Each reference below is a plain-torch restatement of the published formula, written for this
test; our loss runs on a :class:`~rllm_core.ports.LossContext` built as a trainer builds it
(:class:`~rllm_core.algorithms.aggregation.MaskAwareAggregate` over step normalizers), and the
test compares the gradient with respect to the current logprobs, and the loss value, in the
three aggregation modes both have.

The inputs are seeded and fixed: right-padded rows of different lengths (padding and one
observation span hold arbitrary finite values), advantages of both signs, and
``old_logprobs != logprobs`` so that ratios fall inside and outside the clip range; every test
asserts that clipping really engages, so it cannot pass by luck. ``rollout_logprobs`` differ
from ``old_logprobs``: the ratio's denominator must be ``old_logprobs`` (verl's
``old_log_prob``), which equals the rollout logprobs only when the trainer sets it so.

The reference's aggregation is verl's ``agg_loss`` with the whole batch as the step (one rank),
restated in :func:`rllm_core.testing.suites.reference.verl_agg_loss`.
"""

from __future__ import annotations

import math

import pytest
import torch
from rllm_core.testing.suites.reference import (
    REFERENCE_LENGTHS,
    REFERENCE_MODES,
    assert_matches_reference,
    reference_inputs,
)
from rllm_loss_ppo.cispo import CISPO
from rllm_loss_ppo.gspo import GSPO
from rllm_loss_ppo.plugin import CISPOConfig, GSPOConfig, PPOClipConfig
from rllm_loss_ppo.ppo_clip import PPOClip


def compare(loss, reference_per_token, inputs: dict, mode: str) -> None:
    """Our loss and the reference agree in value and in gradient on the current logprobs, and
    the gradient reaches the action tokens."""
    _, ours = assert_matches_reference(loss, reference_per_token, inputs, mode)
    mask = inputs["action_mask"] > 0
    assert ours[mask].abs().sum() > 0


def engaged(flags: torch.Tensor, inputs: dict) -> tuple[int, int]:
    """(flagged, not flagged) counts over action tokens."""
    mask = inputs["action_mask"] > 0
    flagged = int((flags & mask).sum())
    return flagged, int(mask.sum()) - flagged


# ---------------------------------------------------------------- ppo-clip


def reference_ppo_clip(eps_low: float, eps_high: float, c: float | None):
    """verl ``vanilla`` (PPO clipped surrogate with decoupled range and dual clip)::

    ratio  = exp(clamp(log_prob - old_log_prob, -20, 20))
    L1     = -A * ratio
    L2     = -A * clamp(ratio, 1 - eps_low, 1 + eps_high)
    L      = max(L1, L2)
    L      = min(L, -A * c)   where A < 0   (dual clip; verl always applies it, c = 3.0
                                              by default; c = None leaves it out)
    """

    def per_token(log_prob: torch.Tensor, inputs: dict) -> torch.Tensor:
        advantages = inputs["advantages"]
        ratio = torch.exp(torch.clamp(log_prob - inputs["old_logprobs"], -20.0, 20.0))
        clipped = torch.maximum(
            -advantages * ratio, -advantages * torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
        )
        if c is None:
            return clipped
        return torch.where(advantages < 0, torch.minimum(-advantages * c, clipped), clipped)

    return per_token


PPO_CASES = [
    (PPOClipConfig(), (0.2, 0.2, None)),
    (PPOClipConfig(eps_low=0.2, eps_high=0.28, dual_clip_c=3.0), (0.2, 0.28, 3.0)),
]


@pytest.mark.parametrize("mode", REFERENCE_MODES)
@pytest.mark.parametrize(("config", "reference"), PPO_CASES, ids=["default", "dual-clip"])
def test_ppo_clip_matches_reference(mode, config, reference):
    inputs = reference_inputs(seed=11, per_sequence_advantages=False, spread=0.6)
    eps_low, eps_high, c = reference
    ratio = torch.exp(inputs["logprobs"] - inputs["old_logprobs"])
    advantages = inputs["advantages"]
    # The clip engages on both sides and leaves tokens inside the range.
    flat_high = (advantages > 0) & (ratio > 1 + eps_high)
    flat_low = (advantages < 0) & (ratio < 1 - eps_low)
    assert min(engaged(flat_high, inputs)) > 0
    assert min(engaged(flat_low, inputs)) > 0
    if c is not None:
        assert min(engaged((advantages < 0) & (ratio > c), inputs)) > 0
    compare(PPOClip(config), reference_ppo_clip(eps_low, eps_high, c), inputs, mode)


# ---------------------------------------------------------------- cispo


def reference_cispo(eps_low: float, eps_high: float):
    """verl ``cispo`` (MiniMax-M1's clipped IS-weight policy optimization)::

    ratio = exp(clamp(log_prob - old_log_prob, -20, 20))
    L     = -sg(clamp(ratio, 1 - eps_low, 1 + eps_high)) * A * log_prob
    """

    def per_token(log_prob: torch.Tensor, inputs: dict) -> torch.Tensor:
        ratio = torch.exp(torch.clamp(log_prob - inputs["old_logprobs"], -20.0, 20.0))
        weight = torch.clamp(ratio, 1 - eps_low, 1 + eps_high).detach()
        return -weight * inputs["advantages"] * log_prob

    return per_token


CISPO_CASES = [
    (CISPOConfig(), (1.0, 0.28)),  # ours: no lower bound
    (CISPOConfig(eps_low=0.2, eps_high=0.2), (0.2, 0.2)),  # verl's actor defaults
]


@pytest.mark.parametrize("mode", REFERENCE_MODES)
@pytest.mark.parametrize(("config", "reference"), CISPO_CASES, ids=["default", "verl-defaults"])
def test_cispo_matches_reference(mode, config, reference):
    inputs = reference_inputs(seed=12, per_sequence_advantages=False, spread=0.6)
    eps_low, eps_high = reference
    ratio = torch.exp(inputs["logprobs"] - inputs["old_logprobs"])
    assert min(engaged(ratio > 1 + eps_high, inputs)) > 0
    if eps_low < 1.0:
        assert min(engaged(ratio < 1 - eps_low, inputs)) > 0
    compare(CISPO(config), reference_cispo(eps_low, eps_high), inputs, mode)


# ---------------------------------------------------------------- gspo


def reference_gspo(eps_low: float, eps_high: float):
    """verl ``gspo`` (GSPO-token, with its stop-gradient trick)::

        log s_i    = sum_t(m * (log_prob - old_log_prob)) / max(sum_t(m), 1)
        log s_i,t  = sg(log s_i) + log_prob - sg(log_prob)      (clamped above at 10)
        L          = max(-A * s_i,t, -A * clamp(s_i,t, 1 - eps_low, 1 + eps_high))

    ``s_i,t`` has the value of the sequence ratio and the gradient of the token's own ratio.
    verl always aggregates it with seq-mean-token-mean; here the reference is aggregated with
    the mode under test. With one advantage per sequence (as here) its gradient equals ours,
    where the sequence ratio carries every token's gradient (see the README).
    """

    def per_token(log_prob: torch.Tensor, inputs: dict) -> torch.Tensor:
        mask = inputs["action_mask"]
        diff = log_prob - inputs["old_logprobs"]
        lengths = mask.sum(dim=-1).clamp(min=1)
        log_seq = ((diff * mask).sum(dim=-1) / lengths).detach().unsqueeze(-1)
        log_token = torch.clamp(log_prob - log_prob.detach() + log_seq, max=10.0)
        s = torch.exp(log_token)
        advantages = inputs["advantages"]
        return torch.maximum(
            -advantages * s, -advantages * torch.clamp(s, 1 - eps_low, 1 + eps_high)
        )

    return per_token


GSPO_CASES = [
    (GSPOConfig(), (3e-4, 4e-4), 0.002),
    (GSPOConfig(eps_low=0.05, eps_high=0.08), (0.05, 0.08), 0.25),
]


@pytest.mark.parametrize("mode", REFERENCE_MODES)
@pytest.mark.parametrize(("config", "reference", "spread"), GSPO_CASES, ids=["default", "wide"])
def test_gspo_matches_reference(mode, config, reference, spread):
    inputs = reference_inputs(seed=13, per_sequence_advantages=True, spread=spread)
    eps_low, eps_high = reference
    mask = inputs["action_mask"]
    log_seq = ((inputs["logprobs"] - inputs["old_logprobs"]) * mask).sum(-1) / mask.sum(-1)
    s = torch.exp(log_seq)
    advantages = inputs["advantages"][:, 0]
    flat = ((advantages > 0) & (s > 1 + eps_high)) | ((advantages < 0) & (s < 1 - eps_low))
    # Some sequences are clipped (no gradient), some are not.
    assert 0 < int(flat.sum()) < len(REFERENCE_LENGTHS), s
    compare(GSPO(config), reference_gspo(eps_low, eps_high), inputs, mode)


def test_inputs_are_as_described():
    inputs = reference_inputs(seed=11, per_sequence_advantages=False, spread=0.6)
    mask = inputs["action_mask"] > 0
    assert (inputs["advantages"][mask] > 0).any() and (inputs["advantages"][mask] < 0).any()
    assert not torch.equal(inputs["old_logprobs"], inputs["rollout_logprobs"])
    assert (~mask & (inputs["observation_mask"] > 0)).any()
    assert all(math.isfinite(v) for v in inputs["logprobs"].flatten().tolist())
