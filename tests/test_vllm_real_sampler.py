"""The vLLM sampler against a real vLLM server (vLLM's CPU build, from the test kit's side
environment) and the torch trainer on the real SmolLM2: the logprobs the server reports for the
tokens it sampled are the trainer's own logprobs for those tokens, for the base model, for a
LoRA adapter after an optimizer step and for full weights after an optimizer step, which also
proves that the server serves the weights the trainer wrote."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping

import pytest
from msgspec.structs import replace
from rllm_core.algorithms.objective import Objective
from rllm_core.types import Datum, SampleRequest, SampleResult, SamplingParams
from rllm_loss_ppo.plugin import ReinforceLossConfig
from rllm_loss_ppo.reinforce import Reinforce
from rllm_sampler_vllm.follower import VllmSampler
from rllm_trainer_backend_torch.backend import TorchBackend
from rllm_trainer_backend_torch.plugin import TorchBackendConfig

pytestmark = pytest.mark.vllm

QUESTIONS = ("What is 7 plus 5?", "Name a colour.", "Say hello.", "Count to three.")
K3_LIMIT = 1e-6


@pytest.fixture
def server(real_vllm_server):
    real_vllm_server.reset()
    yield real_vllm_server
    real_vllm_server.reset()


@pytest.fixture(scope="module")
def prompts(smollm2_model_dir) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(smollm2_model_dir))
    out = []
    for question in QUESTIONS:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True
        )
        out.append(list(ids["input_ids"] if isinstance(ids, Mapping) else ids))
    return out


def trainer(model_dir, *, lora: bool) -> TorchBackend:
    keys = {"model": str(model_dir), "device": "cpu", "seed": 0, "learning_rate": 1e-2}
    if lora:
        keys["lora"] = {"rank": 8, "alpha": 16}
    else:
        keys.update(lora={"rank": 0}, learning_rate=2e-4)
    return TorchBackend(TorchBackendConfig(**keys))


def datum(prompt: list[int], completion: list[int], advantage: float = 0.0) -> Datum:
    length = len(prompt) + len(completion)
    return Datum(
        token_ids=prompt + completion,
        logprobs=[0.0] * length,
        advantages=[advantage] * length,
        action_mask=[False] * len(prompt) + [True] * len(completion),
        observation_mask=[False] * length,
    )


def one_step(backend: TorchBackend, prompts: list[list[int]], results: list[SampleResult]):
    """One REINFORCE step that raises the likelihood of the first answer and lowers the
    others', so that the weights move."""
    batch = [
        datum(prompt, result.completion_token_ids, 1.0 if index == 0 else -1.0)
        for index, (prompt, result) in enumerate(zip(prompts, results, strict=True))
    ]
    objective = Objective.of(Reinforce(ReinforceLossConfig()), proximal="recompute")
    scored = backend.compute_logprobs(batch)
    batch = [replace(d, proximal_logprobs=lp) for d, lp in zip(batch, scored, strict=True)]
    backend.forward_backward(batch, objective)
    backend.optim_step()


async def sample_all(sampler: VllmSampler, prompts: list[list[int]]) -> list[SampleResult]:
    requests = [
        SampleRequest(
            prompt_token_ids=prompt,
            params=SamplingParams(max_tokens=12, temperature=1.0, seed=index, stop_token_ids=(2,)),
            request_id=f"r{index}",
        )
        for index, prompt in enumerate(prompts)
    ]
    return list(await asyncio.gather(*(sampler.sample(r) for r in requests)))


def k3_against(backend: TorchBackend, prompts, results) -> tuple[float, float]:
    """The mean k3 estimate of KL between the server's and the trainer's distributions over
    the sampled tokens, and the largest absolute logprob difference."""
    scored = backend.compute_logprobs(
        [datum(p, r.completion_token_ids) for p, r in zip(prompts, results, strict=True)]
    )
    terms, worst = [], 0.0
    for prompt, result, row in zip(prompts, results, scored, strict=True):
        ours = row[len(prompt) :]
        assert len(ours) == len(result.logprobs) == len(result.completion_token_ids) > 0
        for trained, served in zip(ours, result.logprobs, strict=True):
            log_ratio = trained - served
            terms.append(math.exp(log_ratio) - 1 - log_ratio)
            worst = max(worst, abs(log_ratio))
    return sum(terms) / len(terms), worst


def sampler_for(server, tmp_path, **keys) -> VllmSampler:
    return VllmSampler(
        [server.url],
        model=server.served_model_name,
        weights_dir=str(tmp_path / "weights"),
        health_interval_s=0,
        **keys,
    )


def test_the_base_model_samples_token_ids_with_the_trainers_logprobs(
    server, smollm2_model_dir, prompts, tmp_path
):
    async def main():
        sampler = sampler_for(server, tmp_path)
        try:
            results = await sample_all(sampler, prompts)
            again = await sample_all(sampler, prompts)
            request = SampleRequest(
                prompt_token_ids=prompts[0],
                params=SamplingParams(max_tokens=12, seed=0, stop_token_ids=(2,)),
            )
            pieces = [item async for item in sampler.sample_stream(request)]
            return results, again, pieces
        finally:
            await sampler.aclose()

    results, again, pieces = asyncio.run(main())
    assert all(r.finish_reason in ("stop", "length") for r in results)
    assert all(r.weight_version == 0 for r in results)
    # A seed makes a request reproducible on vLLM: the same seed gives the same tokens.
    assert [r.completion_token_ids for r in again] == [r.completion_token_ids for r in results]
    *chunks, final = pieces
    assert isinstance(final, SampleResult) and len(chunks) > 1
    assert [t for ids, _ in chunks for t in ids] == final.completion_token_ids
    assert final.completion_token_ids == results[0].completion_token_ids
    # Batched and alone, vLLM computes in another order: equal to float32 rounding.
    assert final.logprobs == pytest.approx(results[0].logprobs, abs=1e-4)
    k3, worst = k3_against(trainer(smollm2_model_dir, lora=True), prompts, results)
    assert k3 <= K3_LIMIT, (k3, worst)


def test_seeded_prompts_beyond_one_steps_token_budget_are_served(server, tmp_path):
    """Twelve seeded 400-token prompts at once exceed the 2048 tokens vLLM's CPU build
    schedules per step; with chunked prefill (its default) it splits them and its engine dies
    ("CPU Generator does not use offset"), so servers run without it, as the sampler starts
    them."""
    requests = [
        SampleRequest(
            prompt_token_ids=[1] + [(index * 37 + at) % 40000 + 10 for at in range(400)],
            params=SamplingParams(max_tokens=2, temperature=1.0, seed=index),
            request_id=f"long{index}",
        )
        for index in range(12)
    ]

    async def main():
        sampler = sampler_for(server, tmp_path)
        try:
            return await asyncio.gather(*(sampler.sample(r) for r in requests))
        finally:
            await sampler.aclose()

    results = asyncio.run(main())
    assert [len(r.completion_token_ids) for r in results] == [2] * 12
    assert server.alive() and server.healthy()


def test_lora_after_an_optimizer_step_serves_the_trainers_adapter_and_keeps_only_the_newest(
    server, smollm2_model_dir, prompts, tmp_path
):
    backend = trainer(smollm2_model_dir, lora=True)

    async def main():
        sampler = sampler_for(server, tmp_path, keep_adapters=1)
        try:
            base = await sample_all(sampler, prompts)
            held = []
            for version in (1, 2, 3):
                one_step(backend, prompts, base)
                assert backend.weight_version == version
                await sampler.update_weights(backend.export_weights(sampler.export_path(version)))
                held.append(sorted(server.adapters()))
            return base, await sample_all(sampler, prompts), held, sampler.sync_metrics()
        finally:
            await sampler.aclose()

    _, results, held, metrics = asyncio.run(main())
    assert held == [["policy-v1"], ["policy-v1", "policy-v2"], ["policy-v2", "policy-v3"]]
    assert {r.weight_version for r in results} == {3}
    assert metrics["vllm/weight_syncs"] == 3
    k3, worst = k3_against(backend, prompts, results)
    assert k3 <= K3_LIMIT, (k3, worst)
    # The adapter moved the distribution: the base model's logprobs of the same tokens differ.
    _, moved = k3_against(trainer(smollm2_model_dir, lora=True), prompts, results)
    assert moved > 1e-2


def test_full_weights_after_an_optimizer_step_are_served_exactly_and_come_back_after_a_restart(
    server, smollm2_model_dir, prompts, tmp_path
):
    backend = trainer(smollm2_model_dir, lora=False)

    async def main():
        sampler = sampler_for(server, tmp_path)
        try:
            base = await sample_all(sampler, prompts)
            one_step(backend, prompts, base)
            await sampler.update_weights(backend.export_weights(sampler.export_path(1)))
            assert server.get("/weight_info") == {"weight_version": "1"}
            stepped = await sample_all(sampler, prompts)
            await asyncio.to_thread(server.restart)
            assert server.get("/weight_info") == {"weight_version": "default"}
            # The first probe sees the startup weights and takes the server out; the next
            # gives it version 1 again.
            await sampler.check_health()
            down = [w.healthy for w in sampler.status()]
            await sampler.check_health()
            restored = await sample_all(sampler, prompts)
            return stepped, down, restored, sampler.sync_metrics()
        finally:
            await sampler.aclose()

    stepped, down, restored, metrics = asyncio.run(main())
    assert down == [False]
    assert metrics["vllm/restores"] == 1
    assert server.get("/weight_info") == {"weight_version": "1"}
    assert {r.weight_version for r in stepped + restored} == {1}
    # Seeded requests on the restored server sample what they sampled before the restart.
    for before, after in zip(stepped, restored, strict=True):
        assert after.completion_token_ids == before.completion_token_ids
        assert after.logprobs == pytest.approx(before.logprobs, abs=1e-4)
    # The server serves exactly the trained weights, tied output embedding included, before
    # and after the restart.
    for results in (stepped, restored):
        k3, worst = k3_against(backend, prompts, results)
        assert k3 <= K3_LIMIT, (k3, worst)
    # and the startup weights are not that close to them.
    to_base, _ = k3_against(trainer(smollm2_model_dir, lora=True), prompts, stepped)
    assert to_base > 1e3 * K3_LIMIT, to_base


def test_a_generation_cut_from_a_drained_server_is_answered_through_another(server, prompts):
    """The pool's drain and cut (convertible nodes) against vLLM itself: the server is reached
    under two addresses, a long seeded generation runs under the first, which is drained and
    cut mid-generation; vLLM aborts it there, and the same request sent under the second
    address is answered in full, with the tokens an uncut run of it gives."""
    from rllm_core.routing import routed
    from rllm_sampler_vllm.pool import HttpWorkerPool

    lent, other = server.url, server.url.replace("127.0.0.1", "localhost")
    params = SamplingParams(max_tokens=160, seed=3, temperature=1.0)
    request = SampleRequest(prompt_token_ids=prompts[0], params=params)

    async def main():
        pool = HttpWorkerPool([lent, other], model=server.served_model_name, health_interval_s=0)
        try:
            with routed("lent"):
                running = asyncio.ensure_future(pool.sample(request))
            while pool.in_flight(lent) == 0:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)  # generating
            pool.drain(lent)
            cut = await pool.cut(lent)
            result = await running
            pool.admit(lent)
            with routed("again"):
                uncut = await pool.sample(request)
            return cut, result, uncut, {s.url: s.served for s in pool.status()}
        finally:
            await pool.aclose()

    cut, result, uncut, served = asyncio.run(main())
    assert cut == 1
    assert served[other] == 1 and result.finish_reason in ("stop", "length")
    assert result.completion_token_ids == uncut.completion_token_ids


def test_two_gateway_workers_sample_from_the_adapter_the_run_loaded(
    server, smollm2_model_dir, prompts, tmp_path
):
    """``[gateway].workers``' parts against vLLM itself: the run's sampler loads the adapter of
    an optimizer step; two gateway worker processes, told the policy, serve chat sessions
    through their own clients; the tokens each traced call sampled have the trained adapter's
    logprobs (not the base model's), and the traces report its version."""
    import openai
    from rllm_core.rollout.gateway_workers import Component, open_gateway_workers
    from rllm_trace_store_deltachain.memory import MemoryTraceStore

    backend = trainer(smollm2_model_dir, lora=True)
    store = MemoryTraceStore()

    async def main():
        sampler = sampler_for(server, tmp_path, keep_adapters=1)
        try:
            one_step(backend, prompts, await sample_all(sampler, prompts))
            await sampler.update_weights(backend.export_weights(sampler.export_path(1)))
            async with open_gateway_workers(
                2,
                renderer=Component("chatml", {"tokenizer": str(smollm2_model_dir)}),
                sampler=sampler,
                sampler_name="vllm",
                store=store,
            ) as (sessions, _):
                ids = [f"s-{n}" for n in range(32)]
                chosen = [next(s for s in ids if sessions.ring.owner(s) == w) for w in (0, 1)]
                chosen += [s for s in ids if s not in chosen][:2]
                traces = []
                for index, (sid, question) in enumerate(zip(chosen, QUESTIONS, strict=True)):
                    sessions.configure_session(
                        sid, enforced=SamplingParams(max_tokens=12, seed=index)
                    )
                    endpoint = sessions.endpoint(sid)
                    agent = openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key)
                    await asyncio.to_thread(
                        agent.chat.completions.create,
                        model=endpoint.model,
                        messages=[{"role": "user", "content": question}],
                    )
                    (trace,) = sessions.traces.session(sid)
                    sessions.release_session(sid)
                    traces.append(trace)
                owners = [sessions.ring.owner(sid) for sid in chosen]
                return traces, sessions.take_calls(), owners
        finally:
            await sampler.aclose()

    traces, calls, owners = asyncio.run(main())
    assert calls == {f"gateway/calls/{w}": float(owners.count(w)) for w in (0, 1)}
    assert all(calls.values()), calls
    assert {t.record.weight_version for t in traces} == {1}
    served = [t.record for t in traces]
    k3, worst = k3_against(backend, [t.prompt_token_ids for t in traces], served)
    assert k3 <= K3_LIMIT, (k3, worst)
    _, moved = k3_against(
        trainer(smollm2_model_dir, lora=True), [t.prompt_token_ids for t in traces], served
    )
    assert moved > 1e-2
