"""Lending a server away: ``HttpWorkerPool`` as a ``DrainablePool`` against fake vLLM servers.
A drained server gets no new request (sticky keys move), ``in_flight`` counts what still runs
there, ``cut`` ends it (a plain request goes on on another server, a stream falls back or
fails), and ``admit`` routes to it again."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from rllm_core.errors import UpstreamError
from rllm_core.kit.retry import RetrySettings
from rllm_core.ports import DrainablePool, WorkerPool
from rllm_core.routing import routed
from rllm_core.testing.fakevllm import FakeVllmServer
from rllm_core.testing.fakeworker import fixed_reply
from rllm_core.types import SampleRequest, SampleResult, SamplingParams
from rllm_sampler_vllm.pool import HttpWorkerPool

PARAMS = SamplingParams(max_tokens=16, stop_token_ids=(2,))
# Each server answers with its own tokens, so a result tells which one served it.
FROM_A = [11, 12, 13]
FROM_B = [21, 22, 23]
NO_RETRIES = RetrySettings(retries=0, retry_backoff_s=0.01, retry_backoff_max_s=0.05)


@pytest.fixture
def servers():
    """Two fake vLLM servers, ``a`` answering ``FROM_A`` and ``b`` ``FROM_B``."""
    a = FakeVllmServer(reply=fixed_reply(FROM_A))
    b = FakeVllmServer(reply=fixed_reply(FROM_B))
    a.start()
    b.start()
    yield a, b
    a.stop()
    b.stop()


@contextlib.asynccontextmanager
async def opened(*servers: FakeVllmServer, **options) -> AsyncIterator[HttpWorkerPool]:
    options.setdefault("health_interval_s", 0)
    options.setdefault("retry", NO_RETRIES)
    options.setdefault("retry_budget_s", 5.0)
    pool = HttpWorkerPool([s.url for s in servers], **options)
    try:
        yield pool
    finally:
        await pool.aclose()


async def sample(pool: HttpWorkerPool, key: str) -> list[int]:
    with routed(key):
        result = await pool.sample(SampleRequest(prompt_token_ids=[1, 2, 3], params=PARAMS))
    return result.completion_token_ids[:-1]


async def until(condition, timeout_s: float = 3.0) -> None:
    """Wait for ``condition()`` to hold (the fake servers run in other threads)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.005)


def status_of(pool: HttpWorkerPool, server: FakeVllmServer):
    return next(s for s in pool.status() if s.url == server.url)


def test_the_pool_is_drainable_and_an_unknown_url_names_the_pool_urls(servers):
    a, b = servers
    pool = HttpWorkerPool([a.url + "/", b.url], health_interval_s=0)
    assert isinstance(pool, DrainablePool) and isinstance(pool, WorkerPool)
    pool.drain(a.url + "/")
    pool.drain(a.url)
    assert status_of(pool, a).last_error == "drained"
    for call in (pool.drain, pool.in_flight, pool.admit):
        with pytest.raises(KeyError) as caught:
            call("http://127.0.0.1:1")
        message = str(caught.value)
        assert "http://127.0.0.1:1" in message and a.url in message and b.url in message
    with pytest.raises(KeyError, match=r"127\.0\.0\.1:1"):
        asyncio.run(pool.cut("http://127.0.0.1:1"))


def test_a_drained_server_gets_no_new_request_and_its_keys_move_until_admitted(servers):
    a, b = servers

    async def main():
        async with opened(a, b) as pool:
            assert await sample(pool, "k1") == FROM_A
            assert await sample(pool, "k2") == FROM_B
            pool.drain(a.url)
            # k1 stuck to a: it moves to b, and the session counts follow.
            assert await sample(pool, "k1") == FROM_B
            assert await sample(pool, "k3") == FROM_B
            assert (status_of(pool, a).sessions, status_of(pool, b).sessions) == (0, 3)
            drained = status_of(pool, a)
            assert (drained.healthy, drained.last_error) == (False, "drained")
            # A health check finds it up but leaves it out of routing.
            await pool.check_health()
            assert status_of(pool, a).healthy is False
            assert await sample(pool, "k4") == FROM_B

            pool.admit(a.url)
            pool.admit(a.url)
            admitted = status_of(pool, a)
            assert (admitted.healthy, admitted.last_error) == (True, None)
            assert await sample(pool, "k5") == FROM_A
            assert await sample(pool, "k1") == FROM_B  # a key keeps the server it moved to

    asyncio.run(main())
    assert len(a.completions) == 2 and len(b.completions) == 5


def test_a_drained_server_keeps_its_real_error_for_after_the_admit(servers):
    a, b = servers

    async def main():
        async with opened(a, b) as pool:
            pool.drain(a.url)
            a.healthy = False
            await pool.check_health()
            assert status_of(pool, a).last_error == "drained"
            pool.admit(a.url)
            back = status_of(pool, a)
            assert back.healthy is False and "503" in back.last_error
            a.healthy = True
            await pool.check_health()
            assert status_of(pool, a).healthy is True

    asyncio.run(main())


class _Restoring(HttpWorkerPool):
    """A pool that gives its servers weights (as the trainer-following sampler does)."""

    def __init__(self, *args, **options) -> None:
        super().__init__(*args, **options)
        self.restored: list[str] = []

    def holds_weights(self) -> bool:
        return True

    async def restore(self, url: str) -> None:
        self.restored.append(url)


def test_a_drained_server_that_comes_back_gets_its_weights_only_once_admitted(servers):
    a, b = servers

    async def main():
        pool = _Restoring([a.url, b.url], health_interval_s=0)
        try:
            pool.drain(a.url)
            a.healthy = False
            await pool.check_health()
            a.healthy = True
            await pool.check_health()
            assert pool.restored == []
            pool.admit(a.url)
            assert status_of(pool, a).healthy is False
            await pool.check_health()
            assert pool.restored == [a.url] and status_of(pool, a).healthy is True
        finally:
            await pool.aclose()

    asyncio.run(main())


def test_cut_ends_a_running_request_and_its_caller_gets_the_other_servers_answer(servers):
    a, b = servers
    a.hold()

    async def main():
        async with opened(a, b) as pool:
            running = asyncio.create_task(sample(pool, "k"))
            await until(lambda: a.in_flight == 1)
            assert pool.in_flight(a.url) == 1 and pool.in_flight(b.url) == 0
            pool.drain(a.url)
            assert pool.in_flight(a.url) == 1  # a drain lets it go on
            assert not running.done()

            assert await pool.cut(a.url) == 1
            assert pool.in_flight(a.url) == 0
            async with asyncio.timeout(3.0):
                assert await running == FROM_B  # with retries = 0: a cut is not a failure
            assert await pool.cut(a.url) == 0
            cut = status_of(pool, a)
            assert cut.failures == 0 and cut.served == 0
            assert status_of(pool, b).served == 1
            pool.admit(a.url)
            assert status_of(pool, a).healthy is True  # not marked down by the cut
            return pool.status()

    statuses = asyncio.run(main())
    assert [s.in_flight for s in statuses] == [0, 0]
    assert [len(s.completions) for s in servers] == [1, 1]


def test_cut_with_nothing_running_returns_zero(servers):
    a, b = servers

    async def main():
        async with opened(a, b) as pool:
            assert await sample(pool, "k") == FROM_A
            pool.drain(a.url)
            return await pool.cut(a.url), pool.in_flight(a.url)

    assert asyncio.run(main()) == (0, 0)


def test_a_cut_request_waits_for_a_server_and_goes_on_when_one_is_admitted(servers):
    a, _ = servers
    a.hold()

    async def main():
        async with opened(a, health_interval_s=5.0) as pool:
            running = asyncio.create_task(sample(pool, "k"))
            await until(lambda: a.in_flight == 1)
            pool.drain(a.url)
            assert await pool.cut(a.url) == 1
            assert pool.in_flight(a.url) == 0
            await asyncio.sleep(0)
            assert not running.done()  # no server to go to
            a.release()
            pool.admit(a.url)
            # The admit wakes the waiting request at once, not at the next health check.
            async with asyncio.timeout(2.0):
                return await running

    assert asyncio.run(main()) == FROM_A
    assert len(a.completions) == 2


async def read_stream(pool: HttpWorkerPool, pieces: list) -> SampleResult:
    request = SampleRequest(prompt_token_ids=[1, 2, 3], params=PARAMS, request_id="s")
    async for item in pool.sample_stream(request):
        if isinstance(item, SampleResult):
            return item
        pieces.append(item[0])
    raise AssertionError("the stream ended without a result")


def test_a_cut_stream_without_tokens_yet_is_served_by_another_server(servers):
    a, b = servers
    a.hold(after_tokens=0)

    async def main():
        async with opened(a, b) as pool:
            pieces: list = []
            reading = asyncio.create_task(read_stream(pool, pieces))
            await until(lambda: a.in_flight == 1)
            pool.drain(a.url)
            assert await pool.cut(a.url) == 1
            async with asyncio.timeout(3.0):
                result = await reading
            return pieces, result, pool.status()

    pieces, result, statuses = asyncio.run(main())
    assert pieces == [[*FROM_B, 2]]  # the plain request's answer, in one piece
    assert result.completion_token_ids == [*FROM_B, 2]
    assert [s.in_flight for s in statuses] == [0, 0]


def test_a_cut_stream_that_handed_out_tokens_fails_naming_the_server(servers):
    a, b = servers
    a.hold(after_tokens=1)

    async def main():
        async with opened(a, b) as pool:
            pieces: list = []
            reading = asyncio.create_task(read_stream(pool, pieces))
            await until(lambda: len(pieces) == 1)
            pool.drain(a.url)
            assert await pool.cut(a.url) == 1
            assert pool.in_flight(a.url) == 0
            with pytest.raises(UpstreamError) as caught:
                async with asyncio.timeout(3.0):
                    await reading
            return pieces, caught.value

    pieces, error = asyncio.run(main())
    assert pieces == [[FROM_A[0]]]
    assert a.url in str(error) and "cut" in str(error) and "1 tokens" in str(error)
    assert b.completions == []


def test_a_stream_cut_while_its_reader_holds_tokens_fails_when_read_again(servers):
    a, _ = servers

    async def main():
        async with opened(a) as pool:
            request = SampleRequest(prompt_token_ids=[1, 2, 3], params=PARAMS)
            stream = pool.sample_stream(request)
            first = await anext(stream)
            assert first[0] == [FROM_A[0]] and pool.in_flight(a.url) == 1
            pool.drain(a.url)
            assert await pool.cut(a.url) == 1
            assert pool.in_flight(a.url) == 0
            with pytest.raises(UpstreamError, match="was cut"):
                await anext(stream)
            await stream.aclose()

    asyncio.run(main())
