"""dppo-tv and dppo-kl against the core's loss conformance suite."""

from __future__ import annotations

from rllm_core.testing.suites.losses import loss_conformance_cases
from rllm_loss_dppo import plugin

CASES = [
    ("dppo-tv", {}),
    ("dppo-tv", {"delta": 0.01, "ratio_cap": 2.0}),
    ("dppo-kl", {}),
    ("dppo-kl", {"delta": 0.001, "ratio_cap": 2.0}),
]


class TestDPPO(loss_conformance_cases(plugin.rllm_losses(), CASES)):
    pass
