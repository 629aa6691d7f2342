"""Sampling on the event loop while ``optim_step`` publishes on the trainer's thread, as the
async pipeline runs them. Each Tinker sampling client samples from its own saved weights, so
a request in flight finishes on the client it started with and reports that client's version,
and ``optim_step`` does not wait for it."""

from __future__ import annotations

import asyncio
import threading

import pytest
from reference.service_faults import DATUMS, Reinforce
from rllm_core.algorithms.objective import Objective
from rllm_core.types import SampleRequest, SampleResult, SamplingParams
from rllm_trainer_backend_tinker.backend import TinkerBackend
from rllm_trainer_backend_tinker.plugin import TinkerBackendConfig
from rllm_trainer_backend_tinker_tests_fake import FakeSamplingClient, FakeService

WAIT_S = 10.0
"""A bound on each wait below, so that a broken hand-over fails instead of hanging."""


@pytest.fixture
def service() -> FakeService:
    return FakeService()


@pytest.fixture
def backend(service: FakeService):
    backend = TinkerBackend(TinkerBackendConfig(), service_client=service)
    backend.forward_backward(DATUMS, Objective.of(Reinforce()))
    yield backend
    backend.close()


def sample(backend: TinkerBackend, first_token: int) -> asyncio.Task[SampleResult]:
    """A sampling request whose prompt names it, so a test can tell which client served it."""
    request = SampleRequest(prompt_token_ids=[first_token, 3], params=SamplingParams(max_tokens=2))
    return asyncio.create_task(backend.sampler().sample(request))


def served(client: FakeSamplingClient) -> list[int]:
    return [ids[0] for ids, _, _ in client.requests]


def test_a_request_in_flight_keeps_its_client_and_version_across_optim_step(backend):
    old_client, _ = backend.current_sampling_client()

    async def run() -> tuple[SampleResult, SampleResult]:
        entered, release = asyncio.Event(), asyncio.Event()

        async def hold() -> None:
            entered.set()
            await release.wait()

        old_client.hold = hold
        running = sample(backend, 1)
        await entered.wait()
        async with asyncio.timeout(WAIT_S):
            await asyncio.get_running_loop().run_in_executor(None, backend.optim_step)
        assert not running.done()
        after = await sample(backend, 2)
        release.set()
        return await running, after

    running, after = asyncio.run(run())
    new_client, version = backend.current_sampling_client()
    assert (running.weight_version, after.weight_version, version) == (0, 1, 1)
    assert (served(old_client), served(new_client)) == ([1], [2])


def test_while_publishing_requests_use_the_old_client_with_the_old_version(backend, service):
    old_client, _ = backend.current_sampling_client()
    publishing, resume = threading.Event(), threading.Event()

    def block() -> None:
        publishing.set()
        assert resume.wait(WAIT_S), "the test never resumed the trainer"

    service.during_publish = block

    async def run() -> tuple[SampleResult, SampleResult]:
        step = asyncio.get_running_loop().run_in_executor(None, backend.optim_step)
        try:
            assert await asyncio.to_thread(publishing.wait, WAIT_S)
            # Tinker has stepped and is saving the new weights; they are not published yet.
            during = await sample(backend, 1)
            assert backend.weight_version == 0
        finally:
            resume.set()
        async with asyncio.timeout(WAIT_S):
            await step
        return during, await sample(backend, 2)

    during, after = asyncio.run(run())
    new_client, _ = backend.current_sampling_client()
    assert (during.weight_version, after.weight_version) == (0, 1)
    assert (served(old_client), served(new_client)) == ([1], [2])
