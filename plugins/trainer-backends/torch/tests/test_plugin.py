"""The entry module: what it registers, its config and its errors, and that it imports light."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest
from pydantic import ValidationError
from rllm_core.plugins import Kind, PluginManager
from rllm_core.plugins.catalog import known_provider
from rllm_trainer_backend_torch import plugin

DISTRIBUTION = "rllm-trainer-backend-torch"


def test_manager_collects_the_torch_trainer_backend():
    manager = PluginManager(load_entry_points=False)
    manager.register(plugin, name="torch", distribution=DISTRIBUTION)
    assert manager.names(Kind.TRAINER_BACKEND) == ["torch"]
    spec = manager.get("trainer_backend", "torch")
    assert spec.config is plugin.TorchBackendConfig
    assert spec.factory.target == "rllm_trainer_backend_torch.backend:TorchBackend"
    assert known_provider(spec.kind, spec.name) == DISTRIBUTION


def test_entry_point_names_the_plugin_module():
    (entry_point,) = [
        ep for ep in importlib.metadata.entry_points(group="rllm_core") if ep.name == "torch"
    ]
    assert entry_point.value == "rllm_trainer_backend_torch.plugin"
    assert entry_point.dist is not None and entry_point.dist.name == DISTRIBUTION


def test_defaults():
    config = plugin.TorchBackendConfig()
    assert config.model == "smollm2-135m-instruct"
    assert (config.device, config.dtype, config.seed) == ("auto", "float32", 0)
    assert (config.lora.rank, config.lora.alpha, config.lora.dropout) == (16, 32.0, 0.0)
    assert config.lora.target_modules == (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )
    assert not config.lora.full and plugin.LoraSettings(rank=0).full
    assert (config.learning_rate, config.weight_decay, config.betas, config.eps) == (
        2e-4,
        0.0,
        (0.9, 0.999),
        1e-8,
    )
    assert (config.max_grad_norm, config.lr_schedule, config.warmup_steps) == (1.0, "constant", 0)
    assert config.total_steps is None
    assert (config.micro_batch_size, config.gradient_checkpointing) == (4, False)
    assert config.logprob_temperature == 1.0
    assert (config.max_batch_size, config.max_seq_len) == (32, None)
    assert config.cpu_threads is None


@pytest.mark.parametrize("model", [plugin.TorchBackendConfig, plugin.LoraSettings])
def test_every_key_is_documented(model):
    undocumented = [name for name, field in model.model_fields.items() if not field.description]
    assert not undocumented


def test_a_plan_table_validates():
    config = plugin.TorchBackendConfig.model_validate(
        {
            "device": "cuda:1",
            "dtype": "bfloat16",
            "lora": {"rank": 8, "target_modules": ["q_proj", "v_proj"]},
            "lr_schedule": "cosine",
            "warmup_steps": 10,
            "total_steps": 100,
            "betas": [0.9, 0.95],
        }
    )
    assert config.lora.target_modules == ("q_proj", "v_proj")
    assert config.betas == (0.9, 0.95)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"lr_schedule": "linear"}, "set total_steps"),
        ({"lr_schedule": "cosine", "total_steps": 5, "warmup_steps": 5}, "smaller than total"),
        ({"device": "gpu"}, "device"),
        ({"device": "cuda:x"}, "device"),
        ({"dtype": "float16"}, "dtype"),
        ({"betas": [0.9, 1.0]}, r"betas must be in \[0, 1\), got \[0.9, 1.0\]"),
        ({"lora": {"rank": -1}}, "rank"),
        ({"lora": {"dropout": 1.0}}, "dropout"),
        ({"lora": {"target_modules": []}}, "target_modules"),
        ({"lora": {"r": 8}}, "r"),
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"learning_rate": float("inf")}, "learning_rate"),
        ({"max_grad_norm": -1.0}, "max_grad_norm"),
        ({"micro_batch_size": 0}, "micro_batch_size"),
        ({"cpu_threads": 0}, "cpu_threads"),
        ({"logprob_temperature": 0.0}, "logprob_temperature"),
        ({"lora_rank": 8}, "lora_rank"),
    ],
)
def test_config_errors_name_the_key(values, message):
    with pytest.raises(ValidationError, match=message):
        plugin.TorchBackendConfig.model_validate(values)


def test_entry_module_does_not_import_torch():
    code = (
        "import sys, rllm_trainer_backend_torch.plugin as p\n"
        "list(p.rllm_trainer_backends())\n"
        "p.TorchBackendConfig()\n"
        "heavy = ('torch', 'numpy', 'transformers', 'peft', 'safetensors')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "[]"
