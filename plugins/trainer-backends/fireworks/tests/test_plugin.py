"""The entry module: the spec, its config, light imports, and the shipped example plan."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError
from rllm_core.plugins.manager import get_plugin_manager
from rllm_trainer_backend_fireworks.plugin import FireworksBackendConfig

REPO = Path(__file__).resolve().parents[4]
PLAN = REPO / "examples" / "fireworks-daytona" / "plan.toml"


def test_the_manager_finds_the_fireworks_trainer() -> None:
    spec = get_plugin_manager().get("trainer_backend", "fireworks")
    assert spec.config is FireworksBackendConfig
    assert spec.factory_path == "rllm_trainer_backend_fireworks.backend:FireworksBackend"
    assert spec.trait("hosted_model") is True
    assert spec.trait("native_losses") == ("importance_sampling", "ppo", "cispo")


def test_config_has_loss_path_and_vocab_size() -> None:
    config = FireworksBackendConfig(model="m")
    assert (config.loss_path, config.vocab_size) == ("auto", None)
    config = FireworksBackendConfig(model="m", loss_path="native", vocab_size=151936)
    assert (config.loss_path, config.vocab_size) == ("native", 151936)
    with pytest.raises(ValidationError, match="loss_path"):
        FireworksBackendConfig(model="m", loss_path="server")
    with pytest.raises(ValidationError, match="vocab_size"):
        FireworksBackendConfig(model="m", vocab_size=0)


def test_entry_module_imports_neither_the_sdk_nor_torch() -> None:
    code = (
        "import sys, json, rllm_trainer_backend_fireworks.plugin;"
        "print(json.dumps([m for m in ('fireworks', 'torch') if m in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_config_requires_a_model_and_forbids_unknown_keys() -> None:
    with pytest.raises(ValidationError, match="model"):
        FireworksBackendConfig()
    with pytest.raises(ValidationError, match="lora_rnak"):
        FireworksBackendConfig(model="m", lora_rnak=8)
    with pytest.raises(ValidationError, match=r"betas must be in \[0, 1\)"):
        FireworksBackendConfig(model="m", betas=(0.9, 1.0))


def test_base_model_is_the_old_name_of_model() -> None:
    with pytest.warns(DeprecationWarning, match="rename the key: model = 'accounts/a/models/b'"):
        config = FireworksBackendConfig(base_model="accounts/a/models/b")
    assert config.model == "accounts/a/models/b"
    with pytest.raises(ValidationError, match="both model and base_model are set"):
        FireworksBackendConfig(model="m", base_model="m")


def test_example_plan_passes_plan_check() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rllm_core.cli", "plan", "check", str(PLAN)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "trainer_backend:fireworks" in result.stdout
    assert "sandbox_backend:daytona" in result.stdout
    assert "harness:shell" in result.stdout
    assert "base_model" not in result.stderr  # warnings name only a missing key or model
    assert "model =" in result.stdout and "base_model" not in result.stdout
