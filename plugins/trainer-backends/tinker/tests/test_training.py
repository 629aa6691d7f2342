"""forward_backward and optim_step against the fake service: the losses see Tinker's logprobs
and their gradient reaches the model."""

from __future__ import annotations

import math

import pytest
import tinker
import torch
from rllm_core.algorithms.objective import Objective
from rllm_core.ports import LossOutput
from rllm_trainer_backend_tinker.backend import TinkerBackend
from rllm_trainer_backend_tinker.plugin import TinkerBackendConfig
from rllm_trainer_backend_tinker_tests_fake import CHAIN_DATUMS as DATUMS
from rllm_trainer_backend_tinker_tests_fake import FakeService, bigram_logprobs, chain_table

L = math.log(math.exp(2.0) + 7.0)  # log-partition of a chain_table row
PEAK = 2.0 - L  # logprob of the chain's next token; any other token has -L


class Reinforce:
    name = "reinforce-test"

    def __call__(self, ctx):
        return LossOutput(
            loss=ctx.aggregate(-ctx.advantages * ctx.logprobs, ctx.action_mask),
            metrics={"ratio_max": float((ctx.logprobs.detach() - ctx.old_logprobs).exp().max())},
        )


class ObservationNll:
    name = "obs-nll"

    def __call__(self, ctx):
        return LossOutput(loss=ctx.aggregate(-ctx.logprobs, ctx.observation_mask))


class Exploding:
    name = "exploding"

    def __call__(self, ctx):
        raise AssertionError("a loss with coefficient 0 must not be computed")


def _expected_grad(obs_coef: float) -> torch.Tensor:
    """The same loss computed directly on the bigram table with autograd."""
    table = chain_table().requires_grad_(True)
    first = bigram_logprobs(table, [0, 1, 2], [1, 2, 5])
    second = bigram_logprobs(table, [3, 4, 6], [4, 6, 7])
    policy = -(first[1] + first[2] - second[0] - second[2]) / 4
    observation = -second[1] / 1
    (policy + obs_coef * observation).backward()
    return table.grad


@pytest.fixture
def service():
    return FakeService()


@pytest.fixture
def backend(service):
    backend = TinkerBackend(TinkerBackendConfig(learning_rate=0.1), service_client=service)
    yield backend
    backend.close()


def test_construction_creates_the_lora_client_and_publishes_version_0(service, backend):
    assert service.created == [
        {
            "base_model": "Qwen/Qwen3-8B",
            "rank": 32,
            "seed": 0,
            "train_mlp": True,
            "train_attn": True,
            "train_unembed": True,
        }
    ]
    client, version = backend.current_sampling_client()
    assert (client.generation, version, backend.weight_version) == (1, 0, 0)


def test_policy_loss_value_metrics_and_gradient(service, backend):
    metrics = backend.forward_backward(DATUMS, Objective.of(Reinforce()))
    # -(PEAK - L - PEAK - PEAK) / 4 = (PEAK + L) / 4 = 0.5
    assert metrics["loss"] == pytest.approx(0.5, abs=1e-6)
    assert metrics["reinforce-test/loss"] == pytest.approx(0.5, abs=1e-6)
    assert metrics["reinforce-test/ratio_max"] == 1.0
    assert metrics["tokens"] == 8.0
    assert metrics["sequences"] == 2.0
    assert metrics["action_tokens"] == 4.0
    assert metrics["observation_tokens"] == 1.0
    assert metrics["tinker/loss:sum"] == pytest.approx(0.5, abs=1e-6)
    torch.testing.assert_close(service.training.table.grad, _expected_grad(0.0))


def test_aux_loss_uses_observation_normalizers_and_its_coefficient(service, backend):
    metrics = backend.forward_backward(
        DATUMS, Objective.of(Reinforce(), [(ObservationNll(), 0.5), (Exploding(), 0.0)])
    )
    assert metrics["obs-nll/loss"] == pytest.approx(L, abs=1e-5)
    assert metrics["loss"] == pytest.approx(0.5 + 0.5 * L, abs=1e-5)
    assert not any(key.startswith("exploding") for key in metrics)
    torch.testing.assert_close(service.training.table.grad, _expected_grad(0.5))


def test_aux_coefficient_must_be_finite(backend):
    with pytest.raises(ValueError, match=r"aux_losses\[0\] has coefficient nan"):
        backend.forward_backward(
            DATUMS, Objective.of(Reinforce(), [(ObservationNll(), float("nan"))])
        )


def test_optim_step_sends_adam_params_and_publishes_new_weights(service, backend):
    with pytest.raises(RuntimeError, match="call forward_backward"):
        backend.optim_step()
    backend.forward_backward(DATUMS, Objective.of(Reinforce()))
    grad = service.training.table.grad.clone()
    metrics = backend.optim_step()
    assert service.training.optim_params == [
        tinker.types.AdamParams(
            learning_rate=0.1,
            beta1=0.9,
            beta2=0.95,
            eps=1e-12,
            weight_decay=0.0,
            grad_clip_norm=1.0,
        )
    ]
    assert metrics["learning_rate"] == 0.1
    assert metrics["step"] == 1.0
    assert metrics["tinker/grad_norm"] == pytest.approx(float(grad.norm()))
    client, version = backend.current_sampling_client()
    assert (client.generation, version, backend.weight_version) == (2, 1, 1)
    torch.testing.assert_close(client.table, chain_table() - 0.1 * grad)
    with pytest.raises(RuntimeError, match="call forward_backward"):
        backend.optim_step()


def test_closed_backend_refuses_work_and_leaves_an_injected_client_open(service, backend):
    backend.close()
    backend.close()
    assert service.closed is False
    with pytest.raises(RuntimeError, match="closed"):
        backend.forward_backward(DATUMS, Objective.of(Reinforce()))


def test_without_an_injected_client_the_backend_builds_a_real_one():
    with pytest.raises(AssertionError, match="network guard"):
        TinkerBackend(TinkerBackendConfig())


def test_an_installed_loss_plugin_trains_and_is_named_by_its_component(service, backend):
    from rllm_core.plugins.manager import get_plugin_manager

    spec = get_plugin_manager().get("loss", "dppo-tv")
    loss = spec.build({"delta": 0.15})
    metrics = backend.forward_backward(DATUMS, Objective.of(loss, name=spec.name))
    assert "dppo-tv/loss" in metrics
    assert metrics["loss"] == metrics["dppo-tv/loss"]
    assert service.training.table.grad is not None
    assert float(service.training.table.grad.abs().sum()) > 0.0
