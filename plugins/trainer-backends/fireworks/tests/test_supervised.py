"""forward_backward_supervised on the trainer's built-in cross_entropy loss, against the fake
service: what the request carries, the nll it reports, and that its weights are those the
custom-loss path sends for the token-mean NLL objective (the same gradient on the trainer)."""

from __future__ import annotations

import math

import pytest
from fake_fireworks import CONFIG, FakeService, logprob_of
from fireworks.training.sdk._core import InternalServerError
from reference.service_faults import failing, status_error
from rllm_core.algorithms.objective import Objective
from rllm_core.ports import LogprobScorer, LossContext, LossOutput, SupervisedTrainer
from rllm_core.testing.managed import BAD_SUPERVISED_DATUMS, check_supervised_request
from rllm_core.testing.managed import supervised_datum as datum
from rllm_core.types import Datum
from rllm_trainer_backend_fireworks.backend import FireworksBackend

F, T = False, True


# system + user prompt (10, 11), assistant (12, 13), tool result (20, 21), assistant (14, 2)
CONVERSATION = datum(
    [10, 11, 12, 13, 20, 21, 14, 2],
    [F, F, T, T, F, F, T, T],
    tool=[F, F, F, F, T, T, F, F],
)
SHORT = datum([30, 31, 7, 2], [F, F, T, T])
DATUMS = [CONVERSATION, SHORT]
TRAINED = [12, 13, 14, 2, 7, 2]


class Nll:
    name = "nll"

    def __call__(self, ctx: LossContext) -> LossOutput:
        return LossOutput(loss=ctx.aggregate(-ctx.logprobs, ctx.action_mask))


def test_the_backend_is_a_supervised_trainer(backend: FireworksBackend) -> None:
    assert isinstance(backend, SupervisedTrainer)


def test_the_request_is_cross_entropy_with_shifted_targets_and_mean_weights(
    backend: FireworksBackend, service: FakeService
) -> None:
    backend.forward_backward_supervised(DATUMS)
    ((loss_fn, sent),) = service.training.cross_entropy
    assert loss_fn == "cross_entropy"
    assert service.training.sent_inputs == []
    check_supervised_request(DATUMS, sent)


def test_nll_is_the_mean_over_trained_tokens_of_the_logprobs(backend: FireworksBackend) -> None:
    metrics = backend.forward_backward_supervised(DATUMS)
    expected = math.fsum(-logprob_of(t) for t in TRAINED) / len(TRAINED)  # 0.1 * mean(TRAINED)
    assert metrics["nll"] == pytest.approx(expected, abs=1e-6)
    assert (metrics["tokens"], metrics["sequences"]) == (6.0, 2.0)
    assert metrics["fireworks/loss:sum"] == pytest.approx(expected, abs=1e-5)
    assert metrics["fireworks/response_tokens"] == 6.0
    assert metrics["fireworks/retries"] == 0.0


def test_the_weights_are_those_the_nll_objective_sends_through_the_custom_path(
    backend: FireworksBackend, service: FakeService
) -> None:
    backend.forward_backward_supervised(DATUMS)
    ((_, sent),) = service.training.cross_entropy
    supervised = [d.loss_fn_inputs["weights"].tolist() for d in sent]
    other = FakeService()
    FireworksBackend(CONFIG, service=other).forward_backward(DATUMS, Objective.of(Nll()))
    (custom,) = other.training.sent_weights
    for mine, theirs in zip(supervised, custom, strict=True):
        assert mine == pytest.approx(theirs, abs=1e-7)


def test_calls_are_each_normalized_over_their_own_datums_and_step(
    backend: FireworksBackend, service: FakeService
) -> None:
    first = backend.forward_backward_supervised([CONVERSATION])
    second = backend.forward_backward_supervised([SHORT])
    assert (first["tokens"], second["tokens"]) == (4.0, 2.0)
    assert first["nll"] == pytest.approx(0.1 * (12 + 13 + 14 + 2) / 4)
    assert second["nll"] == pytest.approx(0.1 * (7 + 2) / 2)
    weights = [
        [w for w in d.loss_fn_inputs["weights"].tolist() if w]
        for _, sent in service.training.cross_entropy
        for d in sent
    ]
    assert weights == [pytest.approx([0.25] * 4), pytest.approx([0.5] * 2)]
    metrics = backend.optim_step()
    assert metrics["step"] == 1.0 and backend.weight_version == 1
    assert service.training.steps == 1


@pytest.mark.parametrize(("datums", "message"), BAD_SUPERVISED_DATUMS)
def test_bad_datums_are_refused_before_anything_is_sent(
    backend: FireworksBackend, service: FakeService, datums: list[Datum], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        backend.forward_backward_supervised(datums)
    assert service.training.cross_entropy == []


def test_a_transient_failure_is_retried_and_counted(
    backend: FireworksBackend, service: FakeService
) -> None:
    calls = failing(
        service.training,
        "forward_backward",
        status_error(InternalServerError, 503),
    )
    metrics = backend.forward_backward_supervised(DATUMS)
    assert len(calls) == 2 and metrics["fireworks/retries"] == 1.0


def test_a_closed_backend_refuses_the_call(backend: FireworksBackend) -> None:
    backend.close()
    with pytest.raises(RuntimeError, match="closed"):
        backend.forward_backward_supervised(DATUMS)


def test_compute_logprobs_is_a_forward_pass_that_trains_nothing(
    backend: FireworksBackend, service: FakeService
) -> None:
    assert isinstance(backend, LogprobScorer)
    scored = backend.compute_logprobs(DATUMS)
    for d, values in zip(DATUMS, scored, strict=True):
        assert values == pytest.approx([0.0] + [logprob_of(t) for t in d.token_ids[1:]])
    (sent,) = service.training.forwards
    assert [t.model_input.to_ints() for t in sent] == [d.token_ids[:-1] for d in DATUMS]
    assert all(w == 0.0 for t in sent for w in t.loss_fn_inputs["weights"].tolist())
    assert service.training.cross_entropy == [] and service.training.sent_weights == []
    assert backend.compute_logprobs([]) == []
