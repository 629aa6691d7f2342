"""save_state / load_state through Tinker's checkpoint paths and tinker_state.json."""

from __future__ import annotations

import json

import pytest
import torch
from reference.service_faults import Reinforce
from rllm_core.algorithms.objective import Objective
from rllm_core.types import Datum
from rllm_trainer_backend_tinker.backend import TinkerBackend
from rllm_trainer_backend_tinker.checkpoint import STATE_FILE, CheckpointError
from rllm_trainer_backend_tinker.plugin import TinkerBackendConfig
from rllm_trainer_backend_tinker_tests_fake import FakeService

DATUM = Datum(
    token_ids=[3, 4, 6],
    logprobs=[0.0, -0.1, -0.2],
    advantages=[0.0, 1.0, 1.0],
    action_mask=[False, True, True],
    observation_mask=[False, False, False],
)


def _step(backend):
    backend.forward_backward([DATUM], Objective.of(Reinforce()))
    backend.optim_step()


@pytest.fixture
def service():
    return FakeService()


@pytest.fixture
def backend(service):
    config = TinkerBackendConfig(learning_rate=0.5, checkpoint_ttl_s=7200)
    backend = TinkerBackend(config, service_client=service)
    yield backend
    backend.close()


def test_save_writes_the_tinker_path_identity_and_counters(service, backend, tmp_path):
    _step(backend)
    backend.save_state(str(tmp_path / "ckpt"))
    assert service.training.saved_names == [("rllm-step000001", 7200, True)]
    record = json.loads((tmp_path / "ckpt" / STATE_FILE).read_text())
    assert record == {
        "format": 1,
        "tinker_path": "tinker://fake-run/weights/rllm-step000001",
        "identity": {
            "model": "Qwen/Qwen3-8B",
            "lora_rank": 32,
            "train_mlp": True,
            "train_attn": True,
            "train_unembed": True,
        },
        "counters": {"optimizer_steps": 1, "weight_version": 1},
    }


def test_load_restores_weights_counters_and_sampler(service, backend, tmp_path):
    _step(backend)
    saved = service.training.table.detach().clone()
    backend.save_state(str(tmp_path))
    _step(backend)
    _step(backend)
    assert backend.weight_version == 3
    assert not torch.equal(service.training.table.detach(), saved)
    backend.load_state(str(tmp_path))
    assert service.loaded == ["tinker://fake-run/weights/rllm-step000001"]
    assert backend.training_client is service.training
    assert torch.equal(service.training.table.detach(), saved)
    assert (backend.weight_version, backend.optimizer_steps) == (1, 1)
    client, version = backend.current_sampling_client()
    assert version == 1
    assert torch.equal(client.table, saved)
    _step(backend)
    assert backend.weight_version == 2


def test_save_between_forward_backward_and_optim_step_is_refused(backend, tmp_path):
    backend.forward_backward([DATUM], Objective.of(Reinforce()))
    with pytest.raises(RuntimeError, match="call optim_step"):
        backend.save_state(str(tmp_path))


def test_load_refuses_another_lora_shape(service, backend, tmp_path):
    backend.save_state(str(tmp_path))
    other = TinkerBackend(TinkerBackendConfig(lora_rank=8), service_client=service)
    with pytest.raises(CheckpointError, match=r"lora_rank=32.*lora_rank=8"):
        other.load_state(str(tmp_path))


def test_load_of_a_folder_without_state_names_the_file(backend, tmp_path):
    with pytest.raises(CheckpointError, match=f"{STATE_FILE} does not exist"):
        backend.load_state(str(tmp_path))


def test_load_of_a_malformed_file_says_so(backend, tmp_path):
    (tmp_path / STATE_FILE).write_text('{"format": 1}')
    with pytest.raises(CheckpointError, match="not a valid tinker state file"):
        backend.load_state(str(tmp_path))


def test_a_folder_saved_with_the_old_key_name_loads(service, backend, tmp_path):
    _step(backend)
    backend.save_state(str(tmp_path))
    record = json.loads((tmp_path / STATE_FILE).read_text())
    record["identity"]["base_model"] = record["identity"].pop("model")
    (tmp_path / STATE_FILE).write_text(json.dumps(record))
    backend.load_state(str(tmp_path))
    assert backend.weight_version == 1
    other = TinkerBackend(
        TinkerBackendConfig(model="meta-llama/Llama-3.2-1B"), service_client=service
    )
    with pytest.raises(CheckpointError, match=r"model='Qwen/Qwen3-8B'.*model='meta-llama"):
        other.load_state(str(tmp_path))
