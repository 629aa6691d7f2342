"""The entry module: registration, config validation, and no heavy imports."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError
from rllm_core.plugins.manager import get_plugin_manager
from rllm_trainer_backend_tinker.plugin import TinkerBackendConfig


def test_registered_as_trainer_backend_tinker():
    spec = get_plugin_manager().get("trainer_backend", "tinker")
    assert spec.config is TinkerBackendConfig
    assert spec.factory.target == "rllm_trainer_backend_tinker.backend:TinkerBackend"
    assert spec.trait("hosted_model") is True
    assert spec.trait("native_losses") == ("importance_sampling", "ppo", "cispo")


def test_base_model_is_the_old_name_of_model():
    with pytest.warns(DeprecationWarning, match="rename the key: model = 'meta-llama/x'"):
        assert TinkerBackendConfig(base_model="meta-llama/x").model == "meta-llama/x"
    with pytest.raises(ValidationError, match="both model and base_model are set"):
        TinkerBackendConfig(model="a/b", base_model="a/b")


def test_entry_module_imports_neither_tinker_nor_torch():
    code = (
        "import sys, rllm_trainer_backend_tinker.plugin\n"
        "print(sorted(m for m in ('tinker', 'torch', 'numpy') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"


def test_defaults():
    config = TinkerBackendConfig()
    assert config.model == "Qwen/Qwen3-8B"
    assert config.lora_rank == 32
    assert config.betas == (0.9, 0.95)
    assert config.logprob_temperature == 1.0
    assert config.loss_path == "auto"
    assert config.vocab_size is None


def test_logprob_temperature_other_than_one_is_refused_with_the_reason():
    with pytest.raises(ValidationError, match="temperature 1"):
        TinkerBackendConfig(logprob_temperature=0.7)


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        ({"betas": (0.9, 1.0)}, "betas must be in"),
        ({"lora_rank": 0}, "lora_rank"),
        ({"checkpoint_ttl_s": 60}, "checkpoint_ttl_s"),
        ({"checkpoint_prefix": "a b"}, "checkpoint_prefix"),
        ({"api_key": "secret"}, "api_key"),
        ({"loss_path": "fused"}, "loss_path"),
        ({"vocab_size": 0}, "vocab_size"),
    ],
)
def test_invalid_options_name_the_key(options, fragment):
    with pytest.raises(ValidationError, match=fragment):
        TinkerBackendConfig(**options)
