"""The sampler: token ids through Tinker's SamplingClient, and the weight version."""

from __future__ import annotations

import asyncio
import math

import pytest
import tinker
from reference.service_faults import Reinforce
from rllm_core.algorithms.objective import Objective
from rllm_core.ports import Sampler
from rllm_core.types import Datum, SampleRequest, SamplingParams
from rllm_trainer_backend_tinker.backend import TinkerBackend
from rllm_trainer_backend_tinker.plugin import TinkerBackendConfig
from rllm_trainer_backend_tinker.sampler import tinker_sampling_params
from rllm_trainer_backend_tinker_tests_fake import FakeService

PEAK = 2.0 - math.log(math.exp(2.0) + 7.0)


@pytest.fixture
def backend():
    backend = TinkerBackend(TinkerBackendConfig(), service_client=FakeService())
    yield backend
    backend.close()


def _sample(sampler, **params):
    request = SampleRequest(prompt_token_ids=[1, 3], params=SamplingParams(**params))
    return asyncio.run(sampler.sample(request))


def test_sampler_satisfies_the_port(backend):
    assert isinstance(backend.sampler(), Sampler)
    assert backend.sampler() is backend.sampler()


def test_stop_token_ends_the_completion_and_is_included(backend):
    result = _sample(backend.sampler(), max_tokens=10, stop_token_ids=(5,))
    assert result.completion_token_ids == [4, 5]
    assert result.logprobs == pytest.approx([PEAK, PEAK], abs=1e-6)
    assert result.finish_reason == "stop"
    assert result.weight_version == 0


def test_without_stop_ids_it_runs_to_max_tokens(backend):
    result = _sample(backend.sampler(), max_tokens=3)
    assert result.completion_token_ids == [4, 5, 6]
    assert result.finish_reason == "length"
    client, _ = backend.current_sampling_client()
    ((prompt, num_samples, params),) = client.requests
    assert (prompt, num_samples) == ([1, 3], 1)
    assert params.stop == []


def test_a_gateway_session_samples_the_same_request(backend):
    # Tinker's SamplingClient.sample has no session-affinity field; the fake takes exactly its
    # arguments, so anything more would fail here.
    request = SampleRequest(
        prompt_token_ids=[1, 3], params=SamplingParams(max_tokens=2), session_id="sess-1"
    )
    result = asyncio.run(backend.sampler().sample(request))
    assert result.completion_token_ids == [4, 5]
    client, _ = backend.current_sampling_client()
    ((prompt, num_samples, _),) = client.requests
    assert (prompt, num_samples) == ([1, 3], 1)


def test_sampling_params_map_one_to_one():
    params = tinker_sampling_params(
        SamplingParams(max_tokens=7, temperature=0.5, top_p=0.9, stop_token_ids=(2, 9), seed=4)
    )
    assert params == tinker.types.SamplingParams(
        max_tokens=7, temperature=0.5, top_p=0.9, stop=[2, 9], seed=4
    )


def test_after_optim_step_the_sampler_reports_and_uses_the_new_version(backend):
    sampler = backend.sampler()
    datum = Datum(
        token_ids=[3, 4, 5],
        logprobs=[0.0, PEAK, PEAK],
        advantages=[0.0, 1.0, 1.0],
        action_mask=[False, True, True],
        observation_mask=[False, False, False],
    )
    backend.forward_backward([datum], Objective.of(Reinforce()))
    old_client, _ = backend.current_sampling_client()
    backend.optim_step()
    new_client, version = backend.current_sampling_client()
    result = _sample(sampler, max_tokens=2)
    assert (sampler.weight_version, version, result.weight_version) == (1, 1, 1)
    assert old_client.requests == []
    assert len(new_client.requests) == 1


def test_missing_logprobs_are_an_error(backend):
    class NoLogprobs:
        def sample(self, prompt, num_samples, sampling_params):
            sequence = tinker.types.SampledSequence(
                stop_reason="length", sequence_id="s", _tokens_list=[1, 2]
            )
            response = tinker.types.SampleResponse(sequences=[sequence])

            class Done:
                async def result_async(self, timeout=None):
                    return response

            return Done()

    backend._sampling_client = NoLogprobs()
    with pytest.raises(RuntimeError, match="2 tokens with no logprobs"):
        _sample(backend.sampler(), max_tokens=2)
