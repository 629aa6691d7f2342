"""Advantage estimators against values worked out by hand."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rllm_advantage_estimator_grpo.estimators import (
    GRPO,
    PRPO,
    RLOO,
    Reinforce,
    ReinforcePlusPlusBaseline,
)
from rllm_advantage_estimator_grpo.plugin import (
    GRPOConfig,
    PRPOConfig,
    ReinforceAdvantageConfig,
    ReinforcePlusPlusBaselineConfig,
)
from rllm_core import NoConfig

# [1, 2, 3]: mean 2, squared deviations 1 + 0 + 1 = 2; sample std sqrt(2/2) = 1,
# population std sqrt(2/3) = 0.816496580927726. [5, 5] and [7] have zero variance.
REWARDS = [[1.0, 2.0, 3.0], [5.0, 5.0], [7.0]]


def approx(rows: list[list[float]]) -> list[list[object]]:
    return [[pytest.approx(v, abs=1e-12) for v in row] for row in rows]


class TestGRPO:
    def test_sample_std(self):
        result = GRPO(GRPOConfig(epsilon=0.0)).compute(REWARDS)
        assert result.advantages == [[-1.0, 0.0, 1.0], [0.0, 0.0], [0.0]]
        assert result.zero_variance_groups == 2
        # all advantages: -1, 0, 1, 0, 0, 0 -> population std sqrt(2/6)
        assert result.metrics == {
            "mean": 0.0,
            "std": pytest.approx(0.5773502691896257),
            "min": -1.0,
            "max": 1.0,
        }

    def test_default_epsilon_is_added_to_the_std(self):
        result = GRPO(GRPOConfig()).compute([[1.0, 2.0, 3.0]])
        # 1 / (1 + 1e-6)
        assert result.advantages == approx([[-0.999999000001, 0.0, 0.999999000001]])

    def test_population_std(self):
        result = GRPO(GRPOConfig(epsilon=0.0, std="population")).compute([[1.0, 2.0, 3.0]])
        assert result.advantages == approx([[-1.224744871391589, 0.0, 1.224744871391589]])

    def test_centered_without_std(self):
        result = GRPO(GRPOConfig(normalize_std=False)).compute([[1.0, 2.0, 3.0], [0.0, 4.0]])
        assert result.advantages == [[-1.0, 0.0, 1.0], [-2.0, 2.0]]
        assert result.zero_variance_groups == 0

    def test_binary_rewards(self):
        # [1, 0, 0, 0]: mean 0.25, sample std sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5
        result = GRPO(GRPOConfig(epsilon=0.0)).compute([[1.0, 0.0, 0.0, 0.0]])
        assert result.advantages == approx([[1.5, -0.5, -0.5, -0.5]])

    def test_zero_variance_group_is_exactly_zero(self):
        # 0.1 * 3 / 3 is not 0.1 in floating point; the estimator must not leak that.
        result = GRPO(GRPOConfig()).compute([[0.1, 0.1, 0.1]])
        assert result.advantages == [[0.0, 0.0, 0.0]]
        assert result.zero_variance_groups == 1


class TestRLOO:
    def test_leave_one_out(self):
        result = RLOO(NoConfig()).compute([[1.0, 2.0, 3.0], [0.0, 1.0], [4.0], [2.0, 2.0, 2.0]])
        # 1 - (2+3)/2, 2 - (1+3)/2, 3 - (1+2)/2
        assert result.advantages == [[-1.5, 0.0, 1.5], [-1.0, 1.0], [0.0], [0.0, 0.0, 0.0]]
        assert result.zero_variance_groups == 2
        assert result.metrics["min"] == -1.5
        assert result.metrics["max"] == 1.5


class TestReinforce:
    def test_constant_baseline(self):
        result = Reinforce(ReinforceAdvantageConfig(baseline=0.5)).compute([[1.0, 0.0], [3.0]])
        assert result.advantages == [[0.5, -0.5], [2.5]]
        assert result.zero_variance_groups == 1
        assert result.metrics["mean"] == pytest.approx(2.5 / 3)

    def test_raw_reward_by_default(self):
        result = Reinforce(ReinforceAdvantageConfig()).compute([[1.0, 1.0]])
        assert result.advantages == [[1.0, 1.0]]
        assert result.zero_variance_groups == 1


# centered: [-1, 1], [0, 0], [-2, 2]; squared sum 10 over 6 values
PLUS_PLUS_REWARDS = [[1.0, 3.0], [2.0, 2.0], [0.0, 4.0]]


class TestReinforcePlusPlusBaseline:
    def test_batch_sample_std(self):
        config = ReinforcePlusPlusBaselineConfig(epsilon=0.0)
        result = ReinforcePlusPlusBaseline(config).compute(PLUS_PLUS_REWARDS)
        # std sqrt(10 / 5) = 1.4142135623730951
        assert result.advantages == approx(
            [
                [-0.7071067811865475, 0.7071067811865475],
                [0.0, 0.0],
                [-1.414213562373095, 1.414213562373095],
            ]
        )
        assert result.zero_variance_groups == 1

    def test_batch_population_std(self):
        config = ReinforcePlusPlusBaselineConfig(epsilon=0.0, std="population")
        result = ReinforcePlusPlusBaseline(config).compute(PLUS_PLUS_REWARDS)
        # std sqrt(10 / 6) = 1.2909944487358056
        assert result.advantages == approx(
            [
                [-0.7745966692414834, 0.7745966692414834],
                [0.0, 0.0],
                [-1.5491933384829668, 1.5491933384829668],
            ]
        )

    def test_all_groups_flat(self):
        config = ReinforcePlusPlusBaselineConfig()
        result = ReinforcePlusPlusBaseline(config).compute([[1.0, 1.0], [0.0]])
        assert result.advantages == [[0.0, 0.0], [0.0]]
        assert result.zero_variance_groups == 2


class TestPRPO:
    def test_batch_normalization_ignores_groups(self):
        # all rewards 1, 3, 2, 2: mean 2, sample std sqrt(2/3) = 0.816496580927726
        result = PRPO(PRPOConfig(epsilon=0.0)).compute([[1.0, 3.0], [2.0, 2.0]])
        assert result.advantages == approx([[-1.224744871391589, 1.224744871391589], [0.0, 0.0]])
        assert result.zero_variance_groups == 1

    def test_flat_batch_is_zero(self):
        result = PRPO(PRPOConfig()).compute([[0.3, 0.3], [0.3]])
        assert result.advantages == [[0.0, 0.0], [0.0]]
        assert result.zero_variance_groups == 2

    def test_groups_with_equal_rewards_still_get_batch_advantages(self):
        # [0, 0] is a zero-variance group but sits below the batch mean 0.5
        result = PRPO(PRPOConfig(epsilon=0.0, std="population")).compute([[0.0, 0.0], [1.0, 1.0]])
        assert result.advantages == [[-1.0, -1.0], [1.0, 1.0]]
        assert result.zero_variance_groups == 2


ESTIMATORS = [
    GRPO(GRPOConfig()),
    GRPO(GRPOConfig(normalize_std=False)),
    RLOO(NoConfig()),
    Reinforce(ReinforceAdvantageConfig()),
    ReinforcePlusPlusBaseline(ReinforcePlusPlusBaselineConfig()),
    PRPO(PRPOConfig()),
]
IDS = ["grpo", "grpo-centered", "rloo", "reinforce", "reinforce++-baseline", "prpo"]


@pytest.mark.parametrize("estimator", ESTIMATORS, ids=IDS)
class TestEveryEstimator:
    def test_shape_and_finiteness(self, estimator):
        rewards = [[0.0, 1.0, 1.0], [2.5], [], [1e-300, 2e-300], [-3.0, -3.0]]
        result = estimator.compute(rewards)
        assert [len(g) for g in result.advantages] == [3, 1, 0, 2, 2]
        assert all(math.isfinite(a) for g in result.advantages for a in g)
        assert set(result.metrics) == {"mean", "std", "min", "max"}

    def test_empty_batch(self, estimator):
        result = estimator.compute([])
        assert result.advantages == []
        assert result.zero_variance_groups == 0
        assert result.metrics == {"mean": 0.0, "std": 0.0, "min": 0.0, "max": 0.0}

    def test_pure(self, estimator):
        rewards = [[0.0, 1.0, 0.5], [1.0, 1.0]]
        first = estimator.compute(rewards)
        assert rewards == [[0.0, 1.0, 0.5], [1.0, 1.0]]
        second = estimator.compute(rewards)
        assert first.advantages == second.advantages
        assert first.metrics == second.metrics

    @pytest.mark.parametrize("bad", [math.nan, math.inf, "high"])
    def test_rejects_a_reward_that_is_not_a_finite_number(self, estimator, bad):
        with pytest.raises(ValueError, match=r"rewards\[1\]\[0\]"):
            estimator.compute([[1.0], [bad, 0.0]])


# Quarter-integer rewards keep every spread far from underflow, so the identities below hold to
# rounding error.
GROUPS = st.lists(
    st.lists(st.integers(-40, 40).map(lambda k: k / 4), max_size=6), min_size=1, max_size=6
)


def _population_std(values: list[float]) -> float:
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))


@given(GROUPS)
def test_grpo_groups_are_centered_with_unit_spread(rewards):
    config = GRPOConfig(epsilon=0.0, std="population")
    result = GRPO(config).compute(rewards)
    for group, advantages in zip(rewards, result.advantages, strict=True):
        if len(set(group)) > 1:
            assert math.fsum(advantages) == pytest.approx(0.0, abs=1e-9)
            assert _population_std(advantages) == pytest.approx(1.0, rel=1e-9)
        else:
            assert advantages == [0.0] * len(group)
    assert result.zero_variance_groups == sum(1 for g in rewards if len(set(g)) <= 1)


@given(GROUPS)
def test_grpo_treats_groups_independently(rewards):
    estimator = GRPO(GRPOConfig())
    forward = estimator.compute(rewards).advantages
    backward = estimator.compute(rewards[::-1]).advantages
    assert backward == forward[::-1]


@given(GROUPS)
def test_rloo_is_a_rescaled_group_mean_baseline(rewards):
    result = RLOO(NoConfig()).compute(rewards)
    for group, advantages in zip(rewards, result.advantages, strict=True):
        n = len(group)
        if len(set(group)) > 1:
            mean = math.fsum(group) / n
            expected = [n / (n - 1) * (r - mean) for r in group]
            assert advantages == pytest.approx(expected, abs=1e-9)
        else:
            assert advantages == [0.0] * n


@given(GROUPS)
def test_reinforce_plus_plus_baseline_has_unit_batch_spread(rewards):
    result = ReinforcePlusPlusBaseline(
        ReinforcePlusPlusBaselineConfig(epsilon=0.0, std="population")
    ).compute(rewards)
    flat = [a for group in result.advantages for a in group]
    for advantages in result.advantages:
        assert math.fsum(advantages) == pytest.approx(0.0, abs=1e-9)
    if any(flat):
        assert _population_std(flat) == pytest.approx(1.0, rel=1e-9)


@given(GROUPS)
def test_prpo_has_zero_mean_and_unit_batch_spread(rewards):
    result = PRPO(PRPOConfig(epsilon=0.0, std="population")).compute(rewards)
    flat = [a for group in result.advantages for a in group]
    if len({r for group in rewards for r in group}) > 1:
        assert math.fsum(flat) == pytest.approx(0.0, abs=1e-9)
        assert _population_std(flat) == pytest.approx(1.0, rel=1e-9)
    else:
        assert flat == [0.0] * len(flat)
