"""The tiny random Llama the torch backend's tests build, one definition for every test file,
and the sampler fixtures of the sampler tests, over the ``model`` their module defines."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny_llama() -> Callable[..., Any]:
    """``tiny_llama(seed=..., **config)``: a seeded random two-layer Llama in eval mode, small
    enough that a step takes milliseconds; keyword arguments override its ``LlamaConfig``
    (``vocab_size``, ``max_position_embeddings``, ``hidden_size`` ...)."""

    def build(seed: int = 0, **overrides: Any) -> Any:
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        values = {
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "vocab_size": 512,
            "max_position_embeddings": 1024,
        } | overrides
        torch.manual_seed(seed)
        return LlamaForCausalLM(LlamaConfig(**values)).eval()

    return build


@pytest.fixture
def gate() -> Any:
    from rllm_trainer_backend_torch.gate import WeightGate

    return WeightGate()


@pytest.fixture
def make_sampler(model: Any, gate: Any) -> Iterator[Callable[..., Any]]:
    """``make_sampler(module=None, **options)``: a ``TorchSampler`` over ``module`` (the
    module's ``model`` by default) sharing ``gate``; closed after the test."""
    from rllm_trainer_backend_torch.sampler import TorchSampler

    made: list[TorchSampler] = []

    def make(module: Any = None, **options: Any) -> TorchSampler:
        sampler = TorchSampler(module if module is not None else model, gate=gate, **options)
        made.append(sampler)
        return sampler

    yield make
    for sampler in made:
        sampler.close()


@pytest.fixture
def sampler(make_sampler: Callable[..., Any]) -> Any:
    return make_sampler()


@pytest.fixture
def recorder(model: Any) -> Iterator[Any]:
    from rllm_trainer_backend_torch.testing import ForwardRecorder

    hook = ForwardRecorder(model)
    yield hook
    hook.remove()
