"""Every loss of rllm-loss-ppo against the core's conformance suites, with default and
non-default configs."""

from __future__ import annotations

from typing import Any

import pytest
from rllm_core.testing.suites.losses import LossConformance
from rllm_loss_ppo import plugin

LOSSES = {spec.name: spec for spec in plugin.rllm_losses()}

LOSS_CASES = [
    ("ppo-clip", {}),
    ("ppo-clip", {"eps_high": 0.28, "dual_clip_c": 3.0}),
    ("cispo", {}),
    ("cispo", {"eps_low": 0.2, "eps_high": 0.2}),
    ("gspo", {}),
    ("gspo", {"eps_low": 0.2, "eps_high": 0.2}),
    ("reinforce", {}),
    ("reinforce", {"ratio_cap": 2.0}),
]


def _case_id(case: tuple[str, dict[str, Any]]) -> str:
    name, options = case
    return name + "".join(f"-{key}={value}" for key, value in sorted(options.items()))


class TestLosses(LossConformance):
    @pytest.fixture(params=LOSS_CASES, ids=_case_id)
    def component_case(self, request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
        return request.param

    @pytest.fixture
    def loss_spec(self, component_case):
        return LOSSES[component_case[0]]

    @pytest.fixture
    def loss(self, loss_spec, component_case):
        return loss_spec.build(component_case[1])
