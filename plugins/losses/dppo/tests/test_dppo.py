"""dppo-tv and dppo-kl against values worked out by hand.

Logprobs are logs of round probabilities: ln 0.5 = -0.6931471805599453, ln 0.8 =
-0.2231435513142097, ln 0.55 = -0.5978370007556204, ln 0.2 = -1.6094379124341003, ln 0.1 =
-2.3025850929940455, ln 0.01 = -4.605170185988091.

Tokens (p now, q at rollout, A), ratio p/q, binary TV |p - q|, binary KL:
    (0.8, 0.5, +1)   ratio 1.6   TV 0.3    KL 0.19274475702175753   away
    (0.8, 0.5, -1)   ratio 1.6   TV 0.3    KL 0.19274475702175753   back toward q
    (0.55, 0.5, +1)  ratio 1.1   TV 0.05   KL 0.005008366846356839  away
    (0.2, 0.5, -1)   ratio 0.4   TV 0.3    KL 0.19274475702175753   away
    (0.2, 0.5, +2)   ratio 0.4   TV 0.3    KL 0.19274475702175753   back toward q
    (0.1, 0.01, +1)  ratio 10    TV 0.09   KL 0.14447934747551233   away
then one padding token per row.
"""

from __future__ import annotations

import pytest
import torch
from rllm_loss_dppo.loss import DPPOKL, DPPOTV
from rllm_loss_dppo.plugin import DPPOKLConfig, DPPOTVConfig

LN_0_5 = -0.6931471805599453
LN_0_8 = -0.2231435513142097
LN_0_55 = -0.5978370007556204
LN_0_2 = -1.6094379124341003
LN_0_1 = -2.3025850929940455
LN_0_01 = -4.605170185988091

BATCH = dict(
    logprobs=[[LN_0_8, LN_0_8, LN_0_55, 3.0], [LN_0_2, LN_0_2, LN_0_1, -40.0]],
    rollout_logprobs=[[LN_0_5, LN_0_5, LN_0_5, -50.0], [LN_0_5, LN_0_5, LN_0_01, 7.0]],
    # The proximal policy plays no part in DPPO: make it equal to the current one.
    old_logprobs=[[LN_0_8, LN_0_8, LN_0_55, 3.0], [LN_0_2, LN_0_2, LN_0_1, -40.0]],
    advantages=[[1.0, -1.0, 1.0, 3.0], [-1.0, 2.0, 1.0, 3.0]],
    action_mask=[[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]],
)


def test_tv_masks_tokens_moving_away_past_delta(loss_context_from_lists):
    # masked: (0.8, 0.5, +1) and (0.2, 0.5, -1). Others: -ratio * A = 1.6, -1.1, -0.8, -10,
    # gradient the same (d ratio / d logprob = ratio). Mean over 6 action tokens.
    ctx, leaf = loss_context_from_lists(**BATCH)
    out = DPPOTV(DPPOTVConfig())(ctx)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-1.7166666666666668, abs=1e-12)
    expected = torch.tensor(
        [
            [0.0, 0.26666666666666666, -0.18333333333333335, 0.0],
            [0.0, -0.13333333333333333, -1.6666666666666667, 0.0],
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(leaf.grad, expected, atol=1e-12, rtol=0)
    assert out.metrics["masked_fraction"] == pytest.approx(2 / 6)
    assert out.metrics["divergence_mean"] == pytest.approx(0.22333333333333336)
    assert out.metrics["ratio_mean"] == pytest.approx(2.5166666666666666)
    assert out.metrics["ratio_max"] == pytest.approx(10.0)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", -1.7166666666666668),  # -10.3 over 6 tokens
        # rows: (1.6 - 1.1) / 3 and (-0.8 - 10) / 3, then the mean of the two
        ("seq-mean-token-mean", -1.7166666666666668),
        ("seq-mean-token-sum", -5.15),  # -10.3 over 2 sequences
        ("seq-mean-token-sum-norm", -1.2875),  # -10.3 over 2 sequences * length 4
    ],
)
def test_every_aggregation_mode(loss_context_from_lists, mode, expected):
    ctx, _ = loss_context_from_lists(**BATCH, mode=mode, norm_length=4)
    assert DPPOTV(DPPOTVConfig())(ctx).loss.item() == pytest.approx(expected, abs=1e-12)


def test_kl_also_masks_the_rare_token_whose_tv_is_small(loss_context_from_lists):
    # (0.1, 0.01, +1) has TV 0.09 < 0.15 but KL 0.144 > 0.05: masked as well.
    # Remaining: 1.6 - 1.1 - 0.8 over 6 tokens.
    ctx, leaf = loss_context_from_lists(**BATCH)
    out = DPPOKL(DPPOKLConfig())(ctx)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-0.05, abs=1e-12)
    expected = torch.tensor(
        [
            [0.0, 0.26666666666666666, -0.18333333333333335, 0.0],
            [0.0, -0.13333333333333333, 0.0, 0.0],
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(leaf.grad, expected, atol=1e-12, rtol=0)
    assert out.metrics["masked_fraction"] == pytest.approx(0.5)
    assert out.metrics["divergence_mean"] == pytest.approx(0.15341112373481655)


@pytest.mark.parametrize(
    ("loss_cls", "config"), [(DPPOTV, DPPOTVConfig()), (DPPOKL, DPPOKLConfig())]
)
def test_rare_token_with_a_huge_ratio_is_not_masked(loss_context_from_lists, loss_cls, config):
    # q = 1e-5 -> p = 1e-3: ratio 100 (PPO would clip it), TV 0.00099, KL 0.0036: kept.
    # ln 1e-3 = -6.907755278982137, ln 1e-5 = -11.512925464970229
    ctx, leaf = loss_context_from_lists(
        [[-6.907755278982137]],
        rollout_logprobs=[[-11.512925464970229]],
        advantages=[[1.0]],
        action_mask=[[1.0]],
    )
    out = loss_cls(config)(ctx)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-100.0, rel=1e-9)
    assert leaf.grad.item() == pytest.approx(-100.0, rel=1e-9)
    assert out.metrics["masked_fraction"] == 0.0


@pytest.mark.parametrize(
    ("loss_cls", "config"), [(DPPOTV, DPPOTVConfig()), (DPPOKL, DPPOKLConfig())]
)
def test_likely_token_dropping_inside_the_ppo_range_is_masked(
    loss_context_from_lists, loss_cls, config
):
    # q = 0.98 -> p = 0.82 with A < 0: ratio 0.837 is inside PPO's [0.8, 1.2], but TV 0.16 and
    # KL 0.249 are past the defaults. ln 0.82 = -0.19845093872383832, ln 0.98 =
    # -0.020202707317519466
    ctx, leaf = loss_context_from_lists(
        [[-0.19845093872383832]],
        rollout_logprobs=[[-0.020202707317519466]],
        advantages=[[-1.0]],
        action_mask=[[1.0]],
    )
    out = loss_cls(config)(ctx)
    out.loss.backward()
    assert out.loss.item() == 0.0
    assert leaf.grad.item() == 0.0
    assert out.metrics["masked_fraction"] == 1.0


def test_delta_is_the_radius(loss_context_from_lists):
    # With delta 0.35 no token of the batch is past the TV radius: nothing is masked.
    # 0 masked -> per token -1.6*1, 1.6, -1.1, 0.4*-1*-1 = 0.4, -0.8, -10 -> sum -11.5 over 6
    ctx, _ = loss_context_from_lists(**BATCH)
    out = DPPOTV(DPPOTVConfig(delta=0.35))(ctx)
    assert out.loss.item() == pytest.approx(-11.5 / 6, abs=1e-12)
    assert out.metrics["masked_fraction"] == 0.0


def test_anchored_on_rollout_not_old_logprobs(loss_context_from_lists):
    # Same current and rollout logprobs as the first test, but a different proximal policy:
    # nothing changes.
    batch = dict(BATCH, old_logprobs=[[0.0, -1.0, -2.0, -3.0], [-4.0, -5.0, -6.0, -7.0]])
    ctx, _ = loss_context_from_lists(**batch)
    assert DPPOTV(DPPOTVConfig())(ctx).loss.item() == pytest.approx(-1.7166666666666668)


def test_ratio_cap_caps_value_and_scales_gradient(loss_context_from_lists):
    # (0.8, 0.5, -1) moves back toward q and is kept; ratio 1.6 capped at 1.2:
    # loss -1.2 * -1 = 1.2, gradient -A * ratio * (1.2 / 1.6) = 1.2
    ctx, leaf = loss_context_from_lists(
        [[LN_0_8]], rollout_logprobs=[[LN_0_5]], advantages=[[-1.0]], action_mask=[[1.0]]
    )
    out = DPPOTV(DPPOTVConfig(ratio_cap=1.2))(ctx)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(1.2, abs=1e-12)
    assert leaf.grad.item() == pytest.approx(1.2, abs=1e-12)
    assert out.metrics["ratio_max"] == pytest.approx(1.6)


def test_ratio_cap_leaves_smaller_ratios_bit_for_bit(loss_context_from_lists):
    ctx, _ = loss_context_from_lists(**BATCH)
    capped = DPPOTV(DPPOTVConfig(ratio_cap=100.0))(ctx).loss
    plain = DPPOTV(DPPOTVConfig())(ctx).loss
    assert torch.equal(capped, plain)


def test_zero_advantages_mask_nothing(loss_context_from_lists):
    ctx, leaf = loss_context_from_lists(
        [[LN_0_8, LN_0_2]],
        rollout_logprobs=[[LN_0_5, LN_0_5]],
        advantages=[[0.0, 0.0]],
        action_mask=[[1.0, 1.0]],
    )
    out = DPPOKL(DPPOKLConfig())(ctx)
    out.loss.backward()
    assert out.loss.item() == 0.0
    assert torch.equal(leaf.grad, torch.zeros_like(leaf))
    assert out.metrics["masked_fraction"] == 0.0
