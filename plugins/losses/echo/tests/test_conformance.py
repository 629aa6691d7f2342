"""echo against the core's loss conformance suite."""

from __future__ import annotations

import pytest
from rllm_core.testing.suites.losses import LossConformance
from rllm_loss_echo import plugin

(SPEC,) = plugin.rllm_losses()


class TestEcho(LossConformance):
    @pytest.fixture(params=[{}, {"coef": 0.0}, {"coef": 1.0}], ids=["default", "coef-0", "coef-1"])
    def loss(self, loss_spec, request: pytest.FixtureRequest):
        return loss_spec.build(request.param)

    @pytest.fixture
    def loss_spec(self):
        return SPEC
