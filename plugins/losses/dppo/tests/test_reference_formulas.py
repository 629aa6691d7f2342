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

The reference's aggregation is verl's ``agg_loss`` with the whole batch as the step (one rank),
restated in :func:`rllm_core.testing.suites.reference.verl_agg_loss`.
"""

from __future__ import annotations

import pytest
import torch
from rllm_core.testing.suites.reference import (
    REFERENCE_MODES,
    assert_matches_reference,
    reference_inputs,
)
from rllm_loss_dppo.loss import DPPOKL, DPPOTV
from rllm_loss_dppo.plugin import DPPOKLConfig, DPPOTVConfig

NO_CAP = 1e4  # the DPPO recipe's clip_ratio_c: larger than any ratio here, i.e. no cap


def make_inputs(seed: int) -> dict:
    """Seeded float64 inputs (:func:`~rllm_core.testing.suites.reference.reference_inputs`). Old
    probabilities spread over (0.08, 0.98) so that moves of the current logprobs give TVs and
    KLs on both sides of the radii."""
    return reference_inputs(seed=seed, spread=0.6, max_logprob=-1e-3)


def reference_dppo(c: float, valid):
    """The per-token loss both verl variants share::

    ratio = exp(clamp(log_prob - old_log_prob, -20, 20))
    w     = sg(min(ratio, c))                              (truncated IS; c = clip_ratio_c)
    L     = -A * w * log_prob * sg(valid)

    where ``valid(log_prob, old_log_prob, A)`` is the variant's trust region.
    """

    def per_token(log_prob: torch.Tensor, inputs: dict) -> torch.Tensor:
        old = inputs["old_logprobs"]
        advantages = inputs["advantages"]
        ratio = torch.exp(torch.clamp(log_prob - old, -20.0, 20.0))
        w = torch.clamp(ratio, max=c).detach()
        keep = valid(log_prob, old, advantages)
        return -advantages * w * log_prob * keep.detach().to(log_prob.dtype)

    return per_token


def reference_dppo_tv(delta_low: float, delta_high: float, c: float):
    """verl ``dppo_tv`` (DPPO-Binary-TV), :func:`reference_dppo` with::

    p     = exp(log_prob), q = exp(old_log_prob)
    valid = p - q <= delta_high    where A > 0
            p - q >= -delta_low    elsewhere
    """

    def valid(log_prob: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor):
        p, q = torch.exp(log_prob), torch.exp(old)
        return torch.where(advantages > 0, p - q <= delta_high, p - q >= -delta_low)

    return reference_dppo(c, valid)


def reference_binary_kl(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    """verl's binary KL, KL(old || current) of the sampled token::

    q * (log q - log p) + (1 - q) * log((1 - q + 1e-8) / (1 - p + 1e-8))
    """
    p, q = torch.exp(log_prob), torch.exp(old_log_prob)
    return q * (old_log_prob - log_prob) + (1 - q) * torch.log((1 - q + 1e-8) / (1 - p + 1e-8))


def reference_dppo_kl(delta_low: float, delta_high: float, c: float):
    """verl ``dppo_kl`` (DPPO-Binary-KL), :func:`reference_dppo` with::

    p     = exp(log_prob), q = exp(old_log_prob)
    D     = binary KL(old || current)   (reference_binary_kl)
    valid = D <= delta_high or p <= q   where A > 0
            D <= delta_low or p >= q    elsewhere
    """

    def valid(log_prob: torch.Tensor, old: torch.Tensor, advantages: torch.Tensor):
        p, q = torch.exp(log_prob), torch.exp(old)
        kl = reference_binary_kl(log_prob, old)
        return torch.where(
            advantages > 0, (kl <= delta_high) | (p <= q), (kl <= delta_low) | (p >= q)
        )

    return reference_dppo(c, valid)


def masked_by_reference(reference, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Action tokens the reference masks with A > 0 and with A <= 0: a token is masked where
    its per-token loss is 0 with a nonzero advantage and logprob."""
    log_prob = inputs["logprobs"]
    values = reference(log_prob, inputs)
    mask = inputs["action_mask"] > 0
    blocked = mask & (values == 0) & (inputs["advantages"] != 0) & (log_prob != 0)
    return blocked & (inputs["advantages"] > 0), blocked & (inputs["advantages"] <= 0)


def compare(loss, reference, inputs: dict, mode: str) -> None:
    """Our loss and the reference agree in value and in gradient on the current logprobs, and
    in the fraction of tokens masked."""
    out, _ = assert_matches_reference(loss, reference, inputs, mode)
    mask = inputs["action_mask"] > 0
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


@pytest.mark.parametrize("mode", REFERENCE_MODES)
@pytest.mark.parametrize(("config", "settings"), TV_CASES, ids=["default", "capped"])
def test_dppo_tv_matches_reference(mode, config, settings):
    inputs = make_inputs(seed=21)
    reference = reference_dppo_tv(*settings)
    assert_masking_engages(reference, inputs)
    if settings[2] < NO_CAP:
        ratio = torch.exp(inputs["logprobs"] - inputs["old_logprobs"])
        assert ((ratio > settings[2]) & (inputs["action_mask"] > 0)).any()
    compare(DPPOTV(config), reference, inputs, mode)


@pytest.mark.parametrize("mode", REFERENCE_MODES)
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
