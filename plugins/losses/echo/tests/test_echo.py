"""echo against values worked out by hand, and how it stacks on a policy loss."""

from __future__ import annotations

import pytest
import torch
from rllm_core.algorithms.aggregation import make_aggregate
from rllm_core.ports import LossContext
from rllm_core.testing.suites.losses import make_loss_context
from rllm_loss_echo.loss import Echo
from rllm_loss_echo.plugin import EchoConfig

# Row 0: action, observation (-1.0), observation (-2.0), action.
# Row 1: action, action, padding holding garbage, observation (-4.0).
LOGPROBS = [[-0.5, -1.0, -2.0, -0.25], [-3.0, -0.1, 9.0, -4.0]]
OBSERVATION = [[0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]]
ACTION = [[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0]]


def context(mode: str, norm_length: float | None = None) -> tuple[LossContext, torch.Tensor]:
    leaf = torch.tensor(LOGPROBS, dtype=torch.float64, requires_grad=True)
    zeros = torch.zeros_like(leaf.detach())
    # normalizers over the observation tokens: 3 tokens in 2 sequences
    aggregate = make_aggregate(mode, total_tokens=3, total_sequences=2, norm_length=norm_length)
    ctx = LossContext(
        logprobs=leaf,
        old_logprobs=zeros,
        rollout_logprobs=zeros,
        advantages=torch.ones_like(zeros),
        action_mask=torch.tensor(ACTION, dtype=torch.float64),
        observation_mask=torch.tensor(OBSERVATION, dtype=torch.float64),
        aggregate=aggregate,
    )
    return ctx, leaf


def test_token_mean_nll_of_observation_tokens():
    ctx, leaf = context("token-mean")
    out = Echo(EchoConfig())(ctx)
    out.loss.backward()
    # (1.0 + 2.0 + 4.0) / 3
    assert out.loss.item() == pytest.approx(2.3333333333333335, abs=1e-12)
    third = -0.3333333333333333
    expected = torch.tensor([[0.0, third, third, 0.0], [0.0, 0.0, 0.0, third]], dtype=torch.float64)
    torch.testing.assert_close(leaf.grad, expected, atol=1e-12, rtol=0)
    assert out.metrics == {"nll": pytest.approx(2.3333333333333335), "observation_tokens": 3.0}


def test_seq_mean_token_mean():
    ctx, leaf = context("seq-mean-token-mean")
    out = Echo(EchoConfig())(ctx)
    out.loss.backward()
    # rows: (1 + 2) / 2 = 1.5 and 4 / 1 = 4, mean 2.75
    assert out.loss.item() == pytest.approx(2.75, abs=1e-12)
    expected = torch.tensor([[0.0, -0.25, -0.25, 0.0], [0.0, 0.0, 0.0, -0.5]], dtype=torch.float64)
    torch.testing.assert_close(leaf.grad, expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 2.3333333333333335),  # 7 over 3 tokens
        ("seq-mean-token-mean", 2.75),
        ("seq-mean-token-sum", 3.5),  # 7 over 2 sequences
        ("seq-mean-token-sum-norm", 0.875),  # 7 over 2 sequences * length 4
    ],
)
def test_every_aggregation_mode(mode, expected):
    ctx, _ = context(mode, norm_length=4)
    assert Echo(EchoConfig())(ctx).loss.item() == pytest.approx(expected, abs=1e-12)


def _policy_loss(ctx: LossContext) -> torch.Tensor:
    return ctx.aggregate(-ctx.advantages * ctx.logprobs, ctx.action_mask)


def test_coef_zero_reproduces_the_base_loss_bitwise():
    base_ctx = make_loss_context(seed=7)
    base = _policy_loss(base_ctx)
    (base_grad,) = torch.autograd.grad(base, base_ctx.logprobs)

    ctx = make_loss_context(seed=7)
    echo = Echo(EchoConfig(coef=0.0))
    combined = _policy_loss(ctx) + echo.config.coef * echo(ctx).loss
    (combined_grad,) = torch.autograd.grad(combined, ctx.logprobs)

    assert torch.equal(combined, base)
    assert torch.equal(combined_grad, base_grad)


def test_gradient_only_on_observation_tokens():
    ctx = make_loss_context(seed=11)
    (grad,) = torch.autograd.grad(Echo(EchoConfig())(ctx).loss, ctx.logprobs)
    observation = ctx.observation_mask != 0
    assert torch.equal(grad[~observation], torch.zeros_like(grad[~observation]))
    assert bool((grad[observation] < 0).all())


def test_no_observation_token():
    ctx, leaf = context("token-mean")
    ctx = LossContext(
        **{
            name: getattr(ctx, name)
            for name in ("logprobs", "old_logprobs", "rollout_logprobs", "advantages")
        },
        action_mask=ctx.action_mask,
        observation_mask=torch.zeros_like(ctx.observation_mask),
        aggregate=make_aggregate("token-mean", total_tokens=0, total_sequences=0),
    )
    out = Echo(EchoConfig())(ctx)
    out.loss.backward()
    assert out.loss.item() == 0.0
    assert torch.equal(leaf.grad, torch.zeros_like(leaf))
    assert out.metrics == {"nll": 0.0, "observation_tokens": 0.0}
