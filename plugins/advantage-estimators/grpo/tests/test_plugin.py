"""The entry module: what it registers, its configs, and that it imports light."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError
from rllm_advantage_estimator_grpo import plugin
from rllm_core.plugins import Kind, PluginManager

DISTRIBUTION = "rllm-advantage-estimator-grpo"
ESTIMATOR_NAMES = ["distill", "grpo", "prpo", "reinforce", "reinforce-plus-plus-baseline", "rloo"]
ALL_SPECS = list(plugin.rllm_advantage_estimators())


def test_manager_collects_every_estimator():
    manager = PluginManager(load_entry_points=False)
    manager.register(plugin, name="grpo", distribution=DISTRIBUTION)
    assert manager.names(Kind.ADVANTAGE_ESTIMATOR) == ESTIMATOR_NAMES
    assert manager.names(Kind.LOSS) == []


def test_the_plugin_and_the_estimators_import_neither_torch_nor_numpy():
    code = (
        "import sys, rllm_advantage_estimator_grpo.plugin as p\n"
        "import rllm_advantage_estimator_grpo.estimators\n"
        "list(p.rllm_advantage_estimators())\n"
        "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"


def test_defaults():
    assert plugin.GRPOConfig().model_dump() == {
        "normalize_std": True,
        "epsilon": 1e-6,
        "std": "sample",
    }
    assert plugin.ReinforceAdvantageConfig().model_dump() == {"baseline": 0.0}


@pytest.mark.parametrize(
    ("config", "values"),
    [
        (plugin.GRPOConfig, {"std": "biased"}),
        (plugin.GRPOConfig, {"epsilon": -1e-6}),
        (plugin.ReinforceAdvantageConfig, {"baseline": float("inf")}),
    ],
)
def test_invalid_options_are_rejected_with_the_value(config, values):
    with pytest.raises(ValidationError) as info:
        config(**values)
    (key,) = values
    assert key in str(info.value)
