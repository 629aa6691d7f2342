"""The entry module: what it registers, its configs, and that it imports light."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError
from rllm_core.plugins import Kind, PluginManager
from rllm_loss_dppo import plugin

DISTRIBUTION = "rllm-loss-dppo"
SPECS = list(plugin.rllm_losses())


def test_manager_collects_both_losses():
    manager = PluginManager(load_entry_points=False)
    manager.register(plugin, name="dppo", distribution=DISTRIBUTION)
    assert manager.names(Kind.LOSS) == ["dppo-kl", "dppo-tv"]
    assert manager.get("loss", "DPPO_TV").trait("role") == "policy"
    assert manager.get("loss", "dppo-kl").trait("role") == "policy"


def test_defaults():
    assert plugin.DPPOTVConfig().model_dump() == {"delta": 0.15, "ratio_cap": None}
    assert plugin.DPPOKLConfig().model_dump() == {"delta": 0.05, "ratio_cap": None}


@pytest.mark.parametrize(
    ("config", "values"),
    [
        (plugin.DPPOTVConfig, {"delta": 0.0}),
        (plugin.DPPOTVConfig, {"delta": 1.5}),
        (plugin.DPPOKLConfig, {"delta": -0.1}),
        (plugin.DPPOKLConfig, {"ratio_cap": 0.0}),
        (plugin.DPPOKLConfig, {"delta": float("nan")}),
        (plugin.DPPOTVConfig, {"clip_ratio": 0.2}),
    ],
)
def test_invalid_options_are_rejected_with_the_key(config, values):
    with pytest.raises(ValidationError) as info:
        config(**values)
    (key,) = values
    assert key in str(info.value)


def test_entry_module_does_not_import_torch():
    code = (
        "import sys, rllm_loss_dppo.plugin as p\n"
        "list(p.rllm_losses())\n"
        "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"
