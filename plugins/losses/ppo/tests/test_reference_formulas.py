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

The reference's aggregation, verl's ``agg_loss`` with the whole batch as the step (one rank),
``m`` the response mask and ``L`` the per-token losses::

    token-mean            sum(L * m) / sum(m)
    seq-mean-token-mean   sum over rows with m of (sum_t(L * m) / (sum_t(m) + 1e-8)) / rows with m
    seq-mean-token-sum    sum(L * m) / rows with m
"""

from __future__ import annotations

import math

import pytest
import torch
from rllm_core.algorithms.aggregation import MaskAwareAggregate, make_aggregate, step_normalizers
from rllm_core.ports import LossContext
from rllm_loss_ppo.cispo import CISPO
from rllm_loss_ppo.gspo import GSPO
from rllm_loss_ppo.plugin import CISPOConfig, GSPOConfig, PPOClipConfig
from rllm_loss_ppo.ppo_clip import PPOClip

MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
LENGTHS = (12, 7, 10, 3, 12, 9, 5, 11)
WIDTH = 12


def reference_agg(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
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
    raise ValueError(mode)


def make_inputs(*, seed: int, per_sequence_advantages: bool, spread: float) -> dict:
    """Seeded float64 inputs. Token 0 of each row is prompt, tokens 5-6 of long rows an
    observation span; padding holds large finite values a missing mask would reveal."""
    g = torch.Generator().manual_seed(seed)
    batch = len(LENGTHS)
    positions = torch.arange(WIDTH)
    real = positions[None, :] < torch.tensor(LENGTHS)[:, None]
    observation = real & ((positions[None, :] == 5) | (positions[None, :] == 6))
    action = real & (positions[None, :] > 0) & ~observation
    old = -(0.02 + 2.5 * torch.rand(batch, WIDTH, generator=g, dtype=torch.float64))
    current = old + spread * torch.randn(batch, WIDTH, generator=g, dtype=torch.float64)
    rollout = old + 0.3 * torch.randn(batch, WIDTH, generator=g, dtype=torch.float64)
    row_advantage = torch.randn(batch, 1, generator=g, dtype=torch.float64)
    row_advantage = row_advantage - row_advantage.mean()
    if per_sequence_advantages:
        advantages = row_advantage.expand(batch, WIDTH).clone()
    else:
        noise = torch.randn(batch, WIDTH, generator=g, dtype=torch.float64)
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


def our_context(inputs: dict, mode: str) -> LossContext:
    """The context a trainer builds: the step is this one micro-batch."""
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


def compare(loss, reference_per_token, inputs: dict, mode: str) -> None:
    """Our loss and the reference agree in value and in gradient on the current logprobs."""
    ctx = our_context(inputs, mode)
    out = loss(ctx)
    (ours,) = torch.autograd.grad(out.loss, ctx.logprobs)

    leaf = inputs["logprobs"].clone().requires_grad_(True)
    mask = inputs["action_mask"] > 0
    expected = reference_agg(reference_per_token(leaf, inputs), mask, mode)
    (theirs,) = torch.autograd.grad(expected, leaf)

    # verl adds 1e-8 to each row's token count in seq-mean-token-mean, ours divides by the
    # exact count: each row's term differs by a relative 1e-8 at most there, none elsewhere.
    rtol, atol = (1e-7, 1e-9) if mode == "seq-mean-token-mean" else (1e-12, 1e-14)
    torch.testing.assert_close(out.loss.detach(), expected.detach(), rtol=rtol, atol=atol)
    torch.testing.assert_close(ours, theirs, rtol=rtol, atol=atol)
    assert ours[mask].abs().sum() > 0
    assert torch.equal(ours[~mask], torch.zeros_like(ours[~mask]))


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


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("config", "reference"), PPO_CASES, ids=["default", "dual-clip"])
def test_ppo_clip_matches_reference(mode, config, reference):
    inputs = make_inputs(seed=11, per_sequence_advantages=False, spread=0.6)
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


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("config", "reference"), CISPO_CASES, ids=["default", "verl-defaults"])
def test_cispo_matches_reference(mode, config, reference):
    inputs = make_inputs(seed=12, per_sequence_advantages=False, spread=0.6)
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


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("config", "reference", "spread"), GSPO_CASES, ids=["default", "wide"])
def test_gspo_matches_reference(mode, config, reference, spread):
    inputs = make_inputs(seed=13, per_sequence_advantages=True, spread=spread)
    eps_low, eps_high = reference
    mask = inputs["action_mask"]
    log_seq = ((inputs["logprobs"] - inputs["old_logprobs"]) * mask).sum(-1) / mask.sum(-1)
    s = torch.exp(log_seq)
    advantages = inputs["advantages"][:, 0]
    flat = ((advantages > 0) & (s > 1 + eps_high)) | ((advantages < 0) & (s < 1 - eps_low))
    # Some sequences are clipped (no gradient), some are not.
    assert 0 < int(flat.sum()) < len(LENGTHS), s
    compare(GSPO(config), reference_gspo(eps_low, eps_high), inputs, mode)


def test_inputs_are_as_described():
    inputs = make_inputs(seed=11, per_sequence_advantages=False, spread=0.6)
    mask = inputs["action_mask"] > 0
    assert (inputs["advantages"][mask] > 0).any() and (inputs["advantages"][mask] < 0).any()
    assert not torch.equal(inputs["old_logprobs"], inputs["rollout_logprobs"])
    assert (~mask & (inputs["observation_mask"] > 0)).any()
    assert all(math.isfinite(v) for v in inputs["logprobs"].flatten().tolist())
