"""Datums Tinker would fail a step on are dropped before it, with a warning naming their
session; a step whose datums were all dropped sends nothing and publishes nothing."""

from __future__ import annotations

import warnings

import pytest
from rllm_core.algorithms.objective import Objective
from rllm_core.types import Datum
from rllm_loss_ppo.plugin import PPOClipConfig
from rllm_loss_ppo.ppo_clip import PPOClip
from rllm_trainer_backend_tinker.backend import TinkerBackend
from rllm_trainer_backend_tinker.plugin import TinkerBackendConfig
from rllm_trainer_backend_tinker_tests_fake import VOCAB, FakeService

F, T = False, True


def datum(tokens: list[int], actions: list[bool], session: str) -> Datum:
    n = len(tokens)
    return Datum(
        token_ids=tokens,
        logprobs=[-0.5 if a else 0.0 for a in actions],
        advantages=[1.0] * n,
        action_mask=actions,
        observation_mask=[False] * n,
        metadata={"session_id": session},
    )


GOOD = datum([0, 1, 2, 3], [F, F, T, T], "s-good")
OUT_OF_VOCAB = datum([0, 1, VOCAB, 3], [F, F, T, T], "s-oov")
EMPTY = datum([4, 5, 6], [F, F, F], "s-empty")
OBJECTIVE = Objective.of(PPOClip(PPOClipConfig()), name="ppo-clip")


@pytest.fixture
def service():
    return FakeService()


def backend_over(service: FakeService, **config) -> TinkerBackend:
    return TinkerBackend(TinkerBackendConfig(vocab_size=VOCAB, **config), service_client=service)


def sent_targets(service: FakeService) -> list[list[int]]:
    ((_, sent),) = service.training.requests
    return [d.loss_fn_inputs["target_tokens"].tolist() for d in sent]


@pytest.mark.parametrize("loss_path", ["auto", "custom"])
def test_bad_datums_are_dropped_with_a_warning_naming_their_session(service, loss_path):
    backend = backend_over(service, loss_path=loss_path)
    with pytest.warns(RuntimeWarning) as caught:
        metrics = backend.forward_backward([OUT_OF_VOCAB, GOOD, EMPTY], OBJECTIVE)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2
    assert "session 's-oov'" in messages[0] and f"token id {VOCAB}" in messages[0]
    assert "session 's-empty'" in messages[1] and "no sampled token" in messages[1]
    assert sent_targets(service) == [[1, 2, 3]]
    assert metrics["tinker/dropped_datums"] == 2.0
    assert metrics["tinker/dropped_out_of_vocab"] == 1.0
    assert metrics["tinker/dropped_empty"] == 1.0
    assert metrics["sequences"] == 1.0 and metrics["action_tokens"] == 2.0
    assert metrics["tinker/native"] == (1.0 if loss_path == "auto" else 0.0)
    assert backend.optim_step()["tinker/skipped_step"] == 0.0
    assert backend.weight_version == 1


def test_without_vocab_size_the_tokenizers_length_bounds_the_ids(service):
    backend = TinkerBackend(TinkerBackendConfig(), service_client=service)
    negative = datum([0, 1, -3, 3], [F, F, T, T], "s-neg")
    past = datum([0, 1, 49152], [F, T, T], "s-past")
    with pytest.warns(RuntimeWarning) as caught:
        metrics = backend.forward_backward([negative, OUT_OF_VOCAB, past], OBJECTIVE)
    assert [str(w.message).split("'")[1] for w in caught] == ["s-neg", "s-past"]
    assert "outside [0, 49152)" in str(caught[1].message)
    assert sent_targets(service) == [[1, VOCAB, 3]]
    assert metrics["tinker/dropped_out_of_vocab"] == 2.0


def test_clean_datums_pass_without_a_warning(service):
    backend = backend_over(service)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metrics = backend.forward_backward([GOOD], OBJECTIVE)
    assert metrics["tinker/dropped_datums"] == 0.0


def test_a_step_whose_datums_were_all_dropped_is_skipped(service):
    backend = backend_over(service)
    client, _ = backend.current_sampling_client()
    generation = service.generation
    with pytest.warns(RuntimeWarning):
        metrics = backend.forward_backward([OUT_OF_VOCAB, EMPTY], OBJECTIVE)
    assert metrics == {
        "tinker/dropped_datums": 2.0,
        "tinker/dropped_out_of_vocab": 1.0,
        "tinker/dropped_empty": 1.0,
        "tinker/skipped_step": 1.0,
        "tokens": 0.0,
        "sequences": 0.0,
    }
    assert service.training.requests == []

    step = backend.optim_step()
    assert step["tinker/skipped_step"] == 1.0 and step["step"] == 0.0
    assert step["tinker/retries"] == 0.0
    assert service.training.optim_params == []
    assert service.generation == generation
    assert backend.current_sampling_client() == (client, 0)
    assert backend.weight_version == 0 and backend.optimizer_steps == 0
    with pytest.raises(RuntimeError, match="call forward_backward"):
        backend.optim_step()


def test_a_step_with_kept_datums_in_another_call_steps_normally(service):
    backend = backend_over(service)
    with pytest.warns(RuntimeWarning):
        backend.forward_backward([EMPTY], OBJECTIVE)
    backend.forward_backward([GOOD], OBJECTIVE)
    step = backend.optim_step()
    assert step["tinker/skipped_step"] == 0.0 and step["step"] == 1.0
    assert len(service.training.optim_params) == 1
    assert backend.weight_version == 1
