"""The loss and advantage conformance kit, run against small reference implementations, and
shown to catch broken ones."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

torch = pytest.importorskip("torch")

from rllm_core import ComponentSpec, NoConfig  # noqa: E402
from rllm_core.ports import AdvantageResult, LossContext, LossOutput  # noqa: E402
from rllm_core.testing.suites.losses import (  # noqa: E402
    AdvantageEstimatorConformance,
    LossConformance,
    make_loss_context,
    split_loss_context,
    trained_mask,
)

# ------------------------------------------------------------------ reference implementations


class ReinforceConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    scale: float = 1.0


class Reinforce:
    """``-scale * A * logprob`` on action tokens."""

    def __init__(self, config: ReinforceConfig) -> None:
        self.config = config

    def __call__(self, ctx: LossContext) -> LossOutput:
        per_token = -self.config.scale * ctx.advantages * ctx.logprobs
        with torch.no_grad():
            tokens = ctx.action_mask.sum().clamp(min=1)
            mean_logprob = (ctx.logprobs * ctx.action_mask).sum() / tokens
        return LossOutput(
            loss=ctx.aggregate(per_token, ctx.action_mask),
            metrics={"logprob_mean": mean_logprob.item()},
        )


class ObservationNLL:
    """Auxiliary: negative log-likelihood of observation tokens."""

    def __init__(self, config: NoConfig) -> None:
        self.config = config

    def __call__(self, ctx: LossContext) -> LossOutput:
        return LossOutput(loss=ctx.aggregate(-ctx.logprobs, ctx.observation_mask))


class MeanBaseline:
    """``r - mean(group)``."""

    def __init__(self, config: NoConfig) -> None:
        self.config = config

    def compute(self, rewards: Sequence[Sequence[float]]) -> AdvantageResult:
        advantages = [[float(r) - sum(group) / len(group) for r in group] for group in rewards]
        flat = len([group for group in rewards if len(set(group)) == 1])
        return AdvantageResult(advantages=advantages, zero_variance_groups=flat)


REINFORCE_SPEC = ComponentSpec(
    kind="loss",
    name="reinforce-ref",
    factory=Reinforce,
    config=ReinforceConfig,
    summary="reference loss",
)
OBSERVATION_SPEC = ComponentSpec(
    kind="loss",
    name="observation-nll",
    factory=ObservationNLL,
    summary="reference auxiliary loss",
    traits={"role": "auxiliary"},
)
BASELINE_SPEC = ComponentSpec(
    kind="advantage_estimator",
    name="mean-baseline",
    factory=MeanBaseline,
    summary="reference estimator",
)


class TestReinforceConformance(LossConformance):
    @pytest.fixture
    def loss_spec(self) -> ComponentSpec:
        return REINFORCE_SPEC

    @pytest.fixture
    def loss(self, loss_spec: ComponentSpec) -> Any:
        return loss_spec.build({"scale": 0.5})


class TestObservationNLLConformance(LossConformance):
    @pytest.fixture
    def loss_spec(self) -> ComponentSpec:
        return OBSERVATION_SPEC

    @pytest.fixture
    def loss(self, loss_spec: ComponentSpec) -> Any:
        return loss_spec.build()


class TestMeanBaselineConformance(AdvantageEstimatorConformance):
    @pytest.fixture
    def estimator_spec(self) -> ComponentSpec:
        return BASELINE_SPEC

    @pytest.fixture
    def estimator(self, estimator_spec: ComponentSpec) -> Any:
        return estimator_spec.build()


# ------------------------------------------------------------------ broken implementations


class LeakyReinforce(Reinforce):
    """Averages over every position, padding and prompt included."""

    def __call__(self, ctx: LossContext) -> LossOutput:
        return LossOutput(loss=(-ctx.advantages * ctx.logprobs).mean())


class ProductRatio(Reinforce):
    """A sequence ratio taken as the product of token ratios: overflows at large ratios."""

    def __call__(self, ctx: LossContext) -> LossOutput:
        ratio = torch.exp(ctx.logprobs - ctx.old_logprobs)
        sequence_ratio = ratio.where(ctx.action_mask != 0, 1.0).prod(dim=-1, keepdim=True)
        return LossOutput(loss=ctx.aggregate(-ctx.advantages * sequence_ratio, ctx.action_mask))


class ClampsInPlace(Reinforce):
    """Clips the caller's advantages in place."""

    def __call__(self, ctx: LossContext) -> LossOutput:
        ctx.advantages.clamp_(-0.5, 0.5)
        return super().__call__(ctx)


class BatchNormalized(Reinforce):
    """Whitens advantages over the micro-batch, so the result depends on how a step is split."""

    def __call__(self, ctx: LossContext) -> LossOutput:
        selected = ctx.advantages[ctx.action_mask != 0]
        whitened = (ctx.advantages - selected.mean()) / (selected.std() + 1e-6)
        return LossOutput(loss=ctx.aggregate(-whitened * ctx.logprobs, ctx.action_mask))


class Detached(Reinforce):
    def __call__(self, ctx: LossContext) -> LossOutput:
        per_token = -ctx.advantages * ctx.logprobs.detach()
        return LossOutput(loss=ctx.aggregate(per_token, ctx.action_mask))


class TensorMetrics(Reinforce):
    def __call__(self, ctx: LossContext) -> LossOutput:
        out = super().__call__(ctx)
        return LossOutput(loss=out.loss, metrics={"logprob_mean": ctx.logprobs.mean().detach()})


class PromptTrainingAuxiliary(ObservationNLL):
    """Trains every non-action position: prompt and padding too."""

    def __call__(self, ctx: LossContext) -> LossOutput:
        return LossOutput(loss=ctx.aggregate(-ctx.logprobs, 1.0 - ctx.action_mask))


class MutatingBaseline(MeanBaseline):
    """Subtracts the baseline from the caller's lists in place."""

    def compute(self, rewards: Sequence[Sequence[float]]) -> AdvantageResult:
        result = super().compute(rewards)
        for group in rewards:
            mean = sum(group) / len(group)
            for i, value in enumerate(group):
                group[i] = value - mean  # type: ignore[index]
        return result


class StdNormalizedWithoutEpsilon(MeanBaseline):
    """Divides by the population std without a guard: 0/0 on flat groups."""

    def compute(self, rewards: Sequence[Sequence[float]]) -> AdvantageResult:
        advantages = []
        for group in rewards:
            values = torch.tensor(group, dtype=torch.float64)
            std = values.std(correction=0)
            advantages.append(((values - values.mean()) / std).tolist())
        return AdvantageResult(advantages=advantages)


class NeverCountsFlatGroups(MeanBaseline):
    def compute(self, rewards: Sequence[Sequence[float]]) -> AdvantageResult:
        return AdvantageResult(advantages=super().compute(rewards).advantages)


class DropsSingletons(MeanBaseline):
    def compute(self, rewards: Sequence[Sequence[float]]) -> AdvantageResult:
        return super().compute([group for group in rewards if len(group) > 1])


class RequiredKeyConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    scale: float


class LooseConfig(BaseModel):
    scale: float = 1.0


# ------------------------------------------------------------------ the kit catches them

LOSS_SUITE = LossConformance()
ESTIMATOR_SUITE = AdvantageEstimatorConformance()


def test_suites_are_marked_as_conformance_tests() -> None:
    for suite in (LossConformance, AdvantageEstimatorConformance):
        assert [mark.name for mark in suite.pytestmark] == ["rllm_conformance"]  # type: ignore[attr-defined]


def test_catches_gradient_leaking_onto_masked_tokens() -> None:
    leaky = LeakyReinforce(ReinforceConfig())
    with pytest.raises(AssertionError, match="put gradient on untrained tokens"):
        LOSS_SUITE.test_zero_gradient_outside_trained_mask(leaky, "policy")
    with pytest.raises(AssertionError, match="put gradient on untrained tokens"):
        LOSS_SUITE.test_every_aggregation_mode(leaky, "policy", "seq-mean-token-mean")


def test_catches_an_auxiliary_loss_training_prompt_and_padding() -> None:
    broken = PromptTrainingAuxiliary(NoConfig())
    with pytest.raises(AssertionError, match="auxiliary loss put gradient on untrained tokens"):
        LOSS_SUITE.test_zero_gradient_outside_trained_mask(broken, "auxiliary")


def test_catches_nan_on_extreme_ratios() -> None:
    broken = ProductRatio(ReinforceConfig())
    LOSS_SUITE.test_returns_a_finite_scalar_and_float_metrics(broken)
    with pytest.raises(AssertionError, match=r"logprobs - old_logprobs = 50.0: loss is nan"):
        LOSS_SUITE.test_finite_for_extreme_log_ratios(broken, "policy", 50.0)


def test_catches_in_place_mutation() -> None:
    with pytest.raises(AssertionError, match=r"modified ctx\.advantages in place"):
        LOSS_SUITE.test_does_not_mutate_its_inputs(ClampsInPlace(ReinforceConfig()))


def test_catches_a_loss_that_depends_on_the_micro_batch_split() -> None:
    broken = BatchNormalized(ReinforceConfig())
    with pytest.raises(AssertionError, match=r"micro-batches \(2, 4\) sum to"):
        LOSS_SUITE.test_micro_batch_split_invariance(broken, "token-mean", (2, 4))


def test_catches_a_loss_without_gradient() -> None:
    with pytest.raises(AssertionError, match="does not require grad"):
        LOSS_SUITE.test_returns_a_finite_scalar_and_float_metrics(Detached(ReinforceConfig()))


def test_catches_tensor_metrics() -> None:
    with pytest.raises(AssertionError, match="metric 'logprob_mean' is Tensor"):
        LOSS_SUITE.test_returns_a_finite_scalar_and_float_metrics(TensorMetrics(ReinforceConfig()))


def test_catches_a_config_that_does_not_round_trip() -> None:
    # The loss keeps a config of another class, so the suite uses the spec defaults: but the
    # spec's config has a required key.
    spec = ComponentSpec(
        kind="loss", name="needs-scale", factory=Reinforce, config=RequiredKeyConfig, summary="s"
    )
    with pytest.raises(pytest.fail.Exception, match=r"store the validated config on self\.config"):
        LOSS_SUITE.test_config_round_trip(Reinforce(ReinforceConfig()), spec)


def test_catches_a_rebuilt_loss_that_differs() -> None:
    class StateBesideConfig(Reinforce):
        """Trains with a scale passed beside its config, which a plan cannot reproduce."""

        def __init__(self, config: ReinforceConfig, scale: float) -> None:
            super().__init__(config)
            self.scale = scale

        def __call__(self, ctx: LossContext) -> LossOutput:
            return Reinforce(ReinforceConfig(scale=self.scale))(ctx)

    spec = ComponentSpec(
        kind="loss", name="stateful", factory=Reinforce, config=ReinforceConfig, summary="s"
    )
    with pytest.raises(AssertionError, match="computes a different loss"):
        LOSS_SUITE.test_config_round_trip(StateBesideConfig(ReinforceConfig(), 2.0), spec)


def test_catches_a_config_that_accepts_unknown_keys() -> None:
    spec = ComponentSpec(
        kind="loss", name="loose", factory=Reinforce, config=LooseConfig, summary="s"
    )
    with pytest.raises(pytest.fail.Exception, match="accepted the unknown key"):
        LOSS_SUITE.test_config_rejects_unknown_keys(spec)


def test_config_tests_skip_without_a_spec() -> None:
    with pytest.raises(pytest.skip.Exception, match="provide a 'loss_spec' fixture"):
        LOSS_SUITE.test_config_round_trip(Reinforce(ReinforceConfig()), None)
    with pytest.raises(pytest.skip.Exception, match="provide a 'estimator_spec' fixture"):
        ESTIMATOR_SUITE.test_config_rejects_unknown_keys(None)


def test_catches_an_estimator_that_mutates_its_input() -> None:
    with pytest.raises(AssertionError, match="compute modified its input"):
        ESTIMATOR_SUITE.test_pure(MutatingBaseline(NoConfig()))


@pytest.mark.parametrize("case", ["groups of size 1", "all-equal groups"])
def test_catches_nan_advantages_on_flat_groups(case: str) -> None:
    with pytest.raises(AssertionError, match=rf"{case}: advantages\[0\]\[0\] is nan"):
        ESTIMATOR_SUITE.test_finite_for_hard_groups(StdNormalizedWithoutEpsilon(NoConfig()), case)


def test_catches_a_wrong_zero_variance_count() -> None:
    rewards = [[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.5, 0.5], [2.0, 2.0, 2.0, 2.0], [1.0, 0.0]]
    with pytest.raises(AssertionError, match="have 3 all-equal groups, the estimator counted 0"):
        ESTIMATOR_SUITE.test_zero_variance_groups_counted_exactly(
            NeverCountsFlatGroups(NoConfig()), rewards, 3
        )


def test_catches_a_shape_mismatch() -> None:
    with pytest.raises(AssertionError, match=r"group sizes \[4, 3, 2, 4\], not \[4, 1, 3, 2, 4\]"):
        ESTIMATOR_SUITE.test_shape_matches_ragged_groups(DropsSingletons(NoConfig()))


# ------------------------------------------------------------------ the public helpers


def test_make_loss_context_lays_out_prompt_actions_observations_and_padding() -> None:
    ctx = make_loss_context(lengths=(7, 4, 1))
    assert ctx.action_mask.tolist() == [
        [0, 1, 1, 0, 1, 1, 0],
        [0, 1, 1, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 0],
    ]
    assert ctx.observation_mask.tolist() == [
        [0, 0, 0, 1, 0, 0, 1],
        [0, 0, 0, 1, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 0],
    ]
    assert ctx.logprobs.is_leaf and ctx.logprobs.requires_grad
    assert all(getattr(ctx, name).dtype == torch.float32 for name in ("logprobs", "advantages"))
    assert bool(torch.all(ctx.old_logprobs <= -0.05)) and bool(torch.all(ctx.old_logprobs >= -3))
    # One advantage per sequence, centred over the batch.
    assert torch.all(ctx.advantages == ctx.advantages[:, :1])
    assert abs(ctx.advantages[:, 0].sum().item()) < 1e-6


def test_make_loss_context_normalizes_over_its_action_tokens() -> None:
    ctx = make_loss_context(aggregation="seq-mean-token-sum-norm")
    # Lengths (7, 4, 9, 1) hold 4 + 2 + 6 + 0 action tokens in 3 non-empty sequences.
    assert ctx.aggregate.total_tokens == 12  # type: ignore[attr-defined]
    assert ctx.aggregate.total_sequences == 3  # type: ignore[attr-defined]
    assert ctx.aggregate.norm_length == 9.0  # type: ignore[attr-defined]


def test_make_loss_context_is_seeded_and_honours_overrides() -> None:
    first, again, other = make_loss_context(), make_loss_context(), make_loss_context(seed=1)
    assert torch.equal(first.logprobs, again.logprobs)
    assert torch.equal(first.advantages, again.advantages)
    assert not torch.equal(first.logprobs, other.logprobs)

    extreme = make_loss_context(log_ratio=-50.0, advantage=1e4, dtype=torch.float64)
    torch.testing.assert_close(
        extreme.logprobs.detach() - extreme.old_logprobs,
        torch.full_like(extreme.old_logprobs, -50.0),
    )
    assert torch.all(extreme.advantages == 1e4)

    flat = make_loss_context(log_ratio=0.0, rollout_drift=0.0)
    assert torch.equal(flat.logprobs.detach(), flat.old_logprobs)
    assert torch.equal(flat.rollout_logprobs, flat.old_logprobs)


def test_make_loss_context_rejects_empty_sequences() -> None:
    with pytest.raises(ValueError, match=r"got \(3, 0\)"):
        make_loss_context(lengths=(3, 0))


def test_split_loss_context_accumulates_into_the_parent_gradient() -> None:
    ctx = make_loss_context(dtype=torch.float64)
    loss = Reinforce(ReinforceConfig())
    micro = split_loss_context(ctx, (1, 3))
    assert [m.logprobs.shape[0] for m in micro] == [1, 3]
    assert all(m.aggregate is ctx.aggregate for m in micro)
    sum(loss(m).loss for m in micro).backward()
    # REINFORCE with token-mean: d/dlogprob = -A / total_tokens on action tokens.
    expected = -ctx.advantages * ctx.action_mask / 12
    torch.testing.assert_close(ctx.logprobs.grad, expected, rtol=0, atol=1e-12)


def test_split_loss_context_rejects_sizes_that_do_not_cover_the_batch() -> None:
    with pytest.raises(ValueError, match=r"sizes \[1, 2\] must be positive and add up to .* 4"):
        split_loss_context(make_loss_context(), (1, 2))


def test_trained_mask_by_role() -> None:
    ctx = make_loss_context(lengths=(4,))
    assert trained_mask(ctx, "policy").tolist() == [[False, True, True, False]]
    assert trained_mask(ctx, "auxiliary").tolist() == [[False, True, True, True]]
    with pytest.raises(ValueError, match="'critic' is not 'policy' or 'auxiliary'"):
        trained_mask(ctx, "critic")


def test_reference_reinforce_value_is_hand_computed() -> None:
    # A check on the reference loss itself, so the suites run against a known-good one.
    ctx = make_loss_context(lengths=(3,), advantage=2.0, dtype=torch.float64)
    out = Reinforce(ReinforceConfig(scale=0.5))(ctx)
    logprobs = ctx.logprobs.detach()[0]
    expected = -0.5 * 2.0 * (logprobs[1] + logprobs[2]).item() / 2
    assert math.isclose(out.loss.item(), expected, rel_tol=1e-12)
