"""Cuts and releases of the torch backend through the file object store: a trainer restored
from a cut in a new process incarnation ends bitwise equal to one that never stopped, and a
release carries the policy to a second backend that samples with it."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from rllm_core.algorithms.objective import Objective  # noqa: E402
from rllm_core.errors import CutDigestError  # noqa: E402
from rllm_core.run.cuts import (  # noqa: E402
    claim_incarnation,
    latest_cut,
    latest_release,
    load_release,
    publish_release,
    restore_cut,
    write_cut,
)
from rllm_core.run.state import DataOrder, LoopState, capture_rngs  # noqa: E402
from rllm_core.types import Datum, SampleRequest, SamplingParams  # noqa: E402
from rllm_loss_ppo.plugin import ReinforceLossConfig  # noqa: E402
from rllm_loss_ppo.reinforce import Reinforce  # noqa: E402
from rllm_object_store_file.objects import FileObjectStore  # noqa: E402
from rllm_trainer_backend_torch.backend import TorchBackend  # noqa: E402
from rllm_trainer_backend_torch.plugin import TorchBackendConfig  # noqa: E402
from rllm_trainer_backend_torch.testing import assert_same_state  # noqa: E402

VOCAB = 256  # the vocabulary of the tiny_model_dir fixture (tests/conftest.py)
PREFIX = "runs/cut-test"
REINFORCE = Reinforce(ReinforceLossConfig())
LORA = {"rank": 4, "alpha": 8, "dropout": 0.2}
FULL = {"rank": 0}


def backend(folder: Path, lora: dict) -> TorchBackend:
    return TorchBackend(
        TorchBackendConfig(
            model=str(folder),
            device="cpu",
            seed=7,
            learning_rate=0.01,
            lr_schedule="cosine",
            warmup_steps=1,
            total_steps=6,
            micro_batch_size=2,
            lora=lora,
        )
    )


def step_datums(step: int) -> list[Datum]:
    """A different batch each step, the same batch for the same step."""
    rng = random.Random(step)
    datums = []
    for length in (6, 9, 4):
        datums.append(
            Datum(
                token_ids=[rng.randrange(VOCAB) for _ in range(length)],
                logprobs=[-1.0] * length,
                advantages=[rng.uniform(-1, 1)] * length,
                action_mask=[i >= 2 for i in range(length)],
                observation_mask=[False] * length,
            )
        )
    return datums


def train(trainer: TorchBackend, steps: range) -> None:
    for step in steps:
        trainer.forward_backward(step_datums(step), Objective.of(REINFORCE))
        trainer.optim_step()


def loop_state_after(steps: int, watermark: int) -> LoopState:
    data = DataOrder(size=8, seed=5)
    for _ in range(steps):
        data.take(3)
    return LoopState(step=steps, data=data, rngs=capture_rngs(), buffer_watermark=watermark)


@pytest.mark.parametrize("lora", [LORA, FULL], ids=["lora-with-dropout", "full"])
def test_a_restored_cut_continues_bitwise_equal_to_never_stopping(tiny_model_dir, tmp_path, lora):
    straight = backend(tiny_model_dir, lora)
    train(straight, range(4))

    store = FileObjectStore(tmp_path / "store")
    first_incarnation = claim_incarnation(store, PREFIX)
    first = backend(tiny_model_dir, lora)
    train(first, range(2))
    cut_state = loop_state_after(2, watermark=11)
    written = write_cut(
        store,
        PREFIX,
        first,
        cut_state,
        trigger="scheduled",
        incarnation=first_incarnation,
        workdir=tmp_path / "work-1",
    )
    first.close()
    # Drawing from the generators here must not matter: the cut restores them.
    torch.rand(100)
    random.random()

    second_incarnation = claim_incarnation(store, PREFIX)
    assert second_incarnation == first_incarnation + 1
    resumed = backend(tiny_model_dir, lora)
    assert latest_cut(store, PREFIX) == written
    state, ref = restore_cut(store, PREFIX, resumed, tmp_path / "work-2")
    assert ref == written
    assert (ref.step, ref.trigger, ref.weight_version) == (2, "scheduled", 2)
    assert state.to_dict() == cut_state.to_dict()
    assert (state.step, state.buffer_watermark) == (2, 11)
    assert (resumed.weight_version, resumed.optimizer_steps) == (2, 2)
    train(resumed, range(2, 4))

    assert_same_state(straight, resumed)
    assert resumed.weight_version == 4


def test_a_release_carries_the_policy_to_a_sampling_backend(tiny_model_dir, tmp_path):
    store = FileObjectStore(tmp_path / "store")
    trainer = backend(tiny_model_dir, LORA)
    for step in range(2):
        train(trainer, range(step, step + 1))
        published = publish_release(store, PREFIX, trainer, tmp_path / "work", incarnation=1)
    assert latest_release(store, PREFIX) == published
    assert published.version == 2
    weight_keys = store.list(f"{PREFIX}/releases/{published.name}/weights/")
    assert weight_keys == [f"{PREFIX}/releases/{published.name}/weights/weights.safetensors"]

    sampler_side = backend(tiny_model_dir, LORA)
    assert load_release(store, PREFIX, sampler_side, tmp_path / "work") == 2
    for name, param in trainer.trainable_parameters.items():
        assert torch.equal(param, sampler_side.trainable_parameters[name]), name
    sampler = sampler_side.sampler()
    try:
        assert sampler.weight_version == 2
        request = SampleRequest(
            prompt_token_ids=[1, 2, 3], params=SamplingParams(max_tokens=3, seed=1)
        )
        result = asyncio.run(sampler.sample(request))
        assert result.weight_version == 2
    finally:
        sampler_side.close()

    key = weight_keys[0]
    damaged = bytearray(store.get(key))
    damaged[-1] ^= 0x01
    store.put(key, bytes(damaged))
    refused = backend(tiny_model_dir, LORA)
    before = {name: param.clone() for name, param in refused.trainable_parameters.items()}
    with pytest.raises(CutDigestError) as caught:
        load_release(store, PREFIX, refused, tmp_path / "work")
    assert caught.value.key == key
    assert refused.weight_version == 0
    for name, param in refused.trainable_parameters.items():
        assert torch.equal(param, before[name]), name
