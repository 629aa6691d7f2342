"""The backend against the fake service: losses, gradients sent, steps, publishing, state."""

from __future__ import annotations

import asyncio
import json
import math

import pytest
from fake_fireworks import CONFIG, FakeService, reply
from rllm_core.algorithms.objective import Objective
from rllm_core.errors import PlanError
from rllm_core.ports import LossContext, LossOutput, Sampler, TrainerBackend
from rllm_core.types import Datum, SampleRequest, SamplingParams
from rllm_trainer_backend_fireworks.backend import STATE_FILE, FireworksBackend


class Reinforce:
    name = "reinforce"

    def __call__(self, ctx: LossContext) -> LossOutput:
        loss = ctx.aggregate(-ctx.advantages * ctx.logprobs, ctx.action_mask)
        return LossOutput(loss=loss, metrics={"tokens": float(ctx.action_mask.sum())})


class MeanLogprob:
    name = "mean-lp"

    def __call__(self, ctx: LossContext) -> LossOutput:
        return LossOutput(loss=ctx.aggregate(ctx.logprobs, ctx.action_mask))


class Exploding:
    name = "exploding"

    def __call__(self, ctx: LossContext) -> LossOutput:
        raise AssertionError("a loss with coefficient 0 must not be computed")


def datums() -> list[Datum]:
    return [
        Datum(
            token_ids=[5, 6, 7, 8],
            logprobs=[0.0, 0.0, -0.5, -0.6],
            advantages=[0.0, 0.0, 1.0, 1.0],
            action_mask=[False, False, True, True],
            observation_mask=[False] * 4,
        ),
        Datum(
            token_ids=[5, 9, 3],
            logprobs=[0.0, 0.0, -0.2],
            advantages=[0.0, 0.0, -2.0],
            action_mask=[False, False, True],
            observation_mask=[False] * 3,
        ),
    ]


def test_build_creates_a_lora_client_and_publishes_version_0(
    backend: FireworksBackend, service: FakeService
) -> None:
    assert isinstance(backend, TrainerBackend)
    assert service.created == [
        {"base_model": CONFIG.model, "lora_rank": 8, "seed": 0, "lora_alpha": 32}
    ]
    assert service.training.saved_for_sampler == ["rllm-weights-v0-1"]
    assert backend.weight_version == 0
    assert backend.sampler_path == "snapshots/rllm-weights-v0-1"


def test_next_token_layout_and_token_mean_gradient(
    backend: FireworksBackend, service: FakeService
) -> None:
    metrics = backend.forward_backward(datums(), Objective.of(Reinforce(), [(Exploding(), 0.0)]))
    assert service.training.sent_inputs == [[([5, 6, 7], [6, 7, 8]), ([5, 9], [9, 3])]]
    # token-mean over 3 action tokens: dloss/dlp = -adv / 3, the weights sent are its negation
    weights = service.training.sent_weights[0]
    assert weights[0] == pytest.approx([0.0, 1 / 3, 1 / 3])
    assert weights[1] == pytest.approx([0.0, -2 / 3])
    # lp(t) = -0.1 t: (0.7 + 0.8 - 0.6) / 3
    assert metrics["reinforce/loss"] == pytest.approx(0.3)
    assert metrics["loss"] == pytest.approx(0.3)
    assert metrics["reinforce/tokens"] == 3.0
    assert metrics["fireworks/loss:sum"] == 1.5
    assert not any(key.startswith("exploding") for key in metrics)


def test_aux_loss_is_scaled_by_its_coefficient(
    backend: FireworksBackend, service: FakeService
) -> None:
    metrics = backend.forward_backward(datums(), Objective.of(Reinforce(), [(MeanLogprob(), 0.5)]))
    assert metrics["mean-lp/loss"] == pytest.approx(-0.6)
    assert metrics["loss"] == pytest.approx(0.3 + 0.5 * -0.6)
    weights = service.training.sent_weights[0]
    assert weights[0] == pytest.approx([0.0, 1 / 3 - 0.5 / 3, 1 / 3 - 0.5 / 3])
    assert weights[1] == pytest.approx([0.0, -2 / 3 - 0.5 / 3])


def test_seq_mean_token_mean_normalizes_per_sequence(
    backend: FireworksBackend, service: FakeService
) -> None:
    backend.forward_backward(datums(), Objective.of(Reinforce(), aggregation="seq-mean-token-mean"))
    weights = service.training.sent_weights[0]
    # two sequences; the first spreads over its 2 action tokens
    assert weights[0] == pytest.approx([0.0, 0.25, 0.25])
    assert weights[1] == pytest.approx([0.0, -1.0])


def test_same_metric_names_get_suffixes(backend: FireworksBackend) -> None:
    metrics = backend.forward_backward(datums(), Objective.of(Reinforce(), [(Reinforce(), 1.0)]))
    assert metrics["reinforce-2/loss"] == pytest.approx(0.3)
    assert metrics["loss"] == pytest.approx(0.6)


def test_optim_step_sends_adam_settings_and_publishes_new_weights(
    backend: FireworksBackend, service: FakeService
) -> None:
    backend.forward_backward(datums(), Objective.of(Reinforce()))
    metrics = backend.optim_step()
    adam = service.training.adam[0]
    assert (adam.learning_rate, adam.beta1, adam.beta2, adam.eps) == (1e-5, 0.9, 0.999, 1e-8)
    assert (adam.weight_decay, adam.grad_clip_norm) == (0.0, 1.0)
    assert metrics == {
        "learning_rate": 1e-5,
        "step": 1.0,
        "fireworks/skipped_step": 0.0,
        "fireworks/grad_norm": 0.25,
        "fireworks/retries": 0.0,
        "fireworks/sampler_retries": 0.0,
    }
    assert backend.weight_version == 1
    assert service.training.saved_for_sampler[-1] == "rllm-weights-v1-2"
    assert backend.sampling_client.path == "snapshots/rllm-weights-v1-2"
    assert service.training.samplers[0].closed is True


def test_sampler_passes_ids_and_settings_and_reports_the_version(
    backend: FireworksBackend, service: FakeService
) -> None:
    service.training.replies.append(reply([11, 2], [-0.25, -0.5], stop="stop"))
    sampler = backend.sampler()
    assert isinstance(sampler, Sampler)
    params = SamplingParams(max_tokens=7, temperature=1.0, top_p=0.9, stop_token_ids=(2,), seed=3)
    result = asyncio.run(sampler.sample(SampleRequest(prompt_token_ids=[1, 4], params=params)))
    assert result.completion_token_ids == [11, 2]
    assert result.logprobs == [-0.25, -0.5]
    assert result.finish_reason == "stop"
    assert result.weight_version == 0
    ids, count, sent = service.training.samplers[-1].requests[0]
    assert (ids, count) == ([1, 4], 1)
    assert (sent.max_tokens, sent.temperature, sent.top_p, sent.stop, sent.seed) == (
        7,
        1.0,
        0.9,
        [2],
        3,
    )


def test_sampler_refuses_a_stop_without_its_token(
    backend: FireworksBackend, service: FakeService
) -> None:
    service.training.replies.append(reply([11, 12], [-0.25, -0.5], stop="stop"))
    params = SamplingParams(stop_token_ids=(2,))
    with pytest.raises(RuntimeError, match="without returning the stop token"):
        asyncio.run(backend.sampler().sample(SampleRequest(prompt_token_ids=[1], params=params)))


def test_sampler_refuses_missing_logprobs(backend: FireworksBackend, service: FakeService) -> None:
    service.training.replies.append(reply([11], None, stop="length"))
    with pytest.raises(RuntimeError, match="1 tokens with no logprobs"):
        asyncio.run(backend.sampler().sample(SampleRequest(prompt_token_ids=[1])))


def test_save_and_load_state_round_trip(
    backend: FireworksBackend, service: FakeService, tmp_path
) -> None:
    backend.forward_backward(datums(), Objective.of(Reinforce()))
    backend.optim_step()
    backend.save_state(str(tmp_path / "cut"))
    state = json.loads((tmp_path / "cut" / STATE_FILE).read_text())
    assert state == {
        "checkpoint": "dcp/rllm-state-step1-1",
        "model": CONFIG.model,
        "lora_rank": 8,
        "weight_version": 1,
        "optimizer_steps": 1,
    }
    fresh = FireworksBackend(CONFIG, service=FakeService(training=service.training))
    fresh.load_state(str(tmp_path / "cut"))
    assert service.training.loaded == ["dcp/rllm-state-step1-1"]
    assert (fresh.weight_version, fresh.optimizer_steps) == (1, 1)
    other = FireworksBackend(CONFIG.model_copy(update={"lora_rank": 4}), service=FakeService())
    with pytest.raises(ValueError, match="lora_rank 8"):
        other.load_state(str(tmp_path / "cut"))


def test_a_state_folder_saved_with_the_old_key_name_loads(
    backend: FireworksBackend, service: FakeService, tmp_path
) -> None:
    backend.save_state(str(tmp_path))
    state = json.loads((tmp_path / STATE_FILE).read_text())
    state["base_model"] = state.pop("model")
    (tmp_path / STATE_FILE).write_text(json.dumps(state))
    backend.load_state(str(tmp_path))
    other = FireworksBackend(
        CONFIG.model_copy(update={"model": "accounts/a/models/b"}), service=FakeService()
    )
    with pytest.raises(ValueError, match="saved with model 'accounts/fireworks/models/qwen3-8b'"):
        other.load_state(str(tmp_path))


def test_close_is_idempotent_and_final(backend: FireworksBackend, service: FakeService) -> None:
    backend.close()
    backend.close()
    assert service.closed is True
    with pytest.raises(RuntimeError, match="closed"):
        backend.optim_step()


def test_refuses_a_logprob_temperature_the_trainer_cannot_compute(service: FakeService) -> None:
    config = CONFIG.model_copy(update={"logprob_temperature": 0.7})
    with pytest.raises(PlanError, match="temperature 1 only") as caught:
        FireworksBackend(config, service=service)
    assert caught.value.issues[0].key == "logprob_temperature"
    assert service.created == []


def test_without_an_api_key_the_build_names_the_variable(monkeypatch) -> None:
    monkeypatch.delenv("FIREWORKS_API_KEY", raising=False)
    with pytest.raises(PlanError, match=r"\$FIREWORKS_API_KEY is not set"):
        FireworksBackend(CONFIG)


def test_a_one_token_datum_is_refused(backend: FireworksBackend) -> None:
    short = Datum(
        token_ids=[1],
        logprobs=[0.0],
        advantages=[0.0],
        action_mask=[False],
        observation_mask=[False],
    )
    with pytest.raises(ValueError, match="at least 2 tokens"):
        backend.forward_backward([short], Objective.of(Reinforce()))
    assert math.isfinite(backend.forward_backward(datums(), Objective.of(Reinforce()))["loss"])
