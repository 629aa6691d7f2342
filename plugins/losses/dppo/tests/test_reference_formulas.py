"""dppo-tv and dppo-kl against the reference formulas of verl 0.9 (``core_algos.py``,
``dppo_tv`` and ``dppo_kl``, the DPPO paper's implementation).

Each reference below is a plain-torch restatement of the published formula, written for this
test; our loss runs on a :class:`~rllm_core.ports.LossContext` built as a trainer builds it
(:class:`~rllm_core.algorithms.aggregation.MaskAwareAggregate` over step normalizers). The test
compares the gradient with respect to the current logprobs and the loss value (both use the
reference's value convention, ``-A * sg(w) * log_prob``) in the three aggregation modes both
have.

The inputs are seeded and fixed: right-padded rows of different lengths (padding and one
observation span hold arbitrary finite values), advantages of both signs, and
``old_logprobs != logprobs`` so that tokens move past the trust region in both directions and
stay inside it; every test asserts that masking really engages on both sides, so it cannot pass
by luck. ``rollout_logprobs`` differ from ``old_logprobs``: verl takes both the ratio and the
divergence against ``old_log_prob``, so ours must use ``ctx.old_logprobs``.

The reference's aggregation, verl's ``agg_loss`` with the whole batch as the step (one rank),
``m`` the response mask and ``L`` the per-token losses::

    token-mean            sum(L * m) / sum(m)
    seq-mean-token-mean   sum over rows with m of (sum_t(L * m) / (sum_t(m) + 1e-8)) / rows with m
    seq-mean-token-sum    sum(L * m) / rows with m
"""

from __future__ import annotations

import pytest
import torch
from rllm_core.algorithms.aggregation import MaskAwareAggregate, make_aggregate, step_normalizers
from rllm_core.ports import LossContext
from rllm_loss_dppo.loss import DPPOKL, DPPOTV
from rllm_loss_dppo.plugin import DPPOKLConfig, DPPOTVConfig

MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum")
LENGTHS = (12, 7, 10, 3, 12, 9, 5, 11)
WIDTH = 12
NO_CAP = 1e4  # the DPPO recipe's clip_ratio_c: larger than any ratio here, i.e. no cap


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


def make_inputs(seed: int) -> dict:
    """Seeded float64 inputs. Token 0 of each row is prompt, tokens 5-6 of long rows an
    observation span; padding holds large finite values a missing mask would reveal. Old
    probabilities spread over (0.08, 0.98) so that moves of the current logprobs give TVs and
    KLs on both sides of the radii."""
    g = torch.Generator().manual_seed(seed)
    batch = len(LENGTHS)
    positions = torch.arange(WIDTH)
    real = positions[None, :] < torch.tensor(LENGTHS)[:, None]
    observation = real & ((positions[None, :] == 5) | (positions[None, :] == 6))
    action = real & (positions[None, :] > 0) & ~observation
    old = -(0.02 + 2.5 * torch.rand(batch, WIDTH, generator=g, dtype=torch.float64))
    current = (old + 0.6 * torch.randn(batch, WIDTH, generator=g, dtype=torch.float64)).clamp(
        max=-1e-3
    )
    rollout = old + 0.3 * torch.randn(batch, WIDTH, generator=g, dtype=torch.float64)
    row_advantage = torch.randn(batch, 1, generator=g, dtype=torch.float64)
    advantages = row_advantage - row_advantage.mean()
    advantages = advantages + torch.randn(batch, WIDTH, generator=g, dtype=torch.float64)
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


def reference_dppo_tv(delta_low: float, delta_high: float, c: float):
    """verl ``dppo_tv`` (DPPO-Binary-TV)::

    ratio = exp(clamp(log_prob - old_log_prob, -20, 20))
    w     = sg(min(ratio, c))                              (truncated IS; c = clip_ratio_c)
    p     = exp(log_prob), q = exp(old_log_prob)
    valid = p - q <= delta_high    where A > 0
            p - q >= -delta_low    elsewhere
    L     = -A * w * log_prob * sg(valid)
    """

    def per_token(log_prob: torch.Tensor, inputs: dict) -> torch.Tensor:
        old = inputs["old_logprobs"]
        advantages = inputs["advantages"]
        ratio = torch.exp(torch.clamp(log_prob - old, -20.0, 20.0))
        w = torch.clamp(ratio, max=c).detach()
        p, q = torch.exp(log_prob), torch.exp(old)
        valid = torch.where(advantages > 0, p - q <= delta_high, p - q >= -delta_low)
        return -advantages * w * log_prob * valid.detach().to(log_prob.dtype)

    return per_token


def reference_binary_kl(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    """verl's binary KL, KL(old || current) of the sampled token::

    q * (log q - log p) + (1 - q) * log((1 - q + 1e-8) / (1 - p + 1e-8))
    """
    p, q = torch.exp(log_prob), torch.exp(old_log_prob)
    return q * (old_log_prob - log_prob) + (1 - q) * torch.log((1 - q + 1e-8) / (1 - p + 1e-8))


def reference_dppo_kl(delta_low: float, delta_high: float, c: float):
    """verl ``dppo_kl`` (DPPO-Binary-KL)::

    ratio = exp(clamp(log_prob - old_log_prob, -20, 20))
    w     = sg(min(ratio, c))
    D     = binary KL(old || current)   (reference_binary_kl)
    valid = D <= delta_high or p <= q   where A > 0
            D <= delta_low or p >= q    elsewhere
    L     = -A * w * log_prob * sg(valid)
    """

    def per_token(log_prob: torch.Tensor, inputs: dict) -> torch.Tensor:
        old = inputs["old_logprobs"]
        advantages = inputs["advantages"]
        ratio = torch.exp(torch.clamp(log_prob - old, -20.0, 20.0))
        w = torch.clamp(ratio, max=c).detach()
        p, q = torch.exp(log_prob), torch.exp(old)
        kl = reference_binary_kl(log_prob, old)
        valid = torch.where(
            advantages > 0, (kl <= delta_high) | (p <= q), (kl <= delta_low) | (p >= q)
        )
        return -advantages * w * log_prob * valid.detach().to(log_prob.dtype)

    return per_token


def masked_by_reference(reference, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Action tokens the reference masks with A > 0 and with A <= 0: a token is masked where
    its per-token loss is 0 with a nonzero advantage and logprob."""
    log_prob = inputs["logprobs"]
    values = reference(log_prob, inputs)
    mask = inputs["action_mask"] > 0
    blocked = mask & (values == 0) & (inputs["advantages"] != 0) & (log_prob != 0)
    return blocked & (inputs["advantages"] > 0), blocked & (inputs["advantages"] <= 0)


def compare(loss, reference, inputs: dict, mode: str) -> None:
    """Our loss and the reference agree in value and in gradient on the current logprobs."""
    ctx = our_context(inputs, mode)
    out = loss(ctx)
    (ours,) = torch.autograd.grad(out.loss, ctx.logprobs)

    leaf = inputs["logprobs"].clone().requires_grad_(True)
    mask = inputs["action_mask"] > 0
    expected = reference_agg(reference(leaf, inputs), mask, mode)
    (theirs,) = torch.autograd.grad(expected, leaf)

    # verl adds 1e-8 to each row's token count in seq-mean-token-mean, ours divides by the
    # exact count: each row's term differs by a relative 1e-8 at most there, none elsewhere.
    rtol, atol = (1e-7, 1e-9) if mode == "seq-mean-token-mean" else (1e-12, 1e-14)
    torch.testing.assert_close(out.loss.detach(), expected.detach(), rtol=rtol, atol=atol)
    torch.testing.assert_close(ours, theirs, rtol=rtol, atol=atol)
    assert torch.equal(ours[~mask], torch.zeros_like(ours[~mask]))

    up, down = masked_by_reference(reference, inputs)
    assert out.metrics["masked_fraction"] == pytest.approx(
        float((up | down).sum()) / float(mask.sum()), abs=1e-12
    )


def assert_masking_engages(reference, inputs: dict) -> None:
    up, down = masked_by_reference(reference, inputs)
    mask = inputs["action_mask"] > 0
    assert up.any() and down.any(), "the trust region must mask tokens on both sides"
    assert int((up | down).sum()) < int(mask.sum()) // 2, "most tokens must stay trained"


TV_CASES = [
    (DPPOTVConfig(), (0.15, 0.15, NO_CAP)),
    (DPPOTVConfig(delta=0.1, ratio_cap=2.0), (0.1, 0.1, 2.0)),
]
KL_CASES = [
    (DPPOKLConfig(), (0.05, 0.05, NO_CAP)),
    (DPPOKLConfig(delta=0.03, ratio_cap=2.0), (0.03, 0.03, 2.0)),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("config", "settings"), TV_CASES, ids=["default", "capped"])
def test_dppo_tv_matches_reference(mode, config, settings):
    inputs = make_inputs(seed=21)
    reference = reference_dppo_tv(*settings)
    assert_masking_engages(reference, inputs)
    if settings[2] < NO_CAP:
        ratio = torch.exp(inputs["logprobs"] - inputs["old_logprobs"])
        assert ((ratio > settings[2]) & (inputs["action_mask"] > 0)).any()
    compare(DPPOTV(config), reference, inputs, mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("config", "settings"), KL_CASES, ids=["default", "capped"])
def test_dppo_kl_matches_reference(mode, config, settings):
    inputs = make_inputs(seed=22)
    reference = reference_dppo_kl(*settings)
    assert_masking_engages(reference, inputs)
    compare(DPPOKL(config), reference, inputs, mode)


def test_kl_direction_decides_some_tokens():
    """The inputs hold tokens the two KL directions judge differently, so the test above would
    fail with KL(current || old)."""
    inputs = make_inputs(seed=22)
    mask = inputs["action_mask"] > 0
    forward = reference_binary_kl(inputs["logprobs"], inputs["old_logprobs"]) > 0.05
    backward = reference_binary_kl(inputs["old_logprobs"], inputs["logprobs"]) > 0.05
    assert (mask & (forward != backward)).any()
