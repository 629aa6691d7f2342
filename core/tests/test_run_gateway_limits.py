"""A run's gateway applies the plan's ``[gateway]`` limits as ``gateway serve`` applies its
flags."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import openai
import pytest
from reference.toy_renderer import ToyChatRenderer
from rllm_core.plan.schema import Plan
from rllm_core.plugins import PluginManager
from rllm_core.rollout.context import open_rollouts, rollout_settings
from rllm_core.testing.samplers import ScriptedSampler

TOY = ToyChatRenderer()
HI = [{"role": "user", "content": "hi"}]
LONG = [{"role": "user", "content": " ".join(["word"] * 40)}]


def _components(sampler: ScriptedSampler) -> SimpleNamespace:
    return SimpleNamespace(
        sampler=None,
        trainer=SimpleNamespace(sampler=lambda: sampler),
        renderer=TOY,
        trace_store=PluginManager().get("trace_store", "memory").build({}),
        tasks=None,
        harness=None,
        sandbox=None,
    )


def test_a_runs_gateway_refuses_a_prompt_over_max_prompt_tokens_with_a_400():
    plan = Plan.model_validate({"gateway": {"max_prompt_tokens": 30}})
    sampler = ScriptedSampler(lambda request: "ok", renderer=TOY)

    async def scenario() -> None:
        settings = rollout_settings(plan, group_size=1)
        async with open_rollouts(
            plan, _components(sampler), settings=settings, run_id="r"
        ) as rollouts:
            endpoint = rollouts.gateway.endpoint("r-s")
            client = openai.AsyncOpenAI(
                base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0
            )
            short = await client.chat.completions.create(model="policy", messages=HI)
            assert short.choices[0].message.content == "ok"
            with pytest.raises(openai.BadRequestError) as refused:
                await client.chat.completions.create(model="policy", messages=LONG)
            error = refused.value.body
            assert error["code"] == "prompt_too_long"
            assert "over the gateway's limit of 30" in error["message"]
            await client.close()

    asyncio.run(scenario())
    assert len(sampler.requests) == 1


def test_max_prompt_tokens_below_one_is_refused_naming_the_key():
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        Plan.model_validate({"gateway": {"max_prompt_tokens": 0}})
