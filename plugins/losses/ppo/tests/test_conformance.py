"""Every loss of rllm-loss-ppo against the core's conformance suites, with default and
non-default configs."""

from __future__ import annotations

from rllm_core.testing.suites.losses import loss_conformance_cases
from rllm_loss_ppo import plugin

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


class TestLosses(loss_conformance_cases(plugin.rllm_losses(), LOSS_CASES)):
    pass
