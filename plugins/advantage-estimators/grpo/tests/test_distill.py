"""The distill estimator: per-token advantages from a teacher's logprobs, by hand, on a
multi-turn prefix-merged datum whose observation tokens get no signal."""

from __future__ import annotations

import pytest
from rllm_advantage_estimator_grpo import plugin
from rllm_advantage_estimator_grpo.estimators import Distill
from rllm_core.algorithms.datums import merge_trajectory
from rllm_core.ports import AdvantageEstimator, TokenAdvantages
from rllm_core.types import Step, Trajectory

TEACHER = {"name": "torch", "model": "smollm2-135m-instruct"}


def two_turns(advantage: float = 0.0):
    """Prompt [1, 2], completion [3, 4], observation [5], completion [6]: one datum."""
    first = Step(
        trace_id="t1", prompt_token_ids=[1, 2], completion_token_ids=[3, 4], logprobs=[-0.5, -1.0]
    )
    second = Step(
        trace_id="t2",
        prompt_token_ids=[1, 2, 3, 4, 5],
        completion_token_ids=[6],
        logprobs=[-2.0],
    )
    (datum,) = merge_trajectory(Trajectory(lineage_id="l", steps=(first, second)), advantage)
    assert datum.action_mask == [False, False, True, True, False, True]
    assert datum.observation_mask == [False, False, False, False, True, False]
    return datum


def distill(**options) -> Distill:
    return Distill(plugin.DistillConfig(teacher=TEACHER, **options))


def test_is_a_token_advantage_estimator_with_a_teacher_trait():
    estimator = distill()
    assert isinstance(estimator, AdvantageEstimator)
    assert isinstance(estimator, TokenAdvantages)
    (spec,) = [s for s in plugin.rllm_advantage_estimators() if s.name == "distill"]
    assert spec.trait("teacher") is True


def test_teacher_minus_student_on_action_tokens_only():
    datum = two_turns()
    # The teacher scores every position; prompt and observation values must not leak in.
    teacher = [0.0, -9.0, -0.25, -3.0, -7.0, -1.5]
    (row,) = distill().token_advantages([datum], [teacher])
    # -0.25 - (-0.5), -3.0 - (-1.0), -1.5 - (-2.0)
    assert row == [0.0, 0.0, 0.25, -2.0, 0.0, 0.5]


def test_coef_scales_and_the_reward_advantage_is_added():
    estimator = distill(coef=2.0, reward_coef=0.5)
    result = estimator.compute([[1.0, 0.0]])
    # GRPO over [1, 0]: +-0.5 / (sample std 0.70711 + 1e-6) = +-0.70711, times 0.5
    assert result.advantages == [pytest.approx([0.3535529, -0.3535529], abs=1e-6)]
    datum = two_turns(advantage=result.advantages[0][0])
    (row,) = estimator.token_advantages([datum], [[0.0, 0.0, -0.5, -1.0, 0.0, -1.0]])
    base = result.advantages[0][0]
    assert row == pytest.approx([0.0, 0.0, base, base, 0.0, base + 2.0])


def test_without_reward_coef_rewards_give_no_advantage():
    assert distill().compute([[1.0, 0.0], [0.5]]).advantages == [[0.0, 0.0], [0.0]]


def test_a_teacher_needs_a_name():
    with pytest.raises(ValueError, match="table with a name"):
        plugin.DistillConfig(teacher={"model": "x"})
