"""A request of a gateway session reaches the deployment with the session as its
``prompt_cache_key`` (the field Fireworks keeps a session on one replica with); a request
outside a session carries none. Both are read back with the same checks, and the hot-load
waits for a session's request as for any other."""

from __future__ import annotations

import asyncio

import pytest
from fake_fireworks import CONFIG, FakeService, reply
from fireworks.training.sdk import FiretitanSamplingClient
from fireworks.training.sdk.sampling import SampledCompletion
from reference.service_faults import DATUMS, Reinforce
from rllm_core.algorithms.objective import Objective
from rllm_core.types import SampleRequest, SampleResult, SamplingParams
from rllm_trainer_backend_fireworks.backend import FireworksBackend

PARAMS = SamplingParams(max_tokens=7, temperature=1.0, top_p=0.9, stop_token_ids=(2,), seed=3)
WAIT_S = 10.0


def sample(backend: FireworksBackend, **request: object) -> SampleResult:
    return asyncio.run(
        backend.sampler().sample(SampleRequest(prompt_token_ids=[1, 4], **request))  # type: ignore[arg-type]
    )


def test_a_session_request_carries_the_session_as_prompt_cache_key(
    backend: FireworksBackend, service: FakeService
) -> None:
    service.training.replies.append(reply([11, 2], [-0.25, -0.5], stop="stop"))
    result = sample(backend, params=PARAMS, session_id="sess-7", request_id="r1")
    assert result == SampleResult(
        completion_token_ids=[11, 2], logprobs=[-0.25, -0.5], finish_reason="stop", weight_version=0
    )
    sampling = service.training.samplers[-1]
    assert sampling.requests == []
    assert sampling.deployment_sampler.calls == [
        {
            "prompt_token_ids": [1, 4],
            "n": 1,
            "max_tokens": 7,
            "temperature": 1.0,
            "stop": [2],
            "prompt_cache_key": "sess-7",
            "logprobs": True,
            "top_p": 0.9,
            "seed": 3,
        }
    ]


def test_a_request_outside_a_session_keeps_the_sampling_client_path(
    backend: FireworksBackend, service: FakeService
) -> None:
    service.training.replies.append(reply([11, 2], [-0.25, -0.5], stop="stop"))
    result = sample(backend, params=PARAMS)
    assert result.completion_token_ids == [11, 2]
    sampling = service.training.samplers[-1]
    assert sampling.deployment_sampler.calls == []
    assert [ids for ids, _, _ in sampling.requests] == [[1, 4]]


def test_with_the_sdk_client_only_session_requests_carry_a_cache_key(service: FakeService) -> None:
    """The SDK's own sampling client: a request outside a session goes through its
    ``sample_async``, which sends no ``prompt_cache_key``."""
    service.training.sdk_sampling = True
    service.training.replies.extend(reply([11, 2], [-0.25, -0.5]) for _ in range(2))
    backend = FireworksBackend(CONFIG, service=service)
    try:
        client = backend.sampling_client
        assert isinstance(client, FiretitanSamplingClient)
        with_session = sample(backend, params=PARAMS, session_id="sess-1")
        without = sample(backend, params=PARAMS)
        assert with_session.completion_token_ids == without.completion_token_ids == [11, 2]
        assert with_session.logprobs == without.logprobs == [-0.25, -0.5]
        calls = client.deployment_sampler.calls
        assert [call["prompt_cache_key"] for call in calls] == ["sess-1", None]
        assert all(call["logprobs"] is True and call["stop"] == [2] for call in calls)
    finally:
        backend.close()


def test_echoed_logprobs_are_cut_to_the_completion(
    backend: FireworksBackend, service: FakeService
) -> None:
    service.training.replies.append(
        SampledCompletion(
            text="",
            full_tokens=[1, 4, 11, 12],
            prompt_len=2,
            finish_reason="length",
            sampling_logprobs=[-9.0, -0.25, -0.5],
            logprobs_echoed=True,
        )
    )
    result = sample(backend, session_id="s")
    assert (result.completion_token_ids, result.logprobs) == ([11, 12], [-0.25, -0.5])
    assert result.finish_reason == "length"


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (reply([11, 12], [-0.25, -0.5], stop="stop"), "without returning the stop token"),
        (reply([11, 2], [-0.25], stop="stop"), "2 tokens with 1 logprobs"),
        (reply([11], None, stop="length"), "1 tokens with no logprobs"),
    ],
)
def test_a_session_answer_gets_the_same_checks(
    backend: FireworksBackend, service: FakeService, answer: object, message: str
) -> None:
    service.training.replies.append(answer)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match=message):
        sample(backend, params=SamplingParams(stop_token_ids=(2,)), session_id="s")


def test_a_null_logprob_is_refused(backend: FireworksBackend, service: FakeService) -> None:
    service.training.replies.append(
        SampledCompletion(text="", full_tokens=[1, 4, 11], prompt_len=2, sampling_logprobs=[None])
    )
    with pytest.raises(RuntimeError, match="1 tokens with 0 logprobs"):
        sample(backend, session_id="s")


def test_the_hot_load_waits_for_a_session_request(
    backend: FireworksBackend, service: FakeService
) -> None:
    training = service.training
    training.replies.extend(reply([7, 2], [-0.7, -0.2]) for _ in range(2))
    backend.forward_backward(DATUMS, Objective.of(Reinforce()))

    async def run() -> tuple[SampleResult, SampleResult]:
        entered, release = asyncio.Event(), asyncio.Event()

        async def hold() -> None:
            entered.set()
            await release.wait()

        training.hold_sample = hold
        request = SampleRequest(prompt_token_ids=[1, 5], session_id="sess-a")
        running = asyncio.create_task(backend.sampler().sample(request))
        await entered.wait()
        training.hold_sample = None
        step = asyncio.get_running_loop().run_in_executor(None, backend.optim_step)
        try:
            async with asyncio.timeout(WAIT_S):
                while not backend._gate.switching:
                    await asyncio.sleep(0)
            # The new weights are saved but not loaded while the session's request runs.
            assert training.hot_loads == [("snapshots/rllm-weights-v0-1", 0)]
            assert backend.weight_version == 0
        finally:
            release.set()
        async with asyncio.timeout(WAIT_S):
            await step
        after = await backend.sampler().sample(request)
        return await running, after

    running, after = asyncio.run(run())
    assert (running.weight_version, after.weight_version) == (0, 1)
    assert training.hot_loads[-1] == ("snapshots/rllm-weights-v1-2", 0)
    keys = [
        [call["prompt_cache_key"] for call in sampling.deployment_sampler.calls]
        for sampling in training.samplers
    ]
    assert keys == [["sess-a"], ["sess-a"]]
