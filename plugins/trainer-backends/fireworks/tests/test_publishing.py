"""Sampling on the event loop while ``optim_step`` publishes on the trainer's thread, as the
async pipeline runs them: a request reports the version whose client served it, the hot-load
waits for running requests, and requests that start during it wait for the new version."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest
from fake_fireworks import CONFIG, FakeService, FakeTraining, reply
from reference.service_faults import DATUMS, Reinforce
from rllm_core.algorithms.objective import Objective
from rllm_core.types import SampleRequest, SampleResult
from rllm_trainer_backend_fireworks.backend import FireworksBackend
from rllm_trainer_backend_fireworks.gate import HotLoadGate

WAIT_S = 10.0
"""A bound on each wait below, so that a broken hand-over fails instead of hanging."""


@pytest.fixture
def service() -> FakeService:
    service = FakeService()
    service.training.replies.extend(reply([7, 2], [-0.7, -0.2]) for _ in range(4))
    return service


@pytest.fixture
def backend(service: FakeService) -> FireworksBackend:
    backend = FireworksBackend(CONFIG, service=service)
    backend.forward_backward(DATUMS, Objective.of(Reinforce()))
    return backend


def sample(backend: FireworksBackend, first_token: int) -> asyncio.Task[SampleResult]:
    """A sampling request whose prompt names it, so a test can tell which client served it."""
    request = SampleRequest(prompt_token_ids=[first_token, 5])
    return asyncio.create_task(backend.sampler().sample(request))


def served(training: FakeTraining) -> list[list[int]]:
    """The first prompt token of each request, per sampling client in order of creation."""
    return [[ids[0] for ids, _, _ in sampling.requests] for sampling in training.samplers]


async def until(condition: Callable[[], bool]) -> None:
    """Yield to the other thread until ``condition()`` holds (a state, not a duration)."""
    async with asyncio.timeout(WAIT_S):
        while not condition():
            await asyncio.sleep(0)


def blocking(reached: threading.Event, resume: threading.Event) -> Callable[[], None]:
    def hook() -> None:
        reached.set()
        assert resume.wait(WAIT_S), "the test never resumed the trainer"

    return hook


def test_a_running_request_keeps_its_version_and_the_hot_load_waits_for_it(
    backend: FireworksBackend, service: FakeService
) -> None:
    training = service.training

    async def run() -> tuple[SampleResult, SampleResult, SampleResult]:
        entered, release = asyncio.Event(), asyncio.Event()

        async def hold() -> None:
            entered.set()
            await release.wait()

        training.hold_sample = hold
        running = sample(backend, 1)
        await entered.wait()
        training.hold_sample = None
        step = asyncio.get_running_loop().run_in_executor(None, backend.optim_step)
        try:
            await until(lambda: backend._gate.switching)
            assert training.hot_loads == [("snapshots/rllm-weights-v0-1", 0)]
            assert backend.weight_version == 0
            waiting = sample(backend, 2)
        finally:
            release.set()
        async with asyncio.timeout(WAIT_S):
            await step
        after = await sample(backend, 3)
        return await running, await waiting, after

    running, waiting, after = asyncio.run(run())
    assert (running.weight_version, waiting.weight_version, after.weight_version) == (0, 1, 1)
    assert served(training) == [[1], [2, 3]]
    # The deployment switched only once the running request had finished.
    assert training.hot_loads[-1] == ("snapshots/rllm-weights-v1-2", 0)
    assert training.samplers[0].closed is True
    assert backend.weight_version == 1


def test_requests_use_the_old_weights_while_saving_and_wait_during_the_hot_load(
    backend: FireworksBackend, service: FakeService
) -> None:
    training = service.training
    saving, resume_save = threading.Event(), threading.Event()
    hot_loading, resume_hot_load = threading.Event(), threading.Event()
    training.during_save = blocking(saving, resume_save)
    training.during_hot_load = blocking(hot_loading, resume_hot_load)

    async def run() -> tuple[SampleResult, SampleResult]:
        step = asyncio.get_running_loop().run_in_executor(None, backend.optim_step)
        try:
            assert await asyncio.to_thread(saving.wait, WAIT_S)
            # The new weights are being saved; the deployment still serves version 0.
            during_save = await sample(backend, 1)
            resume_save.set()
            assert await asyncio.to_thread(hot_loading.wait, WAIT_S)
            assert backend._gate.switching and backend.weight_version == 0
            during_hot_load = sample(backend, 2)
        finally:
            resume_save.set()
            resume_hot_load.set()
        async with asyncio.timeout(WAIT_S):
            await step
        return during_save, await during_hot_load

    during_save, during_hot_load = asyncio.run(run())
    assert (during_save.weight_version, during_hot_load.weight_version) == (0, 1)
    assert served(training) == [[1], [2]]


def test_a_failed_hot_load_keeps_the_old_version_and_lets_requests_go(
    backend: FireworksBackend, service: FakeService
) -> None:
    def fail() -> None:
        raise RuntimeError("Hotload failed for sampler snapshot")

    service.training.during_hot_load = fail
    with pytest.raises(RuntimeError, match="Hotload failed"):
        backend.optim_step()
    assert backend.weight_version == 0 and not backend._gate.switching
    result = asyncio.run(backend.sampler().sample(SampleRequest(prompt_token_ids=[1, 5])))
    assert result.weight_version == 0
    assert served(service.training) == [[1]]


def test_a_switch_gives_up_when_requests_keep_running() -> None:
    gate = HotLoadGate()

    async def run() -> None:
        async with gate.request():
            with pytest.raises(TimeoutError, match="weight version 1"):
                await asyncio.to_thread(gate.switch, lambda: "new", 1, 0.01)
        assert (gate.client, gate.version, gate.switching) == (None, 0, False)

    asyncio.run(run())
