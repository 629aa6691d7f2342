"""cispo against values worked out by hand.

Tokens (logprob, ratio, advantage): (-0.5, 2, +1), (-2.0, 0.25, -1), (-1.0, 1, +0.5), then a
padding token. Old logprobs are the logprob minus ln(ratio): ln 2 = 0.6931471805599453,
ln 0.25 = -1.3862943611198906.
"""

from __future__ import annotations

import pytest
import torch
from rllm_loss_ppo.cispo import CISPO
from rllm_loss_ppo.plugin import CISPOConfig

BATCH = dict(
    logprobs=[[-0.5, -2.0, -1.0, 40.0]],
    old_logprobs=[[-1.1931471805599454, -0.6137056388801094, -1.0, -40.0]],
    advantages=[[1.0, -1.0, 0.5, 3.0]],
    action_mask=[[1.0, 1.0, 1.0, 0.0]],
)


def test_defaults_have_no_lower_bound(loss_context_from_lists):
    # weights: clip(2, 0, 1.28) = 1.28, clip(0.25, 0, 1.28) = 0.25, 1.0
    # per token -w*A*logp: 0.64, -0.5, 0.5; gradient -w*A: -1.28, 0.25, -0.5; mean over 3
    ctx, leaf = loss_context_from_lists(**BATCH)
    out = CISPO(CISPOConfig())(ctx)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(0.21333333333333335, abs=1e-12)
    expected = torch.tensor(
        [[-0.4266666666666667, 0.08333333333333333, -0.16666666666666666, 0.0]],
        dtype=torch.float64,
    )
    torch.testing.assert_close(leaf.grad, expected, atol=1e-12, rtol=0)
    assert out.metrics["clip_fraction"] == pytest.approx(1 / 3)
    assert out.metrics["ratio_mean"] == pytest.approx(1.0833333333333333)
    assert out.metrics["ratio_max"] == pytest.approx(2.0)


def test_symmetric_clip_bounds_the_weight_from_both_sides(loss_context_from_lists):
    # weights: 1.2, 0.8, 1.0 -> per token 0.6, -1.6, 0.5; gradient -1.2, 0.8, -0.5
    ctx, leaf = loss_context_from_lists(**BATCH)
    out = CISPO(CISPOConfig(eps_low=0.2, eps_high=0.2))(ctx)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-0.16666666666666666, abs=1e-12)
    expected = torch.tensor(
        [[-0.4, 0.26666666666666666, -0.16666666666666666, 0.0]], dtype=torch.float64
    )
    torch.testing.assert_close(leaf.grad, expected, atol=1e-12, rtol=0)
    assert out.metrics["clip_fraction"] == pytest.approx(2 / 3)


def test_a_clipped_token_keeps_its_gradient(loss_context_from_lists):
    # PPO would give ratio 2 with A = +1 no gradient; CISPO keeps -1.28.
    ctx, leaf = loss_context_from_lists(
        [[-0.5]], old_logprobs=[[-1.1931471805599454]], advantages=[[1.0]], action_mask=[[1.0]]
    )
    CISPO(CISPOConfig())(ctx).loss.backward()
    assert leaf.grad.item() == pytest.approx(-1.28, abs=1e-12)
