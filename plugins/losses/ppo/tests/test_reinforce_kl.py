"""The reinforce-kl loss against values worked out by hand.

Logprobs are logs of round probabilities. Tokens (p now, q old = sampler, A), with the
ratio r = p / q and l = ln r:

    row 0: (0.8, 0.5, +1) r 1.6    (0.2, 0.5, -1) r 0.4    (0.5, 0.5, +1) r 1    padding
    row 1: (0.1, 0.01, +1) r 10    (0.5, 0.8, +2) r 0.625  padding               padding

Per token the loss is ``-w * A * ln p + kl_coef * kl`` with ``w`` the clamped ratio (held
constant), so its gradient on ``ln p`` is ``-w * A + kl_coef * dkl``, where ``dkl`` is:

- forward k3, ``kl = r - 1 - l``: ``r - 1`` (0.6, -0.6, 0, 9, -0.375);
- backward k3, ``kl = 1/r - 1 + l``: ``1 - 1/r`` (0.375, -1.5, 0, 0.9, -0.6);
- forward k1, ``kl = -l``: -1; backward k2, ``kl = l**2 / 2``: ``l``.

With token-mean over the 5 action tokens, each gradient is divided by 5. Loss sums (the
values ``-w * A * ln p + kl_coef * kl`` added over the action tokens) were computed in plain
float64 from those formulas.
"""

from __future__ import annotations

import math

import pytest
import torch
from rllm_core.algorithms.objective import LossInputs
from rllm_core.plan.load import parse_plan
from rllm_core.plan.resolve import resolve_plan
from rllm_core.plugins import PluginManager
from rllm_core.training.update import build_objective
from rllm_loss_ppo import plugin
from rllm_loss_ppo.plugin import ReinforceKLConfig, ReinforceLossConfig
from rllm_loss_ppo.reinforce import Reinforce
from rllm_loss_ppo.reinforce_kl import ReinforceKL

LN = {p: math.log(p) for p in (0.8, 0.5, 0.2, 0.1, 0.01)}

BATCH = dict(
    logprobs=[[LN[0.8], LN[0.2], LN[0.5], 3.0], [LN[0.1], LN[0.5], -40.0, 0.0]],
    old_logprobs=[[LN[0.5], LN[0.5], LN[0.5], -50.0], [LN[0.01], LN[0.8], 7.0, 0.0]],
    advantages=[[1.0, -1.0, 1.0, 3.0], [1.0, 2.0, 5.0, 5.0]],
    action_mask=[[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]],
)


def _grad(row0: list[float], row1: list[float], divisor: float) -> torch.Tensor:
    return torch.tensor([[*row0, 0.0], [*row1, 0.0, 0.0]], dtype=torch.float64) / divisor


CASES = {
    "forward-k3-clamped": (
        {
            "kl_coef": 0.5,
            "direction": "forward",
            "kl_approx": "k3",
            "ratio_clamp_min": 0.5,
            "ratio_clamp_max": 2.0,
        },
        9.336414887573708,
        ([-1.3, 0.2, -1.0], [2.5, -1.4375]),
    ),
    "backward-k3": (
        {"kl_coef": 1.0, "direction": "backward", "kl_approx": "k3"},
        26.509980964449316,
        ([-1.225, -1.1, -1.0], [-9.1, -1.85]),
    ),
    "forward-k1-capped": (
        {"kl_coef": 0.25, "direction": "forward", "kl_approx": "k1", "ratio_clamp_max": 2.0},
        5.531432269097091,
        ([-1.85, 0.15, -1.25], [-2.25, -1.5]),
    ),
    "backward-k2-floored": (
        {"kl_coef": 2.0, "direction": "backward", "kl_approx": "k2", "ratio_clamp_min": 0.5},
        30.721036450891212,
        # -w * A + 2 * l: l = ln 1.6, ln 0.4, 0, ln 10, ln 0.625
        (
            [-1.6 + 2 * math.log(1.6), 0.5 + 2 * math.log(0.4), -1.0],
            [-10.0 + 2 * math.log(10.0), -1.25 + 2 * math.log(0.625)],
        ),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_value_and_gradient_are_hand_computed(loss_context_from_lists, case):
    options, total, (row0, row1) = CASES[case]
    ctx, leaf = loss_context_from_lists(**BATCH)
    out = ReinforceKL(ReinforceKLConfig(**options))(ctx)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(total / 5, abs=1e-12)
    torch.testing.assert_close(leaf.grad, _grad(row0, row1, 5), atol=1e-12, rtol=0)


def test_ratio_and_kl_metrics(loss_context_from_lists):
    options, _, _ = CASES["forward-k3-clamped"]
    ctx, _ = loss_context_from_lists(**BATCH)
    metrics = ReinforceKL(ReinforceKLConfig(**options))(ctx).metrics
    # ratios 1.6, 0.4, 1, 10, 0.625; clamped to [0.5, 2]: 0.4 and 10.
    assert metrics["ratio_mean"] == pytest.approx(13.625 / 5, abs=1e-12)
    assert metrics["ratio_min"] == pytest.approx(0.4, abs=1e-12)
    assert metrics["ratio_max"] == pytest.approx(10.0, abs=1e-12)
    assert metrics["clamped_fraction"] == pytest.approx(2 / 5)
    # forward k3 per token r - 1 - ln r: row sums 0.44628710262841953 and 6.792418536251689
    assert metrics["kl_mean"] == pytest.approx(7.238705638880108 / 5, abs=1e-12)
    assert metrics["kl_seq_mean"] == pytest.approx(
        (0.44628710262841953 + 6.792418536251689) / 2, abs=1e-12
    )


def test_the_kl_is_anchored_on_the_samplers_logprobs(loss_context_from_lists):
    # Old logprobs equal to the current ones: the weight is 1, while the KL still measures
    # the gap to the sampler. Gradient -A + 0.5 * (r - 1), r = p / sampler's p.
    batch = dict(BATCH, rollout_logprobs=BATCH["old_logprobs"], old_logprobs=BATCH["logprobs"])
    ctx, leaf = loss_context_from_lists(**batch)
    config = ReinforceKLConfig(kl_coef=0.5, direction="forward", kl_approx="k3")
    out = ReinforceKL(config)(ctx)
    out.loss.backward()
    torch.testing.assert_close(
        leaf.grad, _grad([-0.7, 0.7, -1.0], [3.5, -2.1875], 5), atol=1e-12, rtol=0
    )
    assert out.metrics["ratio_mean"] == 1.0 and out.metrics["clamped_fraction"] == 0.0


def test_without_the_kl_it_is_the_capped_reinforce_loss(loss_context_from_lists):
    ctx, leaf = loss_context_from_lists(**BATCH)
    ReinforceKL(ReinforceKLConfig(kl_coef=0.0, ratio_clamp_max=2.0))(ctx).loss.backward()
    other, other_leaf = loss_context_from_lists(**BATCH)
    expected = Reinforce(ReinforceLossConfig(ratio_cap=2.0))(other).loss
    expected.backward()
    assert torch.equal(leaf.grad, other_leaf.grad)


def test_a_pinned_aggregation_overrides_the_context_mode(loss_context_from_lists):
    # The context reduces with token-mean; the pin makes the loss divide by the 2 sequences.
    options, total, (row0, row1) = CASES["forward-k3-clamped"]
    ctx, leaf = loss_context_from_lists(**BATCH, mode="token-mean")
    config = ReinforceKLConfig(**options, aggregation="seq-mean-token-sum")
    out = ReinforceKL(config)(ctx)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(total / 2, abs=1e-12)
    torch.testing.assert_close(leaf.grad, _grad(row0, row1, 2), atol=1e-12, rtol=0)


def test_a_plan_leaving_the_aggregation_unset_trains_with_the_pinned_mode():
    manager = PluginManager(load_entry_points=False)
    manager.register(plugin, name="ppo", distribution="rllm-loss-ppo")
    options, total, _ = CASES["forward-k3-clamped"]
    loss = {"name": "reinforce-kl", "aggregation": "seq-mean-token-sum"} | options
    resolved = resolve_plan(parse_plan({"algorithm": {"loss": loss}}), manager=manager)
    objective = build_objective(resolved, resolved.components["[algorithm].loss"].build(), [])
    assert objective.aggregation == "seq-mean-token-sum"

    def tensor(rows):
        return torch.tensor(rows, dtype=torch.float64)

    mask = tensor(BATCH["action_mask"])
    step = objective.begin([mask], [torch.zeros_like(mask)])
    value = step.evaluate(
        LossInputs(
            logprobs=tensor(BATCH["logprobs"]).requires_grad_(),
            rollout_logprobs=tensor(BATCH["old_logprobs"]),
            advantages=tensor(BATCH["advantages"]),
            action_mask=mask,
            observation_mask=torch.zeros_like(mask),
        )
    )
    assert value.item() == pytest.approx(total / 2, abs=1e-12)
    assert step.metrics()["reinforce-kl/clamped_fraction"] == pytest.approx(2 / 5)
