"""gspo against values worked out by hand.

Row 0: token log-ratios 0.1, -0.1, 0.3 -> mean 0.1, s = e^0.1 = 1.1051709180756477, A = +1:
inside [0.8, 1.2], loss -s on each of its 3 tokens.
Row 1: log-ratios 0.5, 0.5 (+ padding) -> s = e^0.5 = 1.6487212707001282, A = +1: clipped,
loss -1.2 on each of 2 tokens, no gradient.
Row 2: log-ratios -0.5, -0.5 (+ padding) -> s = e^-0.5 = 0.6065306597126334, A = -1:
clipped, loss 0.8 on each of 2 tokens, no gradient.
"""

from __future__ import annotations

import pytest
import torch
from rllm_loss_ppo.gspo import GSPO
from rllm_loss_ppo.plugin import GSPOConfig

BATCH = dict(
    logprobs=[[-1.0, -2.0, -0.5], [-0.3, -0.7, 9.0], [-1.0, -1.0, -1.0]],
    old_logprobs=[[-1.1, -1.9, -0.8], [-0.8, -1.2, -9.0], [-0.5, -0.5, -1.0]],
    advantages=[[1.0, 1.0, 1.0], [1.0, 1.0, 5.0], [-1.0, -1.0, 0.0]],
    action_mask=[[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [1.0, 1.0, 0.0]],
)
WIDE = GSPOConfig(eps_low=0.2, eps_high=0.2)


def test_token_mean(loss_context_from_lists):
    ctx, leaf = loss_context_from_lists(**BATCH)
    out = GSPO(WIDE)(ctx)
    out.loss.backward()
    # (3 * -1.1051709180756477 - 2 * 1.2 + 2 * 0.8) / 7
    assert out.loss.item() == pytest.approx(-0.5879303934609919, abs=1e-12)
    # every row-0 token moves s by s/3 and s appears on 3 tokens: gradient -s / 7
    g = -0.15788155972509253
    expected = torch.tensor([[g, g, g], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(leaf.grad, expected, atol=1e-12, rtol=0)
    assert out.metrics["clip_fraction"] == pytest.approx(4 / 7)
    assert out.metrics["ratio_mean"] == pytest.approx(1.1201409494961364)
    assert out.metrics["ratio_max"] == pytest.approx(1.6487212707001282)


def test_seq_mean_token_mean_is_the_sequence_objective(loss_context_from_lists):
    ctx, leaf = loss_context_from_lists(**BATCH, mode="seq-mean-token-mean")
    out = GSPO(WIDE)(ctx)
    out.loss.backward()
    # (-1.1051709180756477 - 1.2 + 0.8) / 3
    assert out.loss.item() == pytest.approx(-0.5017236393585492, abs=1e-12)
    g = -0.12279676867507197  # -s / 9
    torch.testing.assert_close(
        leaf.grad,
        torch.tensor([[g, g, g], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64),
        atol=1e-12,
        rtol=0,
    )


def test_default_range_is_the_papers_narrow_one(loss_context_from_lists):
    # s = e^0.1 is far outside [1 - 3e-4, 1 + 4e-4]: row 0 is clipped at 1.0004.
    ctx, leaf = loss_context_from_lists(
        [[-1.0, -2.0, -0.5]],
        old_logprobs=[[-1.1, -1.9, -0.8]],
        advantages=[[1.0, 1.0, 1.0]],
        action_mask=[[1.0, 1.0, 1.0]],
    )
    out = GSPO(GSPOConfig())(ctx)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-1.0004, abs=1e-12)
    assert torch.equal(leaf.grad, torch.zeros_like(leaf))
    assert out.metrics["clip_fraction"] == 1.0


def test_a_row_without_action_tokens_is_ignored(loss_context_from_lists):
    ctx, leaf = loss_context_from_lists(
        [[-1.0, -2.0], [-3.0, -4.0]],
        old_logprobs=[[-1.0, -2.0], [30.0, -30.0]],
        advantages=[[2.0, 2.0], [7.0, 7.0]],
        action_mask=[[1.0, 1.0], [0.0, 0.0]],
    )
    out = GSPO(GSPOConfig())(ctx)
    out.loss.backward()
    # row 0 is on-policy: s = 1, loss -A * s = -2 on both tokens, so the mean is -2 * s;
    # ds/dlogp_t = s / 2, hence gradient -2 * 0.5 = -1 on each
    assert out.loss.item() == pytest.approx(-2.0, abs=1e-12)
    torch.testing.assert_close(
        leaf.grad, torch.tensor([[-1.0, -1.0], [0.0, 0.0]], dtype=torch.float64)
    )
    assert out.metrics["ratio_mean"] == pytest.approx(1.0)
    assert out.metrics["ratio_max"] == pytest.approx(1.0)
