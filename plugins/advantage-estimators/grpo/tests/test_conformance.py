"""Every estimator of rllm-advantage-estimator-grpo against the core's conformance suite, with
default and non-default configs."""

from __future__ import annotations

from typing import Any

import pytest
from rllm_advantage_estimator_grpo import plugin
from rllm_core.testing.suites.losses import AdvantageEstimatorConformance

ESTIMATORS = {spec.name: spec for spec in plugin.rllm_advantage_estimators()}

ESTIMATOR_CASES = [
    ("grpo", {}),
    ("grpo", {"normalize_std": False}),
    ("grpo", {"std": "population", "epsilon": 0.0}),
    ("rloo", {}),
    ("reinforce", {}),
    ("reinforce", {"baseline": 0.5}),
    ("reinforce-plus-plus-baseline", {}),
    ("prpo", {"std": "population"}),
    ("distill", {"teacher": {"name": "torch"}, "reward_coef": 1.0}),
]


def _case_id(case: tuple[str, dict[str, Any]]) -> str:
    name, options = case
    return name + "".join(
        f"-{key}={value}" for key, value in sorted(options.items()) if key != "teacher"
    )


class TestAdvantageEstimators(AdvantageEstimatorConformance):
    @pytest.fixture(params=ESTIMATOR_CASES, ids=_case_id)
    def component_case(self, request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
        return request.param

    @pytest.fixture
    def estimator_spec(self, component_case):
        return ESTIMATORS[component_case[0]]

    @pytest.fixture
    def estimator(self, estimator_spec, component_case):
        return estimator_spec.build(component_case[1])
