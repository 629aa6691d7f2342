"""Transient failures of Tinker calls are retried within the configured bound and counted in
the step's metrics; a 400 fails at once."""

from __future__ import annotations

import asyncio
import ssl

import pytest
import tinker
from reference.service_faults import DATUMS, REQUEST, Reinforce, failing, status_error
from rllm_core.algorithms.objective import Objective
from rllm_core.kit.managed import retry_after_s
from rllm_core.types import SampleRequest
from rllm_loss_ppo.plugin import ReinforceLossConfig
from rllm_loss_ppo.reinforce import Reinforce as ReinforceLoss
from rllm_trainer_backend_tinker.backend import TinkerBackend
from rllm_trainer_backend_tinker.plugin import TinkerBackendConfig
from rllm_trainer_backend_tinker.transient import is_transient
from rllm_trainer_backend_tinker_tests_fake import FakeService
from tinker.types import RequestErrorCategory


@pytest.fixture
def service():
    return FakeService()


def backend_over(service, **config) -> TinkerBackend:
    settings = {"retry_backoff_s": 0.0, **config}
    return TinkerBackend(TinkerBackendConfig(**settings), service_client=service)


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (status_error(tinker.InternalServerError, 503), True),
        (status_error(tinker.InternalServerError, 500), True),
        (status_error(tinker.RateLimitError, 429), True),
        (tinker.APIConnectionError(request=REQUEST), True),
        (tinker.APITimeoutError(request=REQUEST), True),
        (ConnectionResetError("peer"), True),
        (tinker.RequestFailedError("oom", "r1", RequestErrorCategory.Server), True),
        (tinker.RequestFailedError("bad", "r1", RequestErrorCategory.User), False),
        (status_error(tinker.BadRequestError, 400), False),
        (status_error(tinker.AuthenticationError, 401), False),
        (status_error(tinker.UnprocessableEntityError, 422), False),
        (ValueError("bad datum"), False),
        (TimeoutError("no answer in time"), False),
    ],
)
def test_which_errors_are_transient(error, transient):
    assert is_transient(error) is transient


def test_the_wait_an_answer_asks_for_is_read_from_tinker_errors():
    assert retry_after_s(status_error(tinker.RateLimitError, 429, **{"Retry-After": "2"})) == 2.0


def test_forward_backward_and_optim_step_retry_and_count(service):
    backend = backend_over(service)
    training = service.training
    fb_calls = failing(
        training,
        "forward_backward_custom",
        status_error(tinker.InternalServerError, 503),
        tinker.APIConnectionError(request=REQUEST),
    )
    metrics = backend.forward_backward(DATUMS, Objective.of(Reinforce()))
    assert len(fb_calls) == 3 and metrics["tinker/retries"] == 2.0
    assert metrics["sequences"] == 1.0
    step_calls = failing(training, "optim_step", status_error(tinker.RateLimitError, 429))
    publish_calls = failing(
        training, "save_weights_and_get_sampling_client", ConnectionResetError("reset")
    )
    metrics = backend.optim_step()
    assert (len(step_calls), len(publish_calls)) == (2, 2)
    assert metrics["tinker/retries"] == 2.0 and metrics["tinker/sampler_retries"] == 0.0
    assert backend.weight_version == 1
    metrics = backend.forward_backward(DATUMS, Objective.of(Reinforce()))
    assert metrics["tinker/retries"] == 0.0


def test_the_native_step_retries_and_counts(service):
    backend = backend_over(service)
    calls = failing(
        service.training, "forward_backward", status_error(tinker.InternalServerError, 503)
    )
    objective = Objective.of(ReinforceLoss(ReinforceLossConfig()), name="reinforce")
    metrics = backend.forward_backward(DATUMS, objective)
    assert len(calls) == 2 and metrics["tinker/retries"] == 1.0
    assert metrics["tinker/native"] == 1.0
    assert len(service.training.kernel_calls) == 1


def test_a_bad_request_is_not_retried(service):
    backend = backend_over(service, retries=5)
    bad = status_error(tinker.BadRequestError, 400)
    calls = failing(service.training, "forward_backward_custom", bad)
    with pytest.raises(tinker.BadRequestError) as caught:
        backend.forward_backward(DATUMS, Objective.of(Reinforce()))
    assert caught.value is bad and calls == [1]


def test_retries_stop_at_the_bound(service):
    backend = backend_over(service, retries=2)
    errors = [status_error(tinker.InternalServerError, 502) for _ in range(4)]
    calls = failing(service.training, "optim_step", *errors)
    backend.forward_backward(DATUMS, Objective.of(Reinforce()))
    with pytest.raises(tinker.InternalServerError) as caught:
        backend.optim_step()
    assert caught.value is errors[2] and len(calls) == 3
    assert backend.weight_version == 0


def test_sampler_retries_are_counted_in_the_next_optim_step(service):
    backend = backend_over(service)
    client, _ = backend.current_sampling_client()
    calls = failing(
        client,
        "sample",
        tinker.APITimeoutError(request=REQUEST),
        status_error(tinker.InternalServerError, 500),
    )
    result = asyncio.run(backend.sampler().sample(SampleRequest(prompt_token_ids=[1, 3])))
    assert len(calls) == 3 and result.weight_version == 0
    bad = status_error(tinker.BadRequestError, 400)
    failing(client, "sample", bad)
    with pytest.raises(tinker.BadRequestError):
        asyncio.run(backend.sampler().sample(SampleRequest(prompt_token_ids=[1, 3])))
    backend.forward_backward(DATUMS, Objective.of(Reinforce()))
    assert backend.optim_step()["tinker/sampler_retries"] == 2.0
    backend.forward_backward(DATUMS, Objective.of(Reinforce()))
    assert backend.optim_step()["tinker/sampler_retries"] == 0.0


def test_a_lost_answer_is_retried_for_reads_and_saves_but_not_for_a_step(service, tmp_path):
    backend = backend_over(service)
    training = service.training
    lost = ssl.SSLError(1, "[SSL: DECRYPTION_FAILED_OR_BAD_RECORD_MAC]")
    scoring = failing(training, "forward", lost, TimeoutError("read timed out"))
    assert len(backend.compute_logprobs(DATUMS)[0]) == 3 and len(scoring) == 3
    saving = failing(training, "save_state", TimeoutError("read timed out"))
    backend.save_state(str(tmp_path / "cut"))
    assert len(saving) == 2
    fb_calls = failing(training, "forward_backward_custom", ssl.SSLError(1, "bad record mac"))
    with pytest.raises(ssl.SSLError):
        backend.forward_backward(DATUMS, Objective.of(Reinforce()))
    assert fb_calls == [1]
    backend.forward_backward(DATUMS, Objective.of(Reinforce()))
    step_calls = failing(training, "optim_step", TimeoutError("read timed out"))
    with pytest.raises(TimeoutError):
        backend.optim_step()
    assert step_calls == [1]
