"""save_state / load_state: save, load and continue is bitwise equal to never stopping."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from rllm_core.algorithms.objective import Objective
from rllm_core.types import Datum
from rllm_loss_ppo.plugin import ReinforceLossConfig
from rllm_loss_ppo.reinforce import Reinforce
from rllm_trainer_backend_torch.backend import TorchBackend
from rllm_trainer_backend_torch.checkpoint import CheckpointError
from rllm_trainer_backend_torch.plugin import TorchBackendConfig
from rllm_trainer_backend_torch.testing import assert_same_state

VOCAB = 256
REINFORCE = Reinforce(ReinforceLossConfig())


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_llama) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama-checkpoint")
    tiny_llama(
        99, hidden_size=32, intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=32
    ).save_pretrained(folder)
    return folder


def config(folder: Path, **overrides) -> TorchBackendConfig:
    values = {
        "model": str(folder),
        "device": "cpu",
        "seed": 7,
        "learning_rate": 0.01,
        "lr_schedule": "cosine",
        "warmup_steps": 1,
        "total_steps": 5,
        "micro_batch_size": 2,
        **overrides,
    }
    return TorchBackendConfig(**values)


def step_datums(step: int) -> list[Datum]:
    """A different batch each step, the same batch for the same step."""
    rng = random.Random(step)
    datums = []
    for length in (6, 9, 4):
        action = [i >= 2 for i in range(length)]
        datums.append(
            Datum(
                token_ids=[rng.randrange(VOCAB) for _ in range(length)],
                logprobs=[-1.0] * length,
                advantages=[rng.uniform(-1, 1)] * length,
                action_mask=action,
                observation_mask=[False] * length,
            )
        )
    return datums


def train(trainer: TorchBackend, steps: range) -> list[dict[str, float]]:
    out = []
    for step in steps:
        metrics = dict(trainer.forward_backward(step_datums(step), Objective.of(REINFORCE)))
        metrics |= trainer.optim_step()
        out.append(metrics)
    return out


@pytest.mark.parametrize(
    "lora",
    [{"rank": 4, "alpha": 8, "dropout": 0.2}, {"rank": 0}],
    ids=["lora-with-dropout", "full"],
)
def test_save_load_continue_is_bitwise_equal_to_never_stopping(tiny_model_dir, tmp_path, lora):
    straight = TorchBackend(config(tiny_model_dir, lora=lora))
    straight_metrics = train(straight, range(3))

    first = TorchBackend(config(tiny_model_dir, lora=lora))
    resumed_metrics = train(first, range(1))
    first.save_state(str(tmp_path / "ckpt"))
    first.close()
    # Drawing from the generators here must not matter: the checkpoint restores them.
    torch.rand(100)
    random.random()
    resumed = TorchBackend(config(tiny_model_dir, lora=lora))
    resumed.load_state(str(tmp_path / "ckpt"))
    assert (resumed.weight_version, resumed.optimizer_steps) == (1, 1)
    resumed_metrics += train(resumed, range(1, 3))

    assert_same_state(straight, resumed)
    assert resumed_metrics == straight_metrics
    assert straight.weight_version == 3


def test_dropout_makes_the_random_state_matter(tiny_model_dir, tmp_path):
    """Without the generators restored, a LoRA-dropout run diverges: the bitwise test above
    would catch a checkpoint that forgot them."""
    lora = {"rank": 4, "dropout": 0.2}
    straight = TorchBackend(config(tiny_model_dir, lora=lora))
    train(straight, range(2))
    first = TorchBackend(config(tiny_model_dir, lora=lora))
    train(first, range(1))
    first.save_state(str(tmp_path / "ckpt"))
    resumed = TorchBackend(config(tiny_model_dir, lora=lora))
    resumed.load_state(str(tmp_path / "ckpt"))
    torch.manual_seed(12345)
    train(resumed, range(1, 2))
    differs = [
        name
        for name, param in straight.trainable_parameters.items()
        if not torch.equal(param, resumed.trainable_parameters[name])
    ]
    assert differs


def test_lora_checkpoint_holds_only_the_adapters(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file

    trainer = TorchBackend(config(tiny_model_dir, lora={"rank": 2}))
    train(trainer, range(1))
    trainer.save_state(str(tmp_path / "ckpt"))
    weights = load_file(str(tmp_path / "ckpt" / "weights.safetensors"))
    assert weights.keys() == trainer.trainable_parameters.keys()
    assert all(".lora_A." in name or ".lora_B." in name for name in weights)
    state = json.loads((tmp_path / "ckpt" / "state.json").read_text())
    assert state["counters"] == {"optimizer_steps": 1, "weight_version": 1}
    assert state["identity"]["lora"] == {
        "rank": 2,
        "alpha": 32.0,
        "target_modules": list(TorchBackendConfig().lora.target_modules),
    }


def test_a_state_for_another_lora_shape_is_refused(tiny_model_dir, tmp_path):
    saver = TorchBackend(config(tiny_model_dir, lora={"rank": 8}))
    saver.save_state(str(tmp_path / "ckpt"))
    loader = TorchBackend(config(tiny_model_dir, lora={"rank": 4}))
    with pytest.raises(CheckpointError) as caught:
        loader.load_state(str(tmp_path / "ckpt"))
    message = str(caught.value)
    assert "was saved for model" in message and "LoRA rank 8, alpha 32.0" in message
    assert "but this backend trains" in message and "LoRA rank 4, alpha 32.0" in message
    assert "differing: lora, parameters" in message


def test_a_full_state_is_refused_by_a_lora_backend(tiny_model_dir, tmp_path):
    TorchBackend(config(tiny_model_dir, lora={"rank": 0})).save_state(str(tmp_path / "ckpt"))
    loader = TorchBackend(config(tiny_model_dir, lora={"rank": 4}))
    with pytest.raises(CheckpointError, match=r"\(full-parameter training, float32\)"):
        loader.load_state(str(tmp_path / "ckpt"))


def test_not_a_checkpoint(tiny_model_dir, tmp_path):
    trainer = TorchBackend(config(tiny_model_dir))
    with pytest.raises(CheckpointError, match="is not a trainer checkpoint"):
        trainer.load_state(str(tmp_path))


def test_saving_between_forward_backward_and_optim_step_is_refused(tiny_model_dir, tmp_path):
    trainer = TorchBackend(config(tiny_model_dir))
    trainer.forward_backward(step_datums(0), Objective.of(REINFORCE))
    with pytest.raises(RuntimeError, match=r"call optim_step\(\) first"):
        trainer.save_state(str(tmp_path / "ckpt"))
    trainer.optim_step()
    trainer.save_state(str(tmp_path / "ckpt"))


def test_loading_clears_pending_gradients(tiny_model_dir, tmp_path):
    trainer = TorchBackend(config(tiny_model_dir))
    trainer.save_state(str(tmp_path / "ckpt"))
    trainer.forward_backward(step_datums(0), Objective.of(REINFORCE))
    trainer.load_state(str(tmp_path / "ckpt"))
    assert all(param.grad is None for param in trainer.trainable_parameters.values())
    with pytest.raises(RuntimeError, match="without gradients"):
        trainer.optim_step()
