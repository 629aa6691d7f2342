"""dppo-tv and dppo-kl against the core's loss conformance suite."""

from __future__ import annotations

from typing import Any

import pytest
from rllm_core.testing.suites.losses import LossConformance
from rllm_loss_dppo import plugin

LOSSES = {spec.name: spec for spec in plugin.rllm_losses()}
CASES = [
    ("dppo-tv", {}),
    ("dppo-tv", {"delta": 0.01, "ratio_cap": 2.0}),
    ("dppo-kl", {}),
    ("dppo-kl", {"delta": 0.001, "ratio_cap": 2.0}),
]


def _case_id(case: tuple[str, dict[str, Any]]) -> str:
    name, options = case
    return name + "".join(f"-{key}={value}" for key, value in sorted(options.items()))


class TestDPPO(LossConformance):
    @pytest.fixture(params=CASES, ids=_case_id)
    def component_case(self, request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
        return request.param

    @pytest.fixture
    def loss_spec(self, component_case):
        return LOSSES[component_case[0]]

    @pytest.fixture
    def loss(self, loss_spec, component_case):
        return loss_spec.build(component_case[1])
