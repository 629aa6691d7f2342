"""Memory the torch sampler holds: a small KV cache, dropped when the decode thread idles."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from rllm_core.types import SampleRequest, SamplingParams
from rllm_trainer_backend_torch import loading
from rllm_trainer_backend_torch.gate import WeightGate
from rllm_trainer_backend_torch.kv_cache import SlotKVCache
from rllm_trainer_backend_torch.sampler import TorchSampler


@pytest.fixture
def model(tiny_llama):
    return tiny_llama(vocab_size=128)


def request(seed: int) -> SampleRequest:
    return SampleRequest(
        prompt_token_ids=[1, 5, 9, 13], params=SamplingParams(max_tokens=6, seed=seed)
    )


def _wait(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)
    return predicate()


def test_a_short_completion_reserves_64_positions_not_256():
    cache = SlotKVCache(max_slots=8, max_positions=1024)
    cache.reserve(8, 40)
    assert cache.capacity == 64
    cache.reserve(8, 65)
    assert cache.capacity == 128


def test_release_drops_the_buffers_and_the_cache_grows_again(model):
    cache = SlotKVCache(max_slots=4, max_positions=512)
    cache.begin_prefill(0, 4)
    with torch.inference_mode():
        model(input_ids=torch.tensor([[1, 2, 3, 4]]), cache=cache, logits_to_keep=1)
    cache.end()
    assert cache.keys and cache.capacity == 64
    cache.release()
    assert cache.keys == [] and cache.values == [] and cache.capacity == 0
    cache.begin_prefill(0, 4)
    with torch.inference_mode():
        model(input_ids=torch.tensor([[1, 2, 3, 4]]), cache=cache, logits_to_keep=1)
    cache.end()
    assert len(cache.keys) == 2 and cache.keys[0].shape[2] == 64


def test_an_idle_sampler_drops_its_cache_and_trims_the_heap_then_samples_the_same(
    monkeypatch, model
):
    trims: list[str] = []
    monkeypatch.setattr(
        "rllm_trainer_backend_torch.sampler.release_free_memory",
        lambda: trims.append(threading.current_thread().name),
    )
    sampler = TorchSampler(model, gate=WeightGate(), max_batch_size=4)
    try:
        first = sampler.sample_many([request(seed) for seed in range(3)])
        assert _wait(lambda: sampler._thread is None)
        assert sampler._cache.keys == [] and sampler._cache.capacity == 0
        assert _wait(lambda: trims == ["rllm-torch-sampler"])
        again = sampler.sample_many([request(seed) for seed in range(3)])
        assert again == first
    finally:
        sampler.close()


def test_release_free_memory_runs_here():
    loading.release_free_memory()
    loading.release_free_memory()
