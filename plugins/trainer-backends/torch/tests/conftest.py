"""The tiny random Llama the torch backend's tests build, one definition for every test file."""

from __future__ import annotations

from collections.abc import Callable
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
