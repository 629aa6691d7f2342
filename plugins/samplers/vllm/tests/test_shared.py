"""The vLLM pool as a ``SharedPool``: a client built in another process from its
``client_options`` (through the plugin's own component, as a run's gateway worker builds it)
sends to the same servers with the same name, key, timeouts and retries, starts none, and sends
what it is told to ``use``."""

from __future__ import annotations

import asyncio

from rllm_core.plugins import PluginManager
from rllm_core.ports import SharedPool
from rllm_core.testing.fakevllm import FakeVllmServer
from rllm_core.types import SampleRequest, SamplingParams
from rllm_sampler_vllm.pool import HttpWorkerPool


def build(options):
    spec = PluginManager().get("sampler", "vllm")
    assert spec.trait("shared") is True
    return spec.factory(spec.validate_config(options))


def test_a_client_from_the_options_sends_to_the_same_servers_as_told():
    with FakeVllmServer() as first, FakeVllmServer() as second:
        owner = HttpWorkerPool(
            [first.url, second.url],
            model="base",
            api_key="secret",
            retry_budget_s=7.0,
            request_timeout_s=33.0,
            health_interval_s=0.5,
        )
        assert isinstance(owner, SharedPool)
        options = owner.client_options()
        assert options["urls"] == [first.url, second.url]
        assert (options["model"], options["api_key"]) == ("base", "secret")
        assert (options["retry_budget_s"], options["request_timeout_s"]) == (7.0, 33.0)
        assert "serve" not in options and "weights_dir" not in options
        client = build(options)
        for server in (first, second):
            server.adapters["policy-v3"] = "/weights/v3"  # what the owner would have loaded

        async def sample() -> None:
            client.use(*owner.served_policy())
            await client.sample(
                SampleRequest(prompt_token_ids=[1, 2], params=SamplingParams(max_tokens=2))
            )
            owner.use("policy-v3", 3)
            client.use(*owner.served_policy())
            result = await client.sample(
                SampleRequest(prompt_token_ids=[1, 2], params=SamplingParams(max_tokens=2))
            )
            assert result.weight_version == 3
            await client.aclose()
            await owner.aclose()

        asyncio.run(sample())
        sent = first.requests + second.requests
        assert [r.get("model") for r in sent] == ["base", "policy-v3"]
        assert first.calls == [] and second.calls == []  # no adapter loaded, no reload
