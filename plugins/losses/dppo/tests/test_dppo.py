"""dppo-tv and dppo-kl against values worked out by hand.

Logprobs are logs of round probabilities: ln 0.5 = -0.6931471805599453, ln 0.8 =
-0.2231435513142097, ln 0.55 = -0.5978370007556204, ln 0.2 = -1.6094379124341003, ln 0.1 =
-2.3025850929940455, ln 0.01 = -4.605170185988091.

Both losses anchor on the OLD policy (``old_logprobs``). Tokens (p now, q old, A), ratio p/q,
binary TV |p - q|, binary KL(old || current) = q ln(q/p) + (1-q) ln((1-q+1e-8)/(1-p+1e-8)):
    (0.8, 0.5, +1)   ratio 1.6   TV 0.3    KL 0.2231435363142104    away
    (0.8, 0.5, -1)   ratio 1.6   TV 0.3    KL 0.2231435363142104    back toward q
    (0.55, 0.5, +1)  ratio 1.1   TV 0.05   KL 0.00502516681563972   away
    (0.2, 0.5, -1)   ratio 0.4   TV 0.3    KL 0.22314355506420971   away
    (0.2, 0.5, +2)   ratio 0.4   TV 0.3    KL 0.22314355506420971   back toward q
    (0.1, 0.01, +1)  ratio 10    TV 0.09   KL 0.07133122607634115   away
then one padding token per row.

Value convention (the reference implementation's): a kept token's loss is -A * ratio * ln p
with the ratio detached, so its gradient on ln p is -A * ratio, the ratio surrogate's.
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
    old_logprobs=[[LN_0_5, LN_0_5, LN_0_5, -50.0], [LN_0_5, LN_0_5, LN_0_01, 7.0]],
    # The sampler's logprobs play no part in DPPO when the old ones are given: make them
    # equal to the current ones.
    rollout_logprobs=[[LN_0_8, LN_0_8, LN_0_55, 3.0], [LN_0_2, LN_0_2, LN_0_1, -40.0]],
    advantages=[[1.0, -1.0, 1.0, 3.0], [-1.0, 2.0, 1.0, 3.0]],
    action_mask=[[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]],
)

# Kept tokens' values -A * ratio * ln p: (0.8, -1) 1.6 ln 0.8 = -0.35702968210273556,
# (0.55, +1) -1.1 ln 0.55 = 0.6576207008311825, (0.2, +2) -0.8 ln 0.2 = 1.2875503299472804,
# (0.1, +1) -10 ln 0.1 = 23.025850929940454; their sum is 24.61399227861618.
TV_SUM = 24.61399227861618
# Gradients -A * ratio / 6 (token-mean over 6 action tokens) on kept tokens.
TV_GRAD = [
    [0.0, 0.26666666666666666, -0.18333333333333335, 0.0],
    [0.0, -0.13333333333333333, -1.6666666666666667, 0.0],
]


def test_tv_masks_tokens_moving_away_past_delta(loss_context_from_lists):
    # masked: (0.8, 0.5, +1) and (0.2, 0.5, -1).
    ctx, leaf = loss_context_from_lists(**BATCH)
    out = DPPOTV(DPPOTVConfig())(ctx)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(TV_SUM / 6, abs=1e-12)
    expected = torch.tensor(TV_GRAD, dtype=torch.float64)
    torch.testing.assert_close(leaf.grad, expected, atol=1e-12, rtol=0)
    assert out.metrics["masked_fraction"] == pytest.approx(2 / 6)
    assert out.metrics["divergence_mean"] == pytest.approx(0.22333333333333336)
    assert out.metrics["ratio_mean"] == pytest.approx(2.5166666666666666)
    assert out.metrics["ratio_max"] == pytest.approx(10.0)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", TV_SUM / 6),
        # both rows have 3 action tokens: the mean of the row means is the token mean
        ("seq-mean-token-mean", TV_SUM / 6),
        ("seq-mean-token-sum", TV_SUM / 2),
        ("seq-mean-token-sum-norm", TV_SUM / 8),  # 2 sequences * length 4
    ],
)
def test_every_aggregation_mode(loss_context_from_lists, mode, expected):
    ctx, _ = loss_context_from_lists(**BATCH, mode=mode, norm_length=4)
    assert DPPOTV(DPPOTVConfig())(ctx).loss.item() == pytest.approx(expected, abs=1e-12)


def test_kl_is_taken_from_the_old_policy_and_masks_the_rare_token(loss_context_from_lists):
    # (0.1, 0.01, +1) has TV 0.09 < 0.15 but KL(old || current) 0.0713 > 0.05: masked as well.
    # Remaining values: -0.35702968210273556 + 0.6576207008311825 + 1.2875503299472804.
    ctx, leaf = loss_context_from_lists(**BATCH)
    out = DPPOKL(DPPOKLConfig())(ctx)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(0.2646902247792879, abs=1e-12)
    expected = torch.tensor(
        [
            [0.0, 0.26666666666666666, -0.18333333333333335, 0.0],
            [0.0, -0.13333333333333333, 0.0, 0.0],
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(leaf.grad, expected, atol=1e-12, rtol=0)
    assert out.metrics["masked_fraction"] == pytest.approx(0.5)
    assert out.metrics["divergence_mean"] == pytest.approx(0.1614884292748035)


def test_kl_radius_separates_the_two_directions(loss_context_from_lists):
    # p = 0.2 now, q = 0.1 old, A = +1 (away): KL(old || current) = 0.1 ln 0.5 + 0.9 ln(0.9/0.8)
    # = 0.036690..., KL(current || old) = 0.2 ln 2 + 0.8 ln(0.8/0.9) = 0.044403...: a radius of
    # 0.04 masks the token only under the reverse direction, so it stays trained here.
    ctx, leaf = loss_context_from_lists(
        [[LN_0_2]], old_logprobs=[[LN_0_1]], advantages=[[1.0]], action_mask=[[1.0]]
    )
    out = DPPOKL(DPPOKLConfig(delta=0.04))(ctx)
    out.loss.backward()
    assert out.metrics["masked_fraction"] == 0.0
    assert out.metrics["divergence_mean"] == pytest.approx(0.03669001278475048, rel=1e-10)
    assert leaf.grad.item() == pytest.approx(-2.0, rel=1e-12)


@pytest.mark.parametrize(
    ("loss_cls", "config"), [(DPPOTV, DPPOTVConfig()), (DPPOKL, DPPOKLConfig())]
)
def test_rare_token_with_a_huge_ratio_is_not_masked(loss_context_from_lists, loss_cls, config):
    # q = 1e-5 -> p = 1e-3: ratio 100 (PPO would clip it), TV 0.00099, KL 0.00094: kept.
    # Value -100 * ln 1e-3 = 690.7755278982137, gradient -100.
    # ln 1e-3 = -6.907755278982137, ln 1e-5 = -11.512925464970229
    ctx, leaf = loss_context_from_lists(
        [[-6.907755278982137]],
        old_logprobs=[[-11.512925464970229]],
        advantages=[[1.0]],
        action_mask=[[1.0]],
    )
    out = loss_cls(config)(ctx)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(690.7755278982137, rel=1e-9)
    assert leaf.grad.item() == pytest.approx(-100.0, rel=1e-9)
    assert out.metrics["masked_fraction"] == 0.0


@pytest.mark.parametrize(
    ("loss_cls", "config"), [(DPPOTV, DPPOTVConfig()), (DPPOKL, DPPOKLConfig())]
)
def test_likely_token_dropping_inside_the_ppo_range_is_masked(
    loss_context_from_lists, loss_cls, config
):
    # q = 0.98 -> p = 0.82 with A < 0: ratio 0.837 is inside PPO's [0.8, 1.2], but TV 0.16 and
    # KL(old || current) 0.131 are past the defaults. ln 0.82 = -0.19845093872383832,
    # ln 0.98 = -0.020202707317519466
    ctx, leaf = loss_context_from_lists(
        [[-0.19845093872383832]],
        old_logprobs=[[-0.020202707317519466]],
        advantages=[[-1.0]],
        action_mask=[[1.0]],
    )
    out = loss_cls(config)(ctx)
    out.loss.backward()
    assert out.loss.item() == 0.0
    assert leaf.grad.item() == 0.0
    assert out.metrics["masked_fraction"] == 1.0


def test_delta_is_the_radius(loss_context_from_lists):
    # With delta 0.35 no token of the batch is past the TV radius: nothing is masked. The two
    # tokens masked at 0.15 add -1.6 ln 0.8 and 0.4 ln 0.2 to the sum.
    ctx, _ = loss_context_from_lists(**BATCH)
    out = DPPOTV(DPPOTVConfig(delta=0.35))(ctx)
    assert out.loss.item() == pytest.approx(4.0545411326242125, abs=1e-12)
    assert out.metrics["masked_fraction"] == 0.0


@pytest.mark.parametrize("loss_cls", [DPPOTV, DPPOKL])
def test_anchored_on_old_not_rollout_logprobs(loss_context_from_lists, loss_cls):
    # Same current and old logprobs, different sampler logprobs: nothing changes.
    config = DPPOTVConfig() if loss_cls is DPPOTV else DPPOKLConfig()
    ctx, _ = loss_context_from_lists(**BATCH)
    other = dict(BATCH, rollout_logprobs=[[0.0, -1.0, -2.0, -3.0], [-4.0, -5.0, -6.0, -7.0]])
    moved, _ = loss_context_from_lists(**other)
    assert torch.equal(loss_cls(config)(ctx).loss, loss_cls(config)(moved).loss)


def test_ratio_cap_caps_the_gradient(loss_context_from_lists):
    # (0.8, 0.5, -1) moves back toward q and is kept; ratio 1.6 capped at 1.2:
    # value -A * 1.2 * ln 0.8 = -0.26777226157705164, gradient -A * 1.2 = 1.2
    ctx, leaf = loss_context_from_lists(
        [[LN_0_8]], old_logprobs=[[LN_0_5]], advantages=[[-1.0]], action_mask=[[1.0]]
    )
    out = DPPOTV(DPPOTVConfig(ratio_cap=1.2))(ctx)
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-0.26777226157705164, abs=1e-12)
    assert leaf.grad.item() == pytest.approx(1.2, abs=1e-12)
    assert out.metrics["ratio_max"] == pytest.approx(1.6)


def test_ratio_cap_leaves_smaller_ratios_bit_for_bit(loss_context_from_lists):
    ctx, _ = loss_context_from_lists(**BATCH)
    capped = DPPOTV(DPPOTVConfig(ratio_cap=100.0))(ctx).loss
    plain = DPPOTV(DPPOTVConfig())(ctx).loss
    assert torch.equal(capped, plain)


def test_zero_advantages_train_nothing(loss_context_from_lists):
    # A = 0 takes the "A <= 0" side of the rule, as in the reference: the token that dropped
    # from 0.5 to 0.2 (KL 0.223) counts as masked. Loss and gradient are 0 either way.
    ctx, leaf = loss_context_from_lists(
        [[LN_0_8, LN_0_2]],
        old_logprobs=[[LN_0_5, LN_0_5]],
        advantages=[[0.0, 0.0]],
        action_mask=[[1.0, 1.0]],
    )
    out = DPPOKL(DPPOKLConfig())(ctx)
    out.loss.backward()
    assert out.loss.item() == 0.0
    assert torch.equal(leaf.grad, torch.zeros_like(leaf))
    assert out.metrics["masked_fraction"] == 0.5
