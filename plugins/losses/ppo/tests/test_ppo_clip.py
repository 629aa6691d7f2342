"""ppo-clip against values worked out by hand.

Old logprobs are 0, so each logprob below is the log of the ratio it produces:
ln 1.5 = 0.4054651081081644, ln 0.5 = -0.6931471805599453, ln 1.1 = 0.09531017980432493,
ln 1.25 = 0.22314355131420976, ln 2 = 0.6931471805599453, ln 4 = 1.3862943611198906.
"""

from __future__ import annotations

import pytest
import torch
from rllm_loss_ppo.plugin import PPOClipConfig
from rllm_loss_ppo.ppo_clip import PPOClip

LN_1_5 = 0.4054651081081644
LN_0_5 = -0.6931471805599453
LN_1_1 = 0.09531017980432493
LN_1_25 = 0.22314355131420976
LN_2 = 0.6931471805599453
LN_4 = 1.3862943611198906

# Row 0: ratio 1.5 with A=+1 (clipped to 1.2: loss -1.2, no gradient), ratio 0.5 with A=+1
# (unclipped: loss -0.5, d/dlogp = -A*ratio = -0.5), ratio 1.5 with A=-1 (unclipped: loss 1.5,
# gradient 1.5). Row 1: ratio 0.5 with A=-1 (clipped to 0.8: loss 0.8, no gradient), ratio 1.1
# with A=2 (inside the range: loss -2.2, gradient -2.2), then a padding token holding garbage.
BATCH = dict(
    logprobs=[[LN_1_5, LN_0_5, LN_1_5], [LN_0_5, LN_1_1, 123.0]],
    old_logprobs=[[0.0, 0.0, 0.0], [0.0, 0.0, -77.0]],
    advantages=[[1.0, 1.0, -1.0], [-1.0, 2.0, 1e6]],
    action_mask=[[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]],
)


def test_token_mean_loss_gradient_and_metrics(loss_context_from_lists):
    ctx, leaf = loss_context_from_lists(**BATCH)
    out = PPOClip(PPOClipConfig())(ctx)
    # (-1.2 - 0.5 + 1.5 + 0.8 - 2.2) / 5
    assert out.loss.item() == pytest.approx(-0.32, abs=1e-12)
    out.loss.backward()
    expected = torch.tensor([[0.0, -0.1, 0.3], [0.0, -0.44, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(leaf.grad, expected, atol=1e-12, rtol=0)
    assert leaf.grad[1, 2].item() == 0.0
    assert out.metrics["clip_fraction"] == pytest.approx(0.4)
    assert out.metrics["ratio_mean"] == pytest.approx(1.02)  # (1.5+0.5+1.5+0.5+1.1) / 5
    assert out.metrics["ratio_max"] == pytest.approx(1.5)
    assert "dual_clip_fraction" not in out.metrics


def test_reduces_through_the_plan_aggregation(loss_context_from_lists):
    ctx, leaf = loss_context_from_lists(**BATCH, mode="seq-mean-token-mean")
    out = PPOClip(PPOClipConfig())(ctx)
    # row means: (-1.2 - 0.5 + 1.5) / 3 = -0.0666..., (0.8 - 2.2) / 2 = -0.7; then / 2 rows
    assert out.loss.item() == pytest.approx(-0.38333333333333336, abs=1e-12)
    out.loss.backward()
    expected = torch.tensor(
        [[0.0, -0.08333333333333333, 0.25], [0.0, -0.55, 0.0]], dtype=torch.float64
    )
    torch.testing.assert_close(leaf.grad, expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", -0.32),  # -1.6 over 5 tokens
        ("seq-mean-token-mean", -0.38333333333333336),
        ("seq-mean-token-sum", -0.8),  # -1.6 over 2 sequences
        ("seq-mean-token-sum-norm", -0.26666666666666666),  # -1.6 over 2 sequences * length 3
    ],
)
def test_every_aggregation_mode(loss_context_from_lists, mode, expected):
    ctx, _ = loss_context_from_lists(**BATCH, mode=mode, norm_length=3)
    assert PPOClip(PPOClipConfig())(ctx).loss.item() == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    ("eps_high", "loss", "grad"),
    [(0.2, -1.2, 0.0), (0.28, -1.25, -1.25)],
    ids=["symmetric", "clip-higher"],
)
def test_clip_higher_lets_a_ratio_of_1_25_through(loss_context_from_lists, eps_high, loss, grad):
    ctx, leaf = loss_context_from_lists(
        [[LN_1_25]], old_logprobs=[[0.0]], advantages=[[1.0]], action_mask=[[1.0]]
    )
    out = PPOClip(PPOClipConfig(eps_high=eps_high))(ctx)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(loss, abs=1e-12)
    assert leaf.grad.item() == pytest.approx(grad, abs=1e-12)


def test_eps_low_sets_the_lower_clip(loss_context_from_lists):
    # ratio 0.5, A = -1: clip(0.5, 0.6, 1.2) = 0.6 -> loss max(0.5, 0.6) = 0.6, no gradient
    ctx, leaf = loss_context_from_lists(
        [[LN_0_5]], old_logprobs=[[0.0]], advantages=[[-1.0]], action_mask=[[1.0]]
    )
    out = PPOClip(PPOClipConfig(eps_low=0.4))(ctx)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(0.6, abs=1e-12)
    assert leaf.grad.item() == 0.0


def test_dual_clip_caps_negative_advantage_tokens(loss_context_from_lists):
    # A = -1 at ratios 4 and 2, c = 3: the first loss 4 is capped at 3 (no gradient), the
    # second (2) stays with gradient -A*ratio = 2. Mean over 2 tokens.
    batch = dict(
        logprobs=[[LN_4, LN_2]],
        old_logprobs=[[0.0, 0.0]],
        advantages=[[-1.0, -1.0]],
        action_mask=[[1.0, 1.0]],
    )
    ctx, leaf = loss_context_from_lists(**batch)
    out = PPOClip(PPOClipConfig(dual_clip_c=3.0))(ctx)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(2.5, abs=1e-12)
    torch.testing.assert_close(leaf.grad, torch.tensor([[0.0, 1.0]], dtype=torch.float64))
    assert out.metrics["dual_clip_fraction"] == pytest.approx(0.5)

    ctx, leaf = loss_context_from_lists(**batch)
    plain = PPOClip(PPOClipConfig())(ctx)
    plain.loss.backward()
    assert plain.loss.item() == pytest.approx(3.0, abs=1e-12)
    torch.testing.assert_close(leaf.grad, torch.tensor([[2.0, 1.0]], dtype=torch.float64))


def test_dual_clip_leaves_positive_advantages_alone(loss_context_from_lists):
    # A = +1 at ratio 4: clipped to 1.2 -> loss -1.2; dual clip must not touch it.
    ctx, _ = loss_context_from_lists(
        [[LN_4]], old_logprobs=[[0.0]], advantages=[[1.0]], action_mask=[[1.0]]
    )
    out = PPOClip(PPOClipConfig(dual_clip_c=3.0))(ctx)
    assert out.loss.item() == pytest.approx(-1.2, abs=1e-12)
    assert out.metrics["dual_clip_fraction"] == 0.0


def test_no_action_token_gives_zero_loss_and_zero_metrics(loss_context_from_lists):
    ctx, leaf = loss_context_from_lists(
        [[-1.0, -2.0]],
        old_logprobs=[[-3.0, 5.0]],
        advantages=[[1.0, -1.0]],
        action_mask=[[0.0, 0.0]],
    )
    out = PPOClip(PPOClipConfig())(ctx)
    out.loss.backward()
    assert out.loss.item() == 0.0
    assert torch.equal(leaf.grad, torch.zeros_like(leaf))
    assert out.metrics == {"clip_fraction": 0.0, "ratio_mean": 0.0, "ratio_max": 0.0}
