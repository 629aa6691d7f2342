"""The reinforce loss against values worked out by hand.

Tokens (logprob, ratio, advantage): (-0.5, 2, +1), (-2.0, 0.25, -1), then padding. Old
logprobs are the logprob minus ln(ratio) (ln 2 = 0.6931471805599453, ln 0.25 =
-1.3862943611198906).
"""

from __future__ import annotations

import pytest
import torch
from rllm_loss_ppo.plugin import ReinforceLossConfig
from rllm_loss_ppo.reinforce import Reinforce

BATCH = dict(
    logprobs=[[-0.5, -2.0, -9.0]],
    old_logprobs=[[-1.1931471805599454, -0.6137056388801094, 60.0]],
    advantages=[[1.0, -1.0, 4.0]],
    action_mask=[[1.0, 1.0, 0.0]],
)


def test_importance_weight_scales_the_gradient(loss_context_from_lists):
    # per token -w*A*logp: -2*1*-0.5 = 1.0, -0.25*-1*-2 = -0.5; gradient -w*A: -2, 0.25
    ctx, leaf = loss_context_from_lists(**BATCH)
    out = Reinforce(ReinforceLossConfig())(ctx)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(0.25, abs=1e-12)
    torch.testing.assert_close(
        leaf.grad, torch.tensor([[-1.0, 0.125, 0.0]], dtype=torch.float64), atol=1e-12, rtol=0
    )
    assert out.metrics["ratio_mean"] == pytest.approx(1.125)
    assert out.metrics["ratio_max"] == pytest.approx(2.0)
    assert out.metrics["capped_fraction"] == 0.0


def test_ratio_cap_truncates_the_weight(loss_context_from_lists):
    # weight of the first token becomes 1.5: per token 0.75, gradient -1.5
    ctx, leaf = loss_context_from_lists(**BATCH)
    out = Reinforce(ReinforceLossConfig(ratio_cap=1.5))(ctx)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(0.125, abs=1e-12)
    torch.testing.assert_close(
        leaf.grad, torch.tensor([[-0.75, 0.125, 0.0]], dtype=torch.float64), atol=1e-12, rtol=0
    )
    assert out.metrics["capped_fraction"] == pytest.approx(0.5)
    assert out.metrics["ratio_max"] == pytest.approx(2.0)


def test_on_policy_is_plain_reinforce(loss_context_from_lists):
    # ratio 1: per token -A*logp = 0.5 and -2.0; gradient -A = -1 and +1; mean over 2
    ctx, leaf = loss_context_from_lists(
        [[-0.5, -2.0]], advantages=[[1.0, -1.0]], action_mask=[[1.0, 1.0]]
    )
    out = Reinforce(ReinforceLossConfig())(ctx)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-0.75, abs=1e-12)
    torch.testing.assert_close(leaf.grad, torch.tensor([[-0.5, 0.5]], dtype=torch.float64))
