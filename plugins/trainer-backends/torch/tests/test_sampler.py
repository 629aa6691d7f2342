"""TorchSampler on a tiny random Llama: exactness, stopping, seeds, batching, gate and errors."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch
from rllm_core.errors import UpstreamRejectedError
from rllm_core.ports.training import Sampler
from rllm_core.types import SampleRequest, SampleResult, SamplingParams
from rllm_trainer_backend_torch.gate import WeightGate
from rllm_trainer_backend_torch.sampler import TorchSampler
from rllm_trainer_backend_torch.testing import ForwardRecorder, assert_gate_free
from transformers import LlamaForCausalLM

VOCAB = 512


@pytest.fixture(scope="module")
def model(small_llama) -> LlamaForCausalLM:
    return small_llama()


@pytest.fixture(scope="session")
def small_llama(tiny_llama):
    """The sampler tests' Llama: larger initial weights, so sampled tokens vary."""
    return lambda seed=0: tiny_llama(seed, vocab_size=VOCAB, initializer_range=0.2)


def request(prompt: list[int], **params) -> SampleRequest:
    return SampleRequest(prompt_token_ids=prompt, params=SamplingParams(**params))


def prompt_of(length: int, start: int = 3) -> list[int]:
    return [(start + 37 * i) % VOCAB for i in range(length)]


def full_logits(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """Logits predicting each completion token, from one forward over the whole sequence."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0]
    return logits[len(prompt) - 1 : len(prompt) + len(completion) - 1]


def assert_same(a: SampleResult, b: SampleResult) -> None:
    assert a.completion_token_ids == b.completion_token_ids
    assert a.finish_reason == b.finish_reason
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


# --------------------------------------------------------------------------------------------
# What comes out
# --------------------------------------------------------------------------------------------


def test_it_is_a_sampler(sampler: TorchSampler) -> None:
    assert isinstance(sampler, Sampler)
    assert sampler.vocab_size == VOCAB
    assert sampler.max_seq_len == 1024


def test_logprobs_equal_a_fresh_forward_pass(sampler: TorchSampler, model) -> None:
    prompts = [prompt_of(5), prompt_of(17, start=11), prompt_of(2, start=200)]
    requests = [
        request(p, max_tokens=20, temperature=0.7, top_p=0.9, seed=i) for i, p in enumerate(prompts)
    ]
    results = sampler.sample_many(requests)
    for prompt, result in zip(prompts, results, strict=True):
        assert len(result.completion_token_ids) == 20
        expected = torch.log_softmax(
            full_logits(model, prompt, result.completion_token_ids) / 0.7, -1
        )
        chosen = expected.gather(1, torch.tensor(result.completion_token_ids)[:, None])
        assert result.logprobs == pytest.approx(chosen.squeeze(1).tolist(), abs=1e-4)


def test_greedy_equals_argmax_decoding(sampler: TorchSampler, model) -> None:
    prompts = [prompt_of(4), prompt_of(9, start=100)]
    results = sampler.sample_many([request(p, max_tokens=15, temperature=0.0) for p in prompts])
    for prompt, result in zip(prompts, results, strict=True):
        sequence = list(prompt)
        expected_ids, expected_logprobs = [], []
        with torch.no_grad():
            for _ in range(15):
                logits = model(torch.tensor([sequence])).logits[0, -1]
                token = int(logits.argmax())
                expected_ids.append(token)
                expected_logprobs.append(float(torch.log_softmax(logits, -1)[token]))
                sequence.append(token)
        assert result.completion_token_ids == expected_ids
        assert result.logprobs == pytest.approx(expected_logprobs, abs=1e-4)
        assert result.finish_reason == "length"


def test_a_tiny_top_p_samples_the_argmax_but_reports_the_tempered_logprob(
    sampler: TorchSampler, model
) -> None:
    prompt = prompt_of(6)
    greedy = sampler.sample_many([request(prompt, max_tokens=10, temperature=0.0)])[0]
    nucleus = sampler.sample_many(
        [request(prompt, max_tokens=10, temperature=1.3, top_p=1e-6, seed=5)]
    )[0]
    assert nucleus.completion_token_ids == greedy.completion_token_ids
    expected = torch.log_softmax(full_logits(model, prompt, greedy.completion_token_ids) / 1.3, -1)
    chosen = expected.gather(1, torch.tensor(greedy.completion_token_ids)[:, None]).squeeze(1)
    assert nucleus.logprobs == pytest.approx(chosen.tolist(), abs=1e-4)
    assert all(lp < -1e-3 for lp in nucleus.logprobs)


def test_a_stop_token_ends_the_completion_and_is_included(sampler: TorchSampler) -> None:
    prompt = prompt_of(7)
    free = sampler.sample_many([request(prompt, max_tokens=30, seed=3)])[0]
    # The first token that has not appeared before, past the start.
    cut = next(
        i for i in range(3, 30) if free.completion_token_ids[i] not in free.completion_token_ids[:i]
    )
    stop = free.completion_token_ids[cut]
    stopped = sampler.sample_many(
        [request(prompt, max_tokens=30, seed=3, stop_token_ids=(stop, VOCAB - 1))]
    )[0]
    assert stopped.completion_token_ids == free.completion_token_ids[: cut + 1]
    assert stopped.logprobs == pytest.approx(free.logprobs[: cut + 1], abs=1e-6)
    assert stopped.finish_reason == "stop"


def test_no_stop_ids_means_no_stop(sampler: TorchSampler, model) -> None:
    # Even the config's end-of-sequence id does not stop a request that names no stop ids.
    eos = model.config.eos_token_id
    results = sampler.sample_many([request(prompt_of(3), max_tokens=40, seed=s) for s in range(6)])
    assert all(len(r.completion_token_ids) == 40 and r.finish_reason == "length" for r in results)
    assert eos is not None


def test_max_tokens_one_finishes_after_the_prefill(sampler: TorchSampler) -> None:
    result = sampler.sample_many([request(prompt_of(5), max_tokens=1, seed=0)])[0]
    assert len(result.completion_token_ids) == 1
    assert result.finish_reason == "length"


def test_max_tokens_is_clipped_to_the_context(make_sampler) -> None:
    small = make_sampler(max_seq_len=16)
    result = small.sample_many([request(prompt_of(10), max_tokens=50, seed=0)])[0]
    assert len(result.completion_token_ids) == 6
    assert result.finish_reason == "length"


def test_a_prompt_that_fills_the_context_is_refused(make_sampler) -> None:
    small = make_sampler(max_seq_len=16)
    with pytest.raises(
        UpstreamRejectedError, match=r"prompt has 16 tokens but the context holds 16"
    ) as refused:
        small.sample_many([request(prompt_of(16), max_tokens=1)])
    assert refused.value.status == 400


# --------------------------------------------------------------------------------------------
# Seeds and batching
# --------------------------------------------------------------------------------------------


def test_a_seed_repeats_and_different_seeds_differ(sampler: TorchSampler) -> None:
    prompt = prompt_of(8)
    first = sampler.sample_many([request(prompt, max_tokens=25, seed=42)])[0]
    again = sampler.sample_many([request(prompt, max_tokens=25, seed=42)])[0]
    other = sampler.sample_many([request(prompt, max_tokens=25, seed=43)])[0]
    assert first == again
    assert other.completion_token_ids != first.completion_token_ids


def test_a_seed_repeats_in_the_same_batch_composition(sampler: TorchSampler) -> None:
    requests = [request(prompt_of(3 + i, start=i), max_tokens=12, seed=i) for i in range(5)]
    assert sampler.sample_many(requests) == sampler.sample_many(requests)


def test_concurrent_tasks_match_each_request_alone(make_sampler) -> None:
    # Four slots for twelve requests of different lengths: rows finish at different steps,
    # free slots are refilled from the queue and live rows are moved to keep them packed.
    sampler = make_sampler(max_batch_size=4)
    requests = [
        request(prompt_of(2 + 3 * i, start=7 * i), max_tokens=5 + 4 * i, temperature=0.9, seed=i)
        for i in range(12)
    ]

    async def run_all() -> list[SampleResult]:
        return await asyncio.gather(*(sampler.sample(r) for r in requests))

    together = asyncio.run(run_all())
    alone = [sampler.sample_many([r])[0] for r in requests]
    for a, b in zip(together, alone, strict=True):
        assert_same(a, b)
    assert [len(r.completion_token_ids) for r in together] == [5 + 4 * i for i in range(12)]


def test_requests_with_the_same_prompt_share_one_prefill(
    sampler: TorchSampler, recorder: ForwardRecorder
) -> None:
    shared, other = prompt_of(9), prompt_of(5, start=40)
    requests = [request(shared, max_tokens=12, temperature=0.8, seed=i) for i in range(4)]
    requests.append(request(other, max_tokens=12, temperature=0.8, seed=9))
    together = sampler.sample_many(requests)
    assert recorder.shapes[:3] == [(1, 9), (1, 5), (5, 1)]
    assert len({tuple(r.completion_token_ids) for r in together[:4]}) > 1
    for a, b in zip(together, [sampler.sample_many([r])[0] for r in requests], strict=True):
        assert_same(a, b)


def test_growing_the_cache_keeps_what_it_holds(sampler: TorchSampler) -> None:
    # The first request reserves 256 positions; the second needs 512, so the buffers grow
    # while the first is already in them.
    short = request(prompt_of(5), max_tokens=30, seed=1)
    long = request(prompt_of(300), max_tokens=10, seed=2)
    together = sampler.sample_many([short, long])
    for a, b in zip(together, [sampler.sample_many([r])[0] for r in (short, long)], strict=True):
        assert_same(a, b)


def test_a_request_arriving_mid_decode_joins_the_running_batch(
    sampler: TorchSampler, recorder: ForwardRecorder
) -> None:
    recorder.delay_s = 0.002
    first = request(prompt_of(4), max_tokens=120, seed=1)
    second = request(prompt_of(6, start=50), max_tokens=10, seed=2)

    async def run() -> list[SampleResult]:
        task = asyncio.create_task(sampler.sample(first))
        while len(recorder.shapes) < 5:
            await asyncio.sleep(0.001)
        return [await sampler.sample(second), await task]

    late, early = asyncio.run(run())
    assert len(early.completion_token_ids) == 120
    assert len(late.completion_token_ids) == 10
    assert (6, 1) not in recorder.shapes[:5]
    prefill = recorder.shapes.index((1, 6))
    # The newcomer's prefill happens while the first row still has tokens to go, and the next
    # nine decode steps carry both rows.
    assert recorder.shapes[prefill + 1 : prefill + 10] == [(2, 1)] * 9
    assert recorder.shapes[prefill + 10] == (1, 1)


def test_a_peft_wrapped_model_samples_its_adapted_weights(make_sampler, small_llama) -> None:
    from peft import LoraConfig, get_peft_model

    base = small_llama(seed=1)
    peft_model = get_peft_model(
        base,
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    ).eval()
    sampler = make_sampler(peft_model)
    prompt = prompt_of(9)
    result = sampler.sample_many([request(prompt, max_tokens=12, temperature=0.8, seed=0)])[0]
    logits = full_logits(peft_model, prompt, result.completion_token_ids)
    expected = torch.log_softmax(logits / 0.8, -1).gather(
        1, torch.tensor(result.completion_token_ids)[:, None]
    )
    assert result.logprobs == pytest.approx(expected.squeeze(1).tolist(), abs=1e-4)
    with peft_model.disable_adapter():
        unadapted = full_logits(peft_model, prompt, result.completion_token_ids)
    assert not torch.allclose(unadapted, logits, atol=1e-3)
    assert peft_model.training is False


# --------------------------------------------------------------------------------------------
# The weight gate
# --------------------------------------------------------------------------------------------


def test_the_version_at_admission_is_reported(make_sampler, small_llama) -> None:
    gate = WeightGate(version=7)
    sampler = TorchSampler(small_llama(), gate=gate)
    try:
        assert sampler.weight_version == 7
        assert sampler.sample_many([request(prompt_of(3), max_tokens=3)])[0].weight_version == 7
        with gate.exclusive():
            gate.publish()
        assert sampler.weight_version == 8
        assert sampler.sample_many([request(prompt_of(3), max_tokens=3)])[0].weight_version == 8
    finally:
        sampler.close()


def test_the_trainer_waits_for_running_rows_and_blocks_new_ones(
    sampler: TorchSampler, gate: WeightGate, recorder: ForwardRecorder
) -> None:
    recorder.delay_s = 0.002
    calls_when_trainer_entered: list[int] = []

    def train() -> None:
        with gate.exclusive():
            calls_when_trainer_entered.append(len(recorder.shapes))
            time.sleep(0.05)
            gate.publish()

    async def run() -> list[SampleResult]:
        running = asyncio.create_task(sampler.sample(request(prompt_of(4), max_tokens=60, seed=0)))
        while len(recorder.shapes) < 3:
            await asyncio.sleep(0.001)
        trainer = threading.Thread(target=train)
        trainer.start()
        while not gate.trainer_waiting:
            await asyncio.sleep(0.001)
        waiting = asyncio.create_task(sampler.sample(request(prompt_of(5), max_tokens=4, seed=1)))
        results = [await running, await waiting]
        trainer.join()
        return results

    first, second = asyncio.run(run())
    assert (first.weight_version, len(first.completion_token_ids)) == (0, 60)
    # The trainer entered only after the running row's 60 forwards (1 prefill + 59 decode
    # steps), and the request that arrived while it waited was admitted after its publish.
    assert calls_when_trainer_entered == [60]
    assert second.weight_version == 1
    assert recorder.shapes[60] == (1, 5)


# --------------------------------------------------------------------------------------------
# Errors and lifecycle
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, VOCAB, 10_000])
def test_token_ids_outside_the_vocabulary_are_refused(sampler: TorchSampler, bad: int) -> None:
    with pytest.raises(ValueError, match=rf"token id {bad} is outside the vocabulary of {VOCAB}"):
        asyncio.run(sampler.sample(request([1, bad, 2], max_tokens=3)))


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"max_tokens": 0}, "max_tokens must be at least 1, got 0"),
        ({"temperature": -0.5}, r"temperature must be finite and >= 0, got -0.5"),
        ({"top_p": 0.0}, r"top_p must be in \(0, 1\], got 0.0"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\], got 1.5"),
    ],
)
def test_invalid_params_are_refused(sampler: TorchSampler, params: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sampler.sample_many([request(prompt_of(3), **params)])


def test_an_empty_prompt_is_refused(sampler: TorchSampler) -> None:
    with pytest.raises(ValueError, match="prompt is empty"):
        sampler.sample_many([request([], max_tokens=3)])


def test_a_failing_decode_step_fails_its_rows_and_the_sampler_keeps_serving(
    sampler: TorchSampler, recorder: ForwardRecorder
) -> None:
    recorder.fail = lambda ids: ids.shape == (2, 1)
    requests = [
        request(prompt_of(4), max_tokens=8, seed=0),
        request(prompt_of(5), max_tokens=8, seed=1),
    ]

    async def run() -> list:
        return await asyncio.gather(*(sampler.sample(r) for r in requests), return_exceptions=True)

    outcomes = asyncio.run(run())
    assert all(isinstance(o, RuntimeError) for o in outcomes)
    assert all("injected failure on a (2, 1) batch" in str(o) for o in outcomes)
    recorder.fail = lambda ids: False
    assert len(sampler.sample_many(requests[:1])[0].completion_token_ids) == 8


def test_a_failing_prefill_fails_only_its_request(
    sampler: TorchSampler, recorder: ForwardRecorder
) -> None:
    recorder.fail = lambda ids: ids.shape[1] > 1 and int(ids[0, 0]) == 500
    good = request(prompt_of(4), max_tokens=10, seed=0)
    bad = request([500, 1, 2], max_tokens=10, seed=1)

    async def run() -> list:
        return await asyncio.gather(
            sampler.sample(good), sampler.sample(bad), return_exceptions=True
        )

    ok, failed = asyncio.run(run())
    assert isinstance(failed, RuntimeError)
    assert "injected failure on a (1, 3) batch" in str(failed)
    recorder.fail = lambda ids: False
    assert_same(ok, sampler.sample_many([good])[0])


def _sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "rllm-torch-sampler"]


def test_close_is_idempotent_and_leaves_no_thread(model) -> None:
    before = len(_sampler_threads())
    sampler = TorchSampler(model, gate=WeightGate())
    sampler.sample_many([request(prompt_of(3), max_tokens=2)])
    assert len(_sampler_threads()) == before + 1
    sampler.close()
    sampler.close()
    assert len(_sampler_threads()) == before
    with pytest.raises(RuntimeError, match="closed"):
        sampler.sample_many([request(prompt_of(3), max_tokens=2)])


def _wait_for_threads(count: int, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while len(_sampler_threads()) != count and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(_sampler_threads()) == count


def test_the_decode_thread_ends_when_idle_and_the_next_request_starts_one(model) -> None:
    import rllm_trainer_backend_torch.sampler as module

    before = len(_sampler_threads())
    sampler = TorchSampler(model, gate=WeightGate())
    try:
        assert len(_sampler_threads()) == before
        first = sampler.sample_many([request(prompt_of(4), max_tokens=6, seed=3)])[0]
        assert len(_sampler_threads()) == before + 1
        time.sleep(module._IDLE_EXIT_S)
        _wait_for_threads(before)
        again = sampler.sample_many([request(prompt_of(4), max_tokens=6, seed=3)])[0]
        assert again == first
        assert len(_sampler_threads()) == before + 1
    finally:
        sampler.close()
    assert len(_sampler_threads()) == before


def test_close_fails_running_and_queued_requests_and_releases_the_gate(
    model, recorder: ForwardRecorder
) -> None:
    gate = WeightGate()
    sampler = TorchSampler(model, gate=gate, max_batch_size=1)
    recorder.delay_s = 0.002
    outcomes: list = []

    def run() -> None:
        try:
            sampler.sample_many([request(prompt_of(3), max_tokens=500, seed=s) for s in range(2)])
        except RuntimeError as exc:
            outcomes.append(exc)

    caller = threading.Thread(target=run)
    caller.start()
    assert recorder.called.wait(5)
    sampler.close()
    caller.join(5)
    assert not caller.is_alive()
    assert len(outcomes) == 1 and "closed before this request finished" in str(outcomes[0])
    assert_gate_free(gate)


def test_an_abandoned_request_frees_its_slot(
    sampler: TorchSampler, gate: WeightGate, recorder
) -> None:
    recorder.delay_s = 0.002

    async def run() -> None:
        task = asyncio.create_task(sampler.sample(request(prompt_of(3), max_tokens=900, seed=0)))
        while len(recorder.shapes) < 3:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert_gate_free(gate)
    assert len(recorder.shapes) < 100


def test_a_fault_outside_the_model_fails_the_rows_in_flight_and_serving_goes_on(
    sampler: TorchSampler, gate: WeightGate
) -> None:
    retire = sampler._retire
    faults = [RuntimeError("bookkeeping fault")]

    def faulty_retire(indices: list[int]) -> None:
        if faults and indices:
            raise faults.pop()
        retire(indices)

    sampler._retire = faulty_retire
    with pytest.raises(RuntimeError, match="bookkeeping fault"):
        sampler.sample_many([request(prompt_of(4), max_tokens=3, seed=0)])
    assert len(sampler.sample_many([request(prompt_of(4), max_tokens=3)])[0].logprobs) == 3
    assert_gate_free(gate)


def test_busy_seconds_count_model_work_and_not_idle_time(sampler: TorchSampler) -> None:
    from rllm_core.ports.training import BusyClock

    assert isinstance(sampler, BusyClock)
    assert sampler.busy_seconds == 0.0
    started = time.perf_counter()
    sampler.sample_many([request(prompt_of(8), max_tokens=40, seed=i) for i in range(4)])
    # The step that delivers the last result is counted just after it delivers.
    time.sleep(0.1)
    elapsed = time.perf_counter() - started
    busy = sampler.busy_seconds
    assert 0.0 < busy <= elapsed
    time.sleep(0.2)
    assert sampler.busy_seconds == busy
