"""Prefix reuse in TorchSampler: the next turn of a conversation runs only its new tokens,
with the logprobs a lone forward over the whole sequence gives."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from rllm_core.types import SampleRequest, SamplingParams
from rllm_trainer_backend_torch.gate import WeightGate
from rllm_trainer_backend_torch.prefix_cache import MIN_REUSE_TOKENS, PrefixCache
from rllm_trainer_backend_torch.sampler import TorchSampler

VOCAB = 512


@pytest.fixture(scope="module")
def model(tiny_llama):
    return tiny_llama(0, vocab_size=VOCAB, initializer_range=0.2)


@pytest.fixture
def shapes(model) -> Iterator[list[tuple[int, ...]]]:
    """Shapes of the sampler's forwards (the tests' own forwards pass ids positionally)."""
    seen: list[tuple[int, ...]] = []

    def record(module, args, kwargs) -> None:
        if "input_ids" in kwargs:
            seen.append(tuple(kwargs["input_ids"].shape))

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    yield seen
    handle.remove()


@pytest.fixture
def sampler(model, gate) -> Iterator[TorchSampler]:
    made = TorchSampler(model, gate=gate, prefix_cache_bytes=64 * 2**20)
    yield made
    made.close()


def request(prompt: list[int], **params) -> SampleRequest:
    params.setdefault("temperature", 0.9)
    return SampleRequest(prompt_token_ids=prompt, params=SamplingParams(**params))


def prompt_of(length: int, start: int = 3) -> list[int]:
    return [(start + 37 * i) % VOCAB for i in range(length)]


def lone_forward_logprobs(model, prompt: list[int], completion: list[int], temperature: float):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0]
    logits = logits[len(prompt) - 1 : len(prompt) + len(completion) - 1] / temperature
    chosen = torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None])
    return chosen.squeeze(1).tolist()


def test_the_next_turn_runs_only_its_new_tokens_with_the_logprobs_of_a_lone_forward(
    sampler: TorchSampler, model, shapes
) -> None:
    first_prompt = prompt_of(40)
    first = sampler.sample_many([request(first_prompt, max_tokens=12, seed=1)])[0]
    observation = prompt_of(9, start=101)
    second_prompt = first_prompt + first.completion_token_ids + observation
    shapes.clear()
    second = sampler.sample_many([request(second_prompt, max_tokens=12, seed=2)])[0]

    # The stored sequence is the first prompt and all but the last completion token (the
    # last was chosen, never fed), so that token and the observation run.
    assert shapes[0] == (1, len(observation) + 1)
    assert second.logprobs == pytest.approx(
        lone_forward_logprobs(model, second_prompt, second.completion_token_ids, 0.9), abs=1e-4
    )


def test_reuse_gives_what_sampling_without_it_gives(model, gate) -> None:
    plain = TorchSampler(model, gate=gate)
    reusing = TorchSampler(model, gate=gate, prefix_cache_bytes=64 * 2**20)
    try:
        turns = []
        for sampler in (plain, reusing):
            prompt, results = prompt_of(30), []
            for turn in range(3):
                result = sampler.sample_many([request(prompt, max_tokens=10, seed=turn)])[0]
                results.append(result)
                prompt = prompt + result.completion_token_ids + prompt_of(6, start=7 * turn)
            turns.append(results)
        for a, b in zip(*turns, strict=True):
            assert a.completion_token_ids == b.completion_token_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
        assert reusing._prefixes.hits == 2
    finally:
        plain.close()
        reusing.close()


def test_a_shared_start_like_a_system_prompt_is_reused(sampler: TorchSampler, model, shapes):
    system = prompt_of(30, start=5)
    sampler.sample_many([request(system + prompt_of(8, start=60), max_tokens=4, seed=1)])
    other = system + prompt_of(11, start=200)
    shapes.clear()
    result = sampler.sample_many([request(other, max_tokens=6, seed=3)])[0]
    assert shapes[0] == (1, 11)
    assert result.logprobs == pytest.approx(
        lone_forward_logprobs(model, other, result.completion_token_ids, 0.9), abs=1e-4
    )


def test_a_prompt_equal_to_a_stored_sequence_runs_its_last_token(sampler: TorchSampler, shapes):
    prompt = prompt_of(25)
    first = sampler.sample_many([request(prompt, max_tokens=5, seed=1)])[0]
    again = prompt + first.completion_token_ids[:-1]
    shapes.clear()
    sampler.sample_many([request(again, max_tokens=3, seed=2)])
    assert shapes[0] == (1, 1)


def test_short_shared_starts_and_new_weights_are_not_reused(
    sampler: TorchSampler, gate: WeightGate, shapes
) -> None:
    sampler.sample_many([request(prompt_of(40), max_tokens=4, seed=1)])
    short = prompt_of(MIN_REUSE_TOKENS - 1) + prompt_of(20, start=77)
    shapes.clear()
    sampler.sample_many([request(short, max_tokens=2, seed=2)])
    assert shapes[0] == (1, len(short))

    with gate.exclusive():
        gate.publish()
    longer = prompt_of(40) + prompt_of(5, start=9)
    shapes.clear()
    sampler.sample_many([request(longer, max_tokens=2, seed=3)])
    assert shapes[0] == (1, len(longer))


def test_a_group_reuses_one_stored_start_and_shares_its_forward(
    sampler: TorchSampler, model, shapes
) -> None:
    base = prompt_of(35)
    sampler.sample_many([request(base, max_tokens=3, seed=0)])
    turn = base + prompt_of(7, start=300)
    shapes.clear()
    results = sampler.sample_many([request(turn, max_tokens=8, seed=i) for i in range(4)])
    assert shapes[:2] == [(1, 7), (4, 1)]
    for result in results:
        assert result.logprobs == pytest.approx(
            lone_forward_logprobs(model, turn, result.completion_token_ids, 0.9), abs=1e-4
        )


def _layers(tokens: int, layers: int = 2) -> list[torch.Tensor]:
    return [torch.zeros(1, tokens, 4) for _ in range(layers)]


def test_the_store_keeps_to_its_bytes_and_drops_the_least_recently_used() -> None:
    entry_bytes = 2 * 2 * 20 * 4 * 4  # keys and values, 2 layers, 20 positions, 4 floats
    cache = PrefixCache(max_bytes=2 * entry_bytes)
    a, b, c = prompt_of(20, start=1), prompt_of(20, start=2), prompt_of(20, start=3)
    cache.put(a, 0, _layers(20), _layers(20))
    cache.put(b, 0, _layers(20), _layers(20))
    assert cache.lookup([*a, 1], 0).length == 20  # a is now the most recently used
    cache.put(c, 0, _layers(20), _layers(20))
    assert cache.nbytes == 2 * entry_bytes
    assert cache.lookup([*b, 1], 0) is None
    assert cache.lookup([*a, 1], 0).length == 20
    assert cache.lookup([*c, 1], 0).length == 20


def test_the_store_replaces_what_a_longer_entry_extends_and_forgets_old_versions() -> None:
    cache = PrefixCache(max_bytes=2**20)
    short = prompt_of(20)
    cache.put(short, 0, _layers(20), _layers(20))
    cache.put(short + prompt_of(10, start=9), 0, _layers(30), _layers(30))
    assert len(cache) == 1
    assert cache.lookup(short + prompt_of(10, start=9) + [5], 0).length == 30
    assert cache.lookup([*short, 5], 0).length == 20
    # The whole prompt never comes from the store: its last token must run.
    assert cache.lookup(short, 0).length == 19
    assert cache.lookup([*short, 5], 1) is None
    assert len(cache) == 0
    with pytest.raises(ValueError, match="max_bytes"):
        PrefixCache(max_bytes=-1)


def test_the_backend_drops_stored_prefixes_before_a_training_pass(tmp_path, tiny_llama) -> None:
    from rllm_core.algorithms.objective import Objective
    from rllm_loss_ppo.plugin import ReinforceLossConfig
    from rllm_loss_ppo.reinforce import Reinforce
    from rllm_trainer_backend_torch.backend import TorchBackend
    from rllm_trainer_backend_torch.plugin import TorchBackendConfig
    from rllm_trainer_backend_torch.testing import random_datums

    tiny_llama(3, vocab_size=VOCAB, max_position_embeddings=128).save_pretrained(tmp_path)
    backend = TorchBackend(TorchBackendConfig(model=str(tmp_path), device="cpu", lora={"rank": 0}))
    try:
        sampler = backend.sampler()
        sampler.sample_many([request(prompt_of(30), max_tokens=4, seed=1)])
        assert len(sampler._prefixes) == 1
        backend.forward_backward(
            random_datums(0, (7, 5), vocab=VOCAB), Objective.of(Reinforce(ReinforceLossConfig()))
        )
        assert len(sampler._prefixes) == 0
    finally:
        backend.close()
