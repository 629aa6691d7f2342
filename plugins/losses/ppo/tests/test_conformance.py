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
    ("reinforce-kl", {}),
    (
        "reinforce-kl",
        {
            "direction": "backward",
            "kl_approx": "k1",
            "ratio_clamp_min": 0.5,
            "ratio_clamp_max": 2.0,
        },
    ),
    ("reinforce-kl", {"kl_approx": "k2", "kl_coef": 1.0, "aggregation": "seq-mean-token-sum"}),
]


class TestLosses(loss_conformance_cases(plugin.rllm_losses(), LOSS_CASES)):
    pass
