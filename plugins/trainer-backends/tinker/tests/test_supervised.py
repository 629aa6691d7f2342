"""forward_backward_supervised on Tinker's own cross_entropy loss, against the fake service:
what the request carries, the nll it reports, and that its gradient is the token-mean NLL's."""

from __future__ import annotations

import math

import pytest
import tinker
import torch
from reference.service_faults import failing, status_error
from rllm_core.algorithms.objective import Objective
from rllm_core.ports import LogprobScorer, LossOutput, SupervisedTrainer
from rllm_core.testing.managed import BAD_SUPERVISED_DATUMS, check_supervised_request
from rllm_core.testing.managed import supervised_datum as datum
from rllm_core.types import Datum
from rllm_trainer_backend_tinker.backend import TinkerBackend
from rllm_trainer_backend_tinker.plugin import TinkerBackendConfig
from rllm_trainer_backend_tinker_tests_fake import FakeService, bigram_logprobs, chain_table

F, T = False, True


# system + user prompt (0, 1), assistant (2, 3), tool result (5, 6), assistant (7, 0); some
# tokens follow the chain table's greedy path and some do not, so the logprobs differ.
CONVERSATION = datum(
    [0, 1, 2, 3, 5, 6, 7, 0],
    [F, F, T, T, F, F, T, T],
    tool=[F, F, F, F, T, T, F, F],
)
# user prompt (4, 5), assistant (6, 1)
SHORT = datum([4, 5, 6, 1], [F, F, T, T])
DATUMS = [CONVERSATION, SHORT]


class Nll:
    """The token-mean NLL over action tokens, as an objective for the custom-loss path."""

    name = "nll"

    def __call__(self, ctx):
        return LossOutput(loss=ctx.aggregate(-ctx.logprobs, ctx.action_mask))


def hand_nll(table: torch.Tensor, datums: list[Datum]) -> torch.Tensor:
    """Mean over trained tokens of -log p(token | previous token), in float64."""
    terms = []
    for d in datums:
        logprobs = bigram_logprobs(table.double(), d.token_ids[:-1], d.token_ids[1:])
        terms += [-lp for lp, m in zip(logprobs, d.action_mask[1:], strict=True) if m]
    return torch.stack(terms).mean()


@pytest.fixture
def service():
    return FakeService()


@pytest.fixture
def backend(service):
    backend = TinkerBackend(
        TinkerBackendConfig(learning_rate=0.1, retry_backoff_s=0.0), service_client=service
    )
    yield backend
    backend.close()


def test_the_backend_is_a_supervised_trainer(backend):
    assert isinstance(backend, SupervisedTrainer)


def test_the_request_is_cross_entropy_with_shifted_targets_and_mean_weights(service, backend):
    backend.forward_backward_supervised(DATUMS)
    ((loss_fn, sent),) = service.training.requests
    assert loss_fn == "cross_entropy"
    check_supervised_request(DATUMS, sent)
    assert all(t.loss_fn_inputs["weights"].dtype == "float32" for t in sent)


def test_nll_is_the_mean_over_trained_tokens_of_the_logprobs(service, backend):
    metrics = backend.forward_backward_supervised(DATUMS)
    expected = float(hand_nll(chain_table(), DATUMS))
    assert metrics["nll"] == pytest.approx(expected, abs=1e-6)
    assert (metrics["tokens"], metrics["sequences"]) == (6.0, 2.0)
    assert metrics["tinker/loss:sum"] == pytest.approx(expected, abs=1e-5)
    assert metrics["tinker/retries"] == 0.0
    # ... and with the logprobs the fake returned.
    ((_, sent),) = service.training.requests
    returned = [
        -float(lp)
        for d, t in zip(DATUMS, sent, strict=True)
        for lp, m in zip(service.training._logprobs(t).detach(), d.action_mask[1:], strict=True)
        if m
    ]
    assert metrics["nll"] == pytest.approx(math.fsum(returned) / 6, abs=1e-6)


def test_the_gradient_is_that_of_the_token_mean_nll(service, backend):
    backend.forward_backward_supervised(DATUMS)
    table = chain_table().double().requires_grad_(True)
    hand_nll(table, DATUMS).backward()
    torch.testing.assert_close(service.training.table.grad.double(), table.grad, atol=1e-6, rtol=0)

    other = FakeService()
    through_objective = TinkerBackend(TinkerBackendConfig(), service_client=other)
    through_objective.forward_backward(DATUMS, Objective.of(Nll()))
    torch.testing.assert_close(
        service.training.table.grad, other.training.table.grad, atol=1e-6, rtol=0
    )


def test_calls_add_gradients_each_normalized_over_its_own_datums(service, backend):
    first = backend.forward_backward_supervised([CONVERSATION])
    second = backend.forward_backward_supervised([SHORT])
    assert (first["tokens"], second["tokens"]) == (4.0, 2.0)
    table = chain_table().double().requires_grad_(True)
    (hand_nll(table, [CONVERSATION]) + hand_nll(table, [SHORT])).backward()
    grad = service.training.table.grad.clone()
    torch.testing.assert_close(grad.double(), table.grad, atol=1e-6, rtol=0)
    metrics = backend.optim_step()
    assert metrics["step"] == 1.0 and backend.weight_version == 1
    client, version = backend.current_sampling_client()
    assert version == 1
    torch.testing.assert_close(client.table, chain_table() - 0.1 * grad)
    after = backend.forward_backward_supervised(DATUMS)
    expected = float(hand_nll(client.table, DATUMS))
    assert after["nll"] == pytest.approx(expected, abs=1e-6)
    assert after["nll"] < float(hand_nll(chain_table(), DATUMS))


def test_saving_between_the_call_and_optim_step_is_refused(backend, tmp_path):
    backend.forward_backward_supervised(DATUMS)
    with pytest.raises(RuntimeError, match="call optim_step"):
        backend.save_state(str(tmp_path))


@pytest.mark.parametrize(("datums", "message"), BAD_SUPERVISED_DATUMS)
def test_bad_datums_are_refused_before_anything_is_sent(service, backend, datums, message):
    with pytest.raises(ValueError, match=message):
        backend.forward_backward_supervised(datums)
    assert service.training.requests == []
    with pytest.raises(RuntimeError, match="forward_backward_supervised"):
        backend.optim_step()


def test_a_transient_failure_is_retried_and_counted(service, backend):
    calls = failing(
        service.training, "forward_backward", status_error(tinker.InternalServerError, 503)
    )
    metrics = backend.forward_backward_supervised(DATUMS)
    assert len(calls) == 2 and metrics["tinker/retries"] == 1.0
    assert metrics["nll"] == pytest.approx(float(hand_nll(chain_table(), DATUMS)), abs=1e-6)


def test_compute_logprobs_is_a_forward_pass_that_changes_nothing(service, backend):
    assert isinstance(backend, LogprobScorer)
    scored = backend.compute_logprobs(DATUMS)
    for d, values in zip(DATUMS, scored, strict=True):
        expected = bigram_logprobs(chain_table(), d.token_ids[:-1], d.token_ids[1:])
        assert values[0] == 0.0
        assert values[1:] == pytest.approx(expected.tolist(), abs=1e-6)
    ((kind, sent),) = service.training.requests
    assert kind == "forward"
    assert all(w == 0.0 for t in sent for w in t.loss_fn_inputs["weights"].tolist())
    assert service.training.table.grad is None
    assert backend.compute_logprobs([]) == []
    with pytest.raises(RuntimeError, match="without gradients"):
        backend.optim_step()
    with pytest.raises(ValueError, match="datum 0 has 1 token"):
        backend.compute_logprobs([datum([5], [F])])
