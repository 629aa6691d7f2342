"""Transient failures of Fireworks calls are retried within the configured bound and counted
in the step's metrics; a 400 fails at once."""

from __future__ import annotations

import asyncio
import ssl

import pytest
from fake_fireworks import FakeService, reply
from fireworks.training.sdk import (
    APIConnectionError,
    APITimeoutError,
    RequestFailedError,
    SamplingRequestError,
    TrainingAPIError,
)
from fireworks.training.sdk import types as fw
from fireworks.training.sdk._core import (
    BadRequestError,
    InternalServerError,
    RateLimitError,
    UnprocessableEntityError,
)
from reference.service_faults import DATUMS, REQUEST, Reinforce, failing, status_error
from rllm_core.algorithms.objective import Objective
from rllm_core.kit.managed import retry_after_s
from rllm_core.types import SampleRequest
from rllm_trainer_backend_fireworks.backend import FireworksBackend
from rllm_trainer_backend_fireworks.plugin import FireworksBackendConfig
from rllm_trainer_backend_fireworks.transient import is_transient


@pytest.fixture
def service() -> FakeService:
    return FakeService()


def backend_over(service: FakeService, **config) -> FireworksBackend:
    settings = {"model": "accounts/fireworks/models/qwen3-8b", "retry_backoff_s": 0.0}
    return FireworksBackend(FireworksBackendConfig(**{**settings, **config}), service=service)


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (status_error(InternalServerError, 503), True),
        (status_error(RateLimitError, 429), True),
        (APIConnectionError(request=REQUEST), True),
        (APITimeoutError(request=REQUEST), True),
        (ConnectionResetError("peer"), True),
        (TrainingAPIError("unavailable", status_code=502), True),
        (SamplingRequestError(final_status=504), True),
        (RequestFailedError("crashed", "r1", fw.RequestErrorCategory.Server), True),
        (RequestFailedError("bad", "r1", fw.RequestErrorCategory.User), False),
        (TrainingAPIError("bad shape", status_code=400), False),
        (SamplingRequestError(final_status=400), False),
        (status_error(BadRequestError, 400), False),
        (status_error(UnprocessableEntityError, 422), False),
        (ValueError("bad datum"), False),
    ],
)
def test_which_errors_are_transient(error, transient):
    assert is_transient(error) is transient


def test_the_wait_an_answer_asks_for_is_read_from_fireworks_errors():
    assert retry_after_s(status_error(RateLimitError, 429, **{"Retry-After": "1.5"})) == 1.5


def test_forward_backward_and_optim_step_retry_and_count(service):
    backend = backend_over(service)
    training = service.training
    fb_calls = failing(
        training,
        "forward_backward_custom",
        status_error(InternalServerError, 500),
        APITimeoutError(request=REQUEST),
    )
    metrics = backend.forward_backward(DATUMS, Objective.of(Reinforce()))
    assert len(fb_calls) == 3 and metrics["fireworks/retries"] == 2.0
    assert len(training.sent_inputs) == 1
    step_calls = failing(training, "optim_step", status_error(RateLimitError, 429))
    publish_calls = failing(
        training, "save_weights_for_sampler", TrainingAPIError("busy", status_code=503)
    )
    metrics = backend.optim_step()
    assert (len(step_calls), len(publish_calls)) == (2, 2)
    assert metrics["fireworks/retries"] == 2.0
    assert training.steps == 1 and backend.weight_version == 1


def test_a_bad_request_is_not_retried(service):
    backend = backend_over(service, retries=5)
    bad = status_error(BadRequestError, 400)
    calls = failing(service.training, "optim_step", bad)
    with pytest.raises(BadRequestError) as caught:
        backend.optim_step()
    assert caught.value is bad and calls == [1]
    assert backend.optimizer_steps == 0


def test_retries_stop_at_the_bound(service):
    backend = backend_over(service, retries=1)
    errors = [APIConnectionError(request=REQUEST) for _ in range(3)]
    calls = failing(service.training, "forward_backward_custom", *errors)
    with pytest.raises(APIConnectionError) as caught:
        backend.forward_backward(DATUMS, Objective.of(Reinforce()))
    assert caught.value is errors[1] and len(calls) == 2


def test_sampler_retries_are_counted_in_the_next_optim_step(service):
    backend = backend_over(service)
    service.training.replies.append(reply([11, 2], [-0.25, -0.5]))
    sampling = backend.sampling_client
    calls = failing(
        sampling, "sample_async", status_error(InternalServerError, 502), ConnectionResetError()
    )
    result = asyncio.run(backend.sampler().sample(SampleRequest(prompt_token_ids=[1])))
    assert len(calls) == 3 and result.completion_token_ids == [11, 2]
    failing(sampling, "sample_async", status_error(BadRequestError, 400))
    with pytest.raises(BadRequestError):
        asyncio.run(backend.sampler().sample(SampleRequest(prompt_token_ids=[1])))
    assert backend.optim_step()["fireworks/sampler_retries"] == 2.0
    assert backend.optim_step()["fireworks/sampler_retries"] == 0.0


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
    assert fb_calls == [1] and training.sent_inputs == []
    backend.forward_backward(DATUMS, Objective.of(Reinforce()))
    step_calls = failing(training, "optim_step", TimeoutError("read timed out"))
    with pytest.raises(TimeoutError):
        backend.optim_step()
    assert step_calls == [1] and training.steps == 0
    publishing = failing(training, "save_weights_for_sampler", lost)
    backend.optim_step()
    assert len(publishing) == 2 and backend.weight_version == 1
