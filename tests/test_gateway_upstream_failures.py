"""A failing upstream reaches the client as its real 5xx status, never as a 200 with an error
body, even when the failure takes longer than the heartbeat interval: the official ``openai``
client against a real gateway over the vLLM sampler, with an unreachable, a refusing and a
timing-out worker. A harness then records the episode as a model-server failure."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator

import openai
import pytest
from reference import gateway_fixtures
from rllm_core.kit.retry import RetrySettings
from rllm_core.rollout.classify import infra_outcome
from rllm_core.types import Task, Termination
from rllm_harness_single_turn.harness import SingleTurnHarness
from rllm_harness_single_turn.plugin import SingleTurnConfig
from rllm_sampler_vllm.pool import HttpWorkerPool

HI = [{"role": "user", "content": "hi"}]
client = gateway_fixtures.client
serve = gateway_fixtures.serve
store = gateway_fixtures.store
toy = gateway_fixtures.toy
workers = gateway_fixtures.workers
# Shorter than every failure below, so that the old early 200 would have been sent.
HEARTBEAT_S = 0.05


def _dead_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture
def pool() -> Iterator[Callable[..., HttpWorkerPool]]:
    def make(url: str, **options) -> HttpWorkerPool:
        options.setdefault("retry", RetrySettings(retries=2, retry_backoff_s=0.05))
        options.setdefault("retry_budget_s", 0.5)
        options.setdefault("health_interval_s", 0.1)
        return HttpWorkerPool([url], **options)

    yield make


def _status_error(api: openai.OpenAI, *, stream: bool = False) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as caught:
        api.chat.completions.create(model="policy", messages=HI, stream=stream)
    return caught.value


def test_an_unreachable_upstream_is_a_503_with_retry_after(serve, client, pool):
    gateway = serve(pool(_dead_url()), heartbeat_interval_s=HEARTBEAT_S)
    error = _status_error(client(gateway, "s"))
    assert error.status_code == 503
    assert error.response.headers["retry-after"] == "5"
    assert error.body["code"] == "upstream_unavailable"
    assert error.body["type"] == "upstream_error"


@pytest.mark.parametrize("status", [500, 503])
def test_a_refusing_upstream_is_a_502(serve, client, workers, pool, status):
    worker = workers()
    worker.fail_next(status, count=10, retry_after=0.1, message="engine is sick")
    gateway = serve(pool(worker.url), heartbeat_interval_s=HEARTBEAT_S)
    error = _status_error(client(gateway, "s"))
    assert error.status_code == 502
    assert error.body["code"] == "upstream_error"
    assert f"HTTP {status}: engine is sick" in error.body["message"]
    assert len(worker.requests) == 3


def test_a_timing_out_upstream_is_a_504(serve, client, workers, pool):
    worker = workers(delay_s=1.0)
    gateway = serve(pool(worker.url, request_timeout_s=0.3), heartbeat_interval_s=HEARTBEAT_S)
    error = _status_error(client(gateway, "s"))
    assert error.status_code == 504
    assert error.body["code"] == "upstream_timeout"
    assert "did not answer within 0.3s" in error.body["message"]

    # The gateway's own request timeout ends the wait the same way.
    gateway = serve(pool(worker.url), heartbeat_interval_s=HEARTBEAT_S, request_timeout_s=0.3)
    error = _status_error(client(gateway, "s"))
    assert error.status_code == 504
    assert error.body["code"] == "timeout"


def test_a_stream_keeps_the_status_of_an_error_before_its_first_event(serve, client, pool):
    gateway = serve(pool(_dead_url()), heartbeat_interval_s=5.0)
    error = _status_error(client(gateway, "s"), stream=True)
    assert error.status_code == 503


def test_a_stream_that_started_with_heartbeats_raises_the_error_event(serve, client, pool):
    gateway = serve(pool(_dead_url()), heartbeat_interval_s=HEARTBEAT_S)
    stream = client(gateway, "s").chat.completions.create(model="policy", messages=HI, stream=True)
    with pytest.raises(openai.APIError) as caught:
        list(stream)
    assert caught.value.body["code"] == "upstream_unavailable"


def test_a_harness_records_a_dead_upstream_as_a_model_server_failure(serve, pool):
    gateway = serve(pool(_dead_url()), heartbeat_interval_s=HEARTBEAT_S)
    harness = SingleTurnHarness(SingleTurnConfig(max_retries=0, request_timeout_s=30.0))
    task = Task(task_id="t", instruction="What is 2+2?")
    outcome = asyncio.run(harness.run(task, gateway.endpoint("s"), None))
    assert outcome.termination is Termination.MODEL_ERROR
    assert outcome.metadata["status"] == 503
    assert outcome.metadata["code"] == "upstream_unavailable"
    infra = infra_outcome(outcome)
    assert infra is not None and infra.termination is Termination.MODEL_ERROR
