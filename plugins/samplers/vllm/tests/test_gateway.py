"""The whole path: the ``openai`` client, the gateway, the vLLM sampler and fake vLLM workers
over real sockets. Retries at both ends, replays, and sessions sticking to their worker."""

from __future__ import annotations

import json
import socket
import urllib.request

import openai
import pytest
from reference.toy_renderer import IM_END
from rllm_core.kit.retry import RetrySettings
from rllm_core.testing.fakeworker import fake_logprob, fixed_reply
from rllm_sampler_vllm.pool import HttpWorkerPool

HI = [{"role": "user", "content": "hi"}]


def test_a_worker_429_is_retried_inside_the_gateway(serve, client, workers, toy, store):
    worker = workers(reply=fixed_reply(toy.encode("after the wait")))
    worker.fail_next(429, retry_after=0.2, message="too many requests")
    gateway = serve(HttpWorkerPool([worker.url], health_interval_s=0))

    reply = client(gateway, "s").chat.completions.create(model="policy", messages=HI, logprobs=True)

    assert reply.choices[0].message.content == "after the wait"
    assert len(worker.requests) == 2
    assert worker.requests[0] == worker.requests[1]
    ids = [*toy.encode("after the wait"), IM_END]
    assert [c.logprob for c in reply.choices[0].logprobs.content] == [
        fake_logprob(t, i) for i, t in enumerate(ids)
    ]
    [trace] = store.session("s")
    assert trace.prompt_token_ids == worker.requests[0]["prompt"]
    assert trace.record.completion_token_ids == ids


def test_a_502_from_exhausted_retries_is_retried_by_the_openai_client(
    serve, client, workers, toy, store
):
    worker = workers(reply=fixed_reply(toy.encode("finally")))
    worker.fail_next(500, count=2, message="engine crashed")
    retry = RetrySettings(retries=1, retry_backoff_s=0.01)
    pool = HttpWorkerPool([worker.url], retry=retry, health_interval_s=0)
    gateway = serve(pool)

    api = client(gateway, "s", max_retries=1)
    reply = api.chat.completions.create(model="policy", messages=HI)

    assert reply.choices[0].message.content == "finally"
    assert len(worker.requests) == 3
    assert [t.record.turn for t in store.session("s")] == [0]


def test_a_repeated_request_is_a_replay_that_overwrites_its_trace(
    serve, client, workers, toy, store
):
    worker = workers(reply=fixed_reply(toy.encode("same")))
    gateway = serve(HttpWorkerPool([worker.url]), cumulative=True)
    api = client(gateway, "s")
    messages = [{"role": "system", "content": "sys"}, *HI]

    first = api.chat.completions.create(model="policy", messages=messages)
    again = api.chat.completions.create(model="policy", messages=messages)

    assert first.model_extra["rllm"]["mode"] == "root"
    assert again.model_extra["rllm"]["mode"] == "replay"
    assert again.model_extra["rllm"]["trace_id"] == first.model_extra["rllm"]["trace_id"]
    assert len(worker.requests) == 2
    assert [r.trace_id for r in store.chain("s")] == [first.model_extra["rllm"]["trace_id"]]


def test_sessions_stick_to_one_worker_across_turns(serve, client, workers, toy):
    first, second = workers(), workers()
    gateway = serve(HttpWorkerPool([first.url, second.url], health_interval_s=0), cumulative=True)

    for n in range(6):
        api = client(gateway, f"agent-{n}")
        messages = [{"role": "system", "content": f"agent number {n}"}]
        for turn in range(3):
            messages.append({"role": "user", "content": f"turn {turn}"})
            out = api.chat.completions.create(model="policy", messages=messages)
            messages.append(out.choices[0].message.model_dump(exclude_none=True))

    def agents(worker) -> set[int]:
        return {int(toy.decode(r["prompt"]).split("agent number ")[1][0]) for r in worker.requests}

    assert len(first.requests) == len(second.requests) == 9
    assert agents(first) | agents(second) == set(range(6))
    assert not agents(first) & agents(second)


def test_every_worker_down_is_a_503_naming_them(serve, client, toy):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    retry = RetrySettings(retry_backoff_s=0.05)
    pool = HttpWorkerPool([url], retry=retry, retry_budget_s=0.3, health_interval_s=0.1)
    gateway = serve(pool)
    with pytest.raises(openai.InternalServerError) as unavailable:
        client(gateway, "s").chat.completions.create(model="policy", messages=HI)
    assert unavailable.value.status_code == 503
    error = unavailable.value.response.json()["error"]
    assert error["code"] == "upstream_unavailable"
    assert f"{url} (could not connect to {url}" in error["message"]
    with urllib.request.urlopen(f"{gateway.base_url}/health", timeout=30) as response:
        health = json.load(response)
    assert health["status"] == "degraded"
    assert health["upstreams"] == {"healthy": 0, "total": 1}


def test_the_openai_client_reuses_its_connection_after_a_413(serve, client, toy):
    gateway = serve(
        HttpWorkerPool(["http://127.0.0.1:9"], health_interval_s=0), max_body_bytes=2048
    )
    api = client(gateway, "s")
    for _ in range(2):
        with pytest.raises(openai.APIStatusError) as refused:
            api.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "x" * 50_000}]
            )
        assert refused.value.status_code == 413
        assert [m.id for m in api.models.list()] == ["policy"]
