"""reinforce-tis: hand-computed values, registration, and the rllm-core conformance suite."""

from __future__ import annotations

import math
import subprocess
import sys

import pydantic
import pytest
import torch
from rllm_core import ComponentSpec
from rllm_core.algorithms.aggregation import make_aggregate, step_normalizers
from rllm_core.plugins import PluginManager
from rllm_core.ports import LossContext
from rllm_core.testing.suites.losses import LossConformance, make_loss_context
from rllm_loss_example import plugin
from rllm_loss_example.loss import ReinforceTIS
from rllm_loss_example.plugin import ReinforceTISConfig

E = math.e


def one_sequence(mask: list[float]) -> LossContext:
    """One sequence of 3 tokens. Log-ratios to the rollout are 0, +1 and -1, so the weights
    are 1, min(e, 2) = 2 and 1/e."""
    rollout = torch.tensor([[-1.0, -1.5, -1.0]], dtype=torch.float64)
    action_mask = torch.tensor([mask], dtype=torch.float64)
    total_tokens, total_sequences = step_normalizers([action_mask])
    return LossContext(
        logprobs=torch.tensor([[-1.0, -0.5, -2.0]], dtype=torch.float64, requires_grad=True),
        old_logprobs=rollout.clone(),
        rollout_logprobs=rollout,
        advantages=torch.tensor([[1.0, -1.0, 2.0]], dtype=torch.float64),
        action_mask=action_mask,
        observation_mask=torch.zeros(1, 3, dtype=torch.float64),
        aggregate=make_aggregate(
            "token-mean", total_tokens=total_tokens, total_sequences=total_sequences
        ),
    )


def test_hand_computed_value_gradient_and_metrics() -> None:
    ctx = one_sequence([1.0, 1.0, 1.0])
    out = ReinforceTIS(ReinforceTISConfig(cap=2.0, beta=0.5))(ctx)
    out.loss.backward()

    # Policy terms -w*A*lp: 1, -1, 4/e. k3 terms with d = 0, -1, +1: 0, 1/e, e - 2.
    assert out.loss.item() == pytest.approx((4 / E + 0.5 * (1 / E + E - 2)) / 3, rel=1e-12)
    # d/dlp: -w*A + beta * (1 - exp(d)), divided by the 3 tokens.
    expected_grad = [-1 / 3, (2 + 0.5 * (1 - 1 / E)) / 3, (-2 / E + 0.5 * (1 - E)) / 3]
    assert ctx.logprobs.grad is not None
    assert ctx.logprobs.grad[0].tolist() == pytest.approx(expected_grad, rel=1e-12)
    assert out.metrics == pytest.approx(
        {"weight_mean": (3 + 1 / E) / 3, "truncated_frac": 1 / 3, "kl": (1 / E + E - 2) / 3},
        rel=1e-12,
    )


def test_masked_token_is_ignored() -> None:
    ctx = one_sequence([1.0, 1.0, 0.0])
    out = ReinforceTIS(ReinforceTISConfig(cap=2.0, beta=0.5))(ctx)
    out.loss.backward()

    assert out.loss.item() == pytest.approx((1 - 1 + 0.5 / E) / 2, rel=1e-12)
    assert ctx.logprobs.grad is not None
    assert ctx.logprobs.grad[0].tolist() == pytest.approx(
        [-1 / 2, (2 + 0.5 * (1 - 1 / E)) / 2, 0.0], rel=1e-12
    )
    assert out.metrics == pytest.approx(
        {"weight_mean": 3 / 2, "truncated_frac": 1 / 2, "kl": 1 / (2 * E)}, rel=1e-12
    )


def test_defaults_are_truncated_reinforce_without_penalty() -> None:
    out = ReinforceTIS(ReinforceTISConfig())(one_sequence([1.0, 1.0, 1.0]))
    assert out.loss.item() == pytest.approx((1 - 1 + 4 / E) / 3, rel=1e-12)


def test_penalty_stays_finite_far_beyond_the_clamp() -> None:
    ctx = make_loss_context(log_ratio=-100.0, rollout_drift=0.0)
    out = ReinforceTIS(ReinforceTISConfig(beta=1.0))(ctx)
    out.loss.backward()
    assert math.isfinite(out.loss.item())
    assert ctx.logprobs.grad is not None and bool(torch.isfinite(ctx.logprobs.grad).all())


@pytest.mark.parametrize(
    "values", [{"cap": 0.0}, {"cap": float("inf")}, {"beta": -0.1}, {"clip": 2.0}]
)
def test_config_rejects_bad_values(values: dict[str, float]) -> None:
    with pytest.raises(pydantic.ValidationError):
        ReinforceTISConfig.model_validate(values)


def test_registered_through_the_entry_point() -> None:
    # Not strict: another installed plugin failing to load is not this package's failure.
    manager = PluginManager(strict=False)
    record = manager.get_record("loss", "reinforce-tis")
    assert record.plugin.distribution == "rllm-loss-example"
    assert record.plugin.status.value == "active"
    assert record.spec.factory_path == "rllm_loss_example.loss:ReinforceTIS"
    built = record.spec.build({"cap": 3.0})
    assert isinstance(built, ReinforceTIS)
    assert built.config == ReinforceTISConfig(cap=3.0)


def test_entry_module_does_not_import_torch() -> None:
    code = "import sys, rllm_loss_example.plugin; assert 'torch' not in sys.modules"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


class TestReinforceTISConformance(LossConformance):
    @pytest.fixture
    def loss_spec(self) -> ComponentSpec:
        (spec,) = plugin.rllm_losses()
        return spec

    @pytest.fixture(params=[{}, {"cap": 1.2, "beta": 0.1}], ids=["defaults", "with-kl"])
    def loss(self, loss_spec: ComponentSpec, request: pytest.FixtureRequest) -> ReinforceTIS:
        return loss_spec.build(request.param)
