"""The entry module: what it registers, its configs, and that it imports light."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError
from rllm_core.plugins import Kind, PluginManager
from rllm_loss_ppo import plugin

DISTRIBUTION = "rllm-loss-ppo"
LOSS_NAMES = ["cispo", "gspo", "ppo-clip", "reinforce", "reinforce-kl"]
ALL_SPECS = list(plugin.rllm_losses())


def test_manager_collects_every_component():
    manager = PluginManager(load_entry_points=False)
    manager.register(plugin, name="ppo", distribution=DISTRIBUTION)
    assert manager.names(Kind.LOSS) == LOSS_NAMES
    assert manager.names(Kind.ADVANTAGE_ESTIMATOR) == []
    assert all(manager.get("loss", name).trait("role") == "policy" for name in LOSS_NAMES)


def test_entry_module_imports_neither_torch_nor_numpy():
    code = (
        "import sys, rllm_loss_ppo.plugin as p\n"
        "list(p.rllm_losses())\n"
        "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"


def test_defaults():
    assert plugin.PPOClipConfig().model_dump() == {
        "eps_low": 0.2,
        "eps_high": 0.2,
        "dual_clip_c": None,
    }
    assert plugin.CISPOConfig().model_dump() == {"eps_low": 1.0, "eps_high": 0.28}
    assert plugin.GSPOConfig().model_dump() == {"eps_low": 3e-4, "eps_high": 4e-4}
    assert plugin.ReinforceLossConfig().model_dump() == {"ratio_cap": None}
    assert plugin.ReinforceKLConfig().model_dump() == {
        "kl_coef": 0.1,
        "direction": "forward",
        "kl_approx": "k3",
        "ratio_clamp_min": None,
        "ratio_clamp_max": None,
        "aggregation": None,
    }
    assert plugin.ReinforceKLConfig().pinned_aggregation() is None
    pinned = plugin.ReinforceKLConfig(aggregation="seq-mean-token-sum")
    assert pinned.pinned_aggregation() == "seq-mean-token-sum"


@pytest.mark.parametrize(
    ("config", "values"),
    [
        (plugin.PPOClipConfig, {"eps_low": 1.0}),
        (plugin.PPOClipConfig, {"eps_high": -0.1}),
        (plugin.PPOClipConfig, {"dual_clip_c": 1.0}),
        (plugin.PPOClipConfig, {"clip": 0.2}),
        (plugin.CISPOConfig, {"eps_low": 1.5}),
        (plugin.GSPOConfig, {"eps_high": float("nan")}),
        (plugin.ReinforceLossConfig, {"ratio_cap": 0.0}),
        (plugin.ReinforceKLConfig, {"kl_coef": -0.1}),
        (plugin.ReinforceKLConfig, {"direction": "sideways"}),
        (plugin.ReinforceKLConfig, {"kl_approx": "k4"}),
        (plugin.ReinforceKLConfig, {"ratio_clamp_min": 1.5}),
        (plugin.ReinforceKLConfig, {"ratio_clamp_max": 0.5}),
        (plugin.ReinforceKLConfig, {"aggregation": "token-sum"}),
    ],
)
def test_invalid_options_are_rejected_with_the_value(config, values):
    with pytest.raises(ValidationError) as info:
        config(**values)
    (key,) = values
    assert key in str(info.value)
