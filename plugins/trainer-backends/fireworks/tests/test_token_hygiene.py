"""Datums the trainer would fail on are dropped before the step, naming their session; a step
whose datums were all dropped sends nothing, publishes nothing and keeps the version."""

from __future__ import annotations

import pytest
from fake_fireworks import FakeService
from reference.service_faults import Reinforce
from rllm_core.algorithms.objective import Objective
from rllm_core.types import Datum
from rllm_loss_ppo.plugin import PPOClipConfig
from rllm_loss_ppo.ppo_clip import PPOClip
from rllm_trainer_backend_fireworks.backend import FireworksBackend
from rllm_trainer_backend_fireworks.plugin import FireworksBackendConfig

MODEL = "accounts/fireworks/models/qwen3-8b"


def datum(tokens: list[int], action: list[bool], session: str) -> Datum:
    return Datum(
        token_ids=tokens,
        logprobs=[-0.5 if a else 0.0 for a in action],
        advantages=[1.0] * len(tokens),
        action_mask=action,
        observation_mask=[False] * len(tokens),
        metadata={"session_id": session},
    )


GOOD = datum([5, 6, 7], [False, True, True], "s-good")
OUT_OF_VOCAB = datum([5, 60, 7], [False, True, True], "s-oov")
NEGATIVE = datum([5, -1, 7], [False, True, True], "s-negative")
EMPTY = datum([5, 6, 7], [False, False, False], "s-empty")


def backend_over(service: FakeService, **config: object) -> FireworksBackend:
    return FireworksBackend(FireworksBackendConfig(model=MODEL, **config), service=service)


@pytest.mark.parametrize(
    "objective",
    [Objective.of(PPOClip(PPOClipConfig()), name="ppo-clip"), Objective.of(Reinforce())],
    ids=["native", "custom"],
)
def test_bad_datums_are_dropped_and_the_rest_trained(objective: Objective) -> None:
    service = FakeService()
    backend = backend_over(service, vocab_size=50)
    with pytest.warns(RuntimeWarning) as caught:
        metrics = backend.forward_backward([OUT_OF_VOCAB, GOOD, EMPTY], objective)
    messages = [str(w.message) for w in caught]
    assert any("'s-oov'" in m and "token id 60" in m and "[0, 50)" in m for m in messages)
    assert any("'s-empty'" in m and "no sampled token" in m for m in messages)
    assert not any("s-good" in m for m in messages)
    training = service.training
    if training.native:
        [(sent, _, _)] = training.native
        inputs = [d.model_input.to_ints() for d in sent]
    else:
        [sent_inputs] = training.sent_inputs
        inputs = [ids for ids, _ in sent_inputs]
    assert inputs == [[5, 6]]
    assert metrics["fireworks/dropped_datums"] == 2.0
    assert metrics["fireworks/dropped_out_of_vocab"] == 1.0
    assert metrics["fireworks/dropped_empty"] == 1.0
    assert metrics["sequences"] == 1.0 and "fireworks/skipped_step" not in metrics
    assert backend.optim_step()["fireworks/skipped_step"] == 0.0
    assert backend.weight_version == 1


def test_without_vocab_size_the_tokenizers_length_bounds_the_ids() -> None:
    service = FakeService()
    backend = backend_over(service, loss_path="custom")
    past = datum([5, 49152, 7], [False, True, True], "s-past")
    with pytest.warns(RuntimeWarning) as caught:
        metrics = backend.forward_backward(
            [NEGATIVE, OUT_OF_VOCAB, past], Objective.of(Reinforce())
        )
    assert [str(w.message).split("'")[1] for w in caught] == ["s-negative", "s-past"]
    assert "token id 49152 at position 1 is outside [0, 49152)" in str(caught[1].message)
    assert metrics["fireworks/dropped_out_of_vocab"] == 2.0
    assert [ids for ids, _ in service.training.sent_inputs[0]] == [[5, 60]]


def test_a_service_without_a_tokenizer_fails_the_step_naming_vocab_size() -> None:
    service = FakeService()
    backend = backend_over(service, loss_path="custom")

    def no_tokenizer() -> None:
        raise ValueError("get_tokenizer() requires a tokenizer_model")

    service.training.get_tokenizer = no_tokenizer
    with pytest.raises(RuntimeError, match=r"Fireworks gave no tokenizer.*vocab_size"):
        backend.forward_backward([OUT_OF_VOCAB], Objective.of(Reinforce()))
    assert service.training.sent_inputs == []


def test_a_step_whose_datums_are_all_dropped_is_skipped() -> None:
    service = FakeService()
    training = service.training
    backend = backend_over(service, vocab_size=50)
    saved, hot_loads = list(training.saved_for_sampler), list(training.hot_loads)
    client = backend.sampling_client
    with pytest.warns(RuntimeWarning) as caught:
        metrics = backend.forward_backward(
            [OUT_OF_VOCAB, EMPTY], Objective.of(PPOClip(PPOClipConfig()))
        )
    assert sorted(str(w.message).split("'")[1] for w in caught) == ["s-empty", "s-oov"]
    assert metrics == {
        "fireworks/dropped_datums": 2.0,
        "fireworks/dropped_out_of_vocab": 1.0,
        "fireworks/dropped_empty": 1.0,
        "fireworks/skipped_step": 1.0,
        "tokens": 0.0,
        "sequences": 0.0,
    }
    step = backend.optim_step()
    assert step == {
        "learning_rate": 1e-5,
        "step": 0.0,
        "fireworks/skipped_step": 1.0,
        "fireworks/retries": 0.0,
        "fireworks/sampler_retries": 0.0,
    }
    assert training.native == [] and training.custom_calls == 0 and training.adam == []
    assert training.saved_for_sampler == saved and training.hot_loads == hot_loads
    assert backend.weight_version == 0 and backend.optimizer_steps == 0
    assert backend.sampling_client is client
    # The next step trains as usual.
    backend.forward_backward([GOOD], Objective.of(PPOClip(PPOClipConfig())))
    assert backend.optim_step()["step"] == 1.0
    assert backend.weight_version == 1 and len(training.adam) == 1


@pytest.mark.parametrize("order", ["dropped-first", "dropped-last"])
def test_a_step_with_one_call_that_kept_datums_is_taken(order: str) -> None:
    service = FakeService()
    backend = backend_over(service, loss_path="custom")
    calls = [[EMPTY], [GOOD]] if order == "dropped-first" else [[GOOD], [EMPTY]]
    with pytest.warns(RuntimeWarning, match="'s-empty'"):
        for batch in calls:
            backend.forward_backward(batch, Objective.of(Reinforce()))
    metrics = backend.optim_step()
    assert metrics["fireworks/skipped_step"] == 0.0
    assert backend.weight_version == 1 and len(service.training.adam) == 1
