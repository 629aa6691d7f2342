"""ppo-clip inside the run's objective: with ``proximal = "rollout"`` the trust region is
measured against the sampler's policy, so a gap between sampler and trainer logprobs engages
the clip on the very first pass."""

from __future__ import annotations

import pytest
import torch
from rllm_core.algorithms.objective import LossInputs, Objective, Term
from rllm_loss_ppo.plugin import PPOClipConfig
from rllm_loss_ppo.ppo_clip import PPOClip

EPS = 0.2


def batch() -> LossInputs:
    """One row of five action tokens after a prompt token. Ratios current / sampler of
    exp(0.5) (above 1 + eps), exp(-0.5) (below 1 - eps), exp(0.1) and exp(-0.1) (inside), and
    exp(0.5) again with a negative advantage (inside the flat side: it keeps its gradient)."""
    current = torch.tensor([[0.0, -1.0, -2.0, -1.5, -0.7, -1.2]])
    gap = torch.tensor([[0.0, 0.5, -0.5, 0.1, -0.1, 0.5]])
    advantages = torch.tensor([[0.0, 1.0, -1.0, 1.0, -1.0, -1.0]])
    action = torch.tensor([[0.0, 1.0, 1.0, 1.0, 1.0, 1.0]])
    return LossInputs(
        logprobs=current.clone().requires_grad_(),
        rollout_logprobs=current - gap,
        advantages=advantages,
        action_mask=action,
        observation_mask=torch.zeros_like(action),
    )


def test_ppo_clip_clips_against_the_rollout_policy_with_the_hand_computed_gradient():
    inputs = batch()
    objective = Objective(
        policy=Term("ppo-clip", PPOClip(PPOClipConfig(eps_low=EPS, eps_high=EPS)))
    )
    step = objective.begin([inputs.action_mask], [inputs.observation_mask])
    total = step.evaluate(inputs)
    total.backward()
    metrics = step.metrics()

    ratio = torch.exp(torch.tensor([0.5, -0.5, 0.1, -0.1, 0.5]))
    advantage = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0])
    # Token 1: A > 0 and ratio > 1 + eps -> clipped, flat. Token 2: A < 0 and ratio < 1 - eps
    # -> clipped, flat. Tokens 3, 4: inside the range -> d(-A * ratio)/dlogp = -A * ratio.
    # Token 5: A < 0 and ratio > 1 + eps -> max picks the unclipped term, gradient -A * ratio.
    live = torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0])
    expected = -advantage * ratio * live / 5
    torch.testing.assert_close(inputs.logprobs.grad[0, 1:], expected)
    assert inputs.logprobs.grad[0, 0] == 0
    assert metrics["ppo-clip/clip_fraction"] == pytest.approx(2 / 5)
    clipped = torch.tensor([1.0 + EPS, 1.0 - EPS])
    surrogate = torch.cat([-advantage[:2] * clipped, -advantage[2:] * ratio[2:]])
    assert metrics["ppo-clip/loss"] == pytest.approx(float(surrogate.mean()), rel=1e-6)
    assert metrics["offpolicy/k3"] > 0


def test_with_the_recomputed_policy_the_same_gap_does_not_clip():
    inputs = batch()
    recomputed = LossInputs(
        logprobs=inputs.logprobs,
        rollout_logprobs=inputs.rollout_logprobs,
        advantages=inputs.advantages,
        action_mask=inputs.action_mask,
        observation_mask=inputs.observation_mask,
        proximal_logprobs=inputs.logprobs.detach().clone(),
    )
    objective = Objective(
        policy=Term("ppo-clip", PPOClip(PPOClipConfig(eps_low=EPS, eps_high=EPS))),
        proximal="recompute",
    )
    step = objective.begin([inputs.action_mask], [inputs.observation_mask])
    step.evaluate(recomputed).backward()
    metrics = step.metrics()
    assert metrics["ppo-clip/clip_fraction"] == 0.0
    torch.testing.assert_close(
        inputs.logprobs.grad[0, 1:], -torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0]) / 5
    )
    # The diagnostics still measure the sampler gap, against the recomputed policy.
    assert metrics["offpolicy/ratio_max"] == pytest.approx(float(torch.exp(torch.tensor(0.5))))
