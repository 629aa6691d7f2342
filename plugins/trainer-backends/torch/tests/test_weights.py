"""save_weights / load_weights: a policy release from a training backend to one that samples."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from rllm_core.algorithms.objective import Objective
from rllm_core.ports import WeightReleaser
from rllm_core.types import Datum, SampleRequest, SamplingParams
from rllm_loss_ppo.plugin import ReinforceLossConfig
from rllm_loss_ppo.reinforce import Reinforce
from rllm_trainer_backend_torch.backend import TorchBackend
from rllm_trainer_backend_torch.checkpoint import CheckpointError
from rllm_trainer_backend_torch.plugin import TorchBackendConfig
from safetensors import safe_open

VOCAB = 128
REINFORCE = Reinforce(ReinforceLossConfig())


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_llama) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama-weights")
    tiny_llama(
        5, hidden_size=32, intermediate_size=64, vocab_size=VOCAB, max_position_embeddings=32
    ).save_pretrained(folder)
    return folder


def backend(folder: Path, **lora) -> TorchBackend:
    return TorchBackend(
        TorchBackendConfig(
            model=str(folder), device="cpu", seed=3, learning_rate=0.05, lora=lora or {"rank": 2}
        )
    )


def train_once(trainer: TorchBackend) -> None:
    rng = random.Random(0)
    datums = [
        Datum(
            token_ids=[rng.randrange(VOCAB) for _ in range(6)],
            logprobs=[-1.0] * 6,
            advantages=[1.0] * 6,
            action_mask=[i >= 2 for i in range(6)],
            observation_mask=[False] * 6,
        )
        for _ in range(2)
    ]
    trainer.forward_backward(datums, Objective.of(REINFORCE))
    trainer.optim_step()


def snapshot(trainer: TorchBackend) -> dict[str, torch.Tensor]:
    return {name: param.detach().clone() for name, param in trainer.trainable_parameters.items()}


def test_lora_weights_hold_the_adapters_and_their_version(tiny_model_dir, tmp_path):
    trainer = backend(tiny_model_dir)
    assert isinstance(trainer, WeightReleaser)
    train_once(trainer)
    trainer.save_weights(str(tmp_path / "release"))
    assert [p.name for p in (tmp_path / "release").iterdir()] == ["weights.safetensors"]
    with safe_open(str(tmp_path / "release" / "weights.safetensors"), framework="pt") as handle:
        names = set(handle.keys())
        metadata = handle.metadata()
    assert names == trainer.trainable_parameters.keys()
    assert all(".lora_A." in name or ".lora_B." in name for name in names)
    assert metadata["weight_version"] == "1"
    assert json.loads(metadata["identity"]) == trainer.identity()


@pytest.mark.parametrize("lora", [{"rank": 2}, {"rank": 0}], ids=["lora", "full"])
def test_loaded_weights_are_sampled_under_the_given_version(tiny_model_dir, tmp_path, lora):
    trainer = backend(tiny_model_dir, **lora)
    train_once(trainer)
    trainer.save_weights(str(tmp_path / "release"))

    sampler_side = backend(tiny_model_dir, **lora)
    sampler = sampler_side.sampler()
    try:
        assert sampler.weight_version == 0
        train_once(sampler_side)
        sampler_side.load_weights(str(tmp_path / "release"), 7)
        assert (sampler_side.weight_version, sampler.weight_version) == (7, 7)
        for name, param in trainer.trainable_parameters.items():
            assert torch.equal(param, sampler_side.trainable_parameters[name]), name
        request = SampleRequest(
            prompt_token_ids=[3, 4, 5], params=SamplingParams(max_tokens=4, seed=11)
        )
        ours, theirs = (
            sampler.sample_many([request])[0],
            trainer.sampler().sample_many([request])[0],
        )
        assert ours.weight_version == 7
        assert ours.completion_token_ids == theirs.completion_token_ids
    finally:
        sampler_side.close()
        trainer.close()


def test_loading_drops_pending_gradients(tiny_model_dir, tmp_path):
    trainer = backend(tiny_model_dir)
    trainer.save_weights(str(tmp_path / "release"))
    trainer.forward_backward(
        [
            Datum(
                token_ids=[1, 2, 3],
                logprobs=[-1.0] * 3,
                advantages=[1.0] * 3,
                action_mask=[False, True, True],
                observation_mask=[False] * 3,
            )
        ],
        Objective.of(REINFORCE),
    )
    trainer.load_weights(str(tmp_path / "release"), 1)
    assert all(param.grad is None for param in trainer.trainable_parameters.values())
    with pytest.raises(RuntimeError, match="without gradients"):
        trainer.optim_step()


@pytest.mark.parametrize(
    ("saved", "loading", "message"),
    [
        (
            {"rank": 4},
            {"rank": 2},
            r"LoRA rank 4, alpha 32.0.*but this backend trains.*LoRA rank 2",
        ),
        ({"rank": 0}, {"rank": 2}, r"\(full-parameter training, float32\)"),
    ],
    ids=["another-lora-shape", "full-into-lora"],
)
def test_weights_of_another_shape_are_refused_and_nothing_changes(
    tiny_model_dir, tmp_path, saved, loading, message
):
    backend(tiny_model_dir, **saved).save_weights(str(tmp_path / "release"))
    loader = backend(tiny_model_dir, **loading)
    before = snapshot(loader)
    with pytest.raises(CheckpointError, match=message):
        loader.load_weights(str(tmp_path / "release"), 3)
    assert loader.weight_version == 0
    after = snapshot(loader)
    assert all(torch.equal(before[name], after[name]) for name in before)


def test_a_folder_without_weights_is_refused(tiny_model_dir, tmp_path):
    loader = backend(tiny_model_dir)
    with pytest.raises(CheckpointError, match="holds no policy weights"):
        loader.load_weights(str(tmp_path), 1)
    loader.save_state(str(tmp_path / "state"))
    with pytest.raises(CheckpointError, match="is not a weights file of format 1"):
        loader.load_weights(str(tmp_path / "state"), 1)
