"""Turn a GGUF file into a normal local Hugging Face model folder with transformers:
de-quantized safetensors weights, ``config.json``, ``generation_config.json`` and the tokenizer.

torch, transformers, gguf and accelerate are imported only while a conversion runs; when one
is missing, :class:`~rllm_core.errors.AssetError` says to install ``rllm-trainer-backend-torch``,
which depends on all of them. Nothing here reaches a model hub (``HF_HUB_OFFLINE=1``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rllm_core.errors import AssetError

__all__ = ["convert_gguf_model", "save_gguf_tokenizer"]

_MODEL_MODULES = ("torch", "transformers", "gguf", "accelerate")
_TOKENIZER_MODULES = ("transformers", "gguf")
# Keys transformers adds to a GGUF-loaded config that must not reach the saved folder: the
# quantization entry would make every later load look for the GGUF file again.
_GGUF_CONFIG_KEYS = ("quantization_config", "_model_name_or_path", "_name_or_path")


def convert_gguf_model(gguf: Path, out: Path, *, dtype: str = "float32") -> dict[str, Any]:
    """Load ``gguf`` with transformers, de-quantize it to ``dtype``, save the weights, config,
    generation config and tokenizer into the existing folder ``out``, then load ``out`` again
    and check that every tensor equals the converted one.

    Returns facts for the manifest: ``architecture``, ``parameters``, ``dtype`` and the
    ``transformers`` version. Raises :class:`AssetError` when a package is missing, the file
    cannot be read, or the reloaded folder differs.
    """
    _require(f"converting {gguf.name}", _MODEL_MODULES)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise AssetError(f"dtype {dtype!r} is not a torch dtype; use float32, bfloat16 or float16")
    try:
        loaded = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch_dtype, local_files_only=True
        )
    except (ImportError, OSError, ValueError) as exc:
        raise AssetError(
            f"transformers {transformers.__version__} could not load {gguf}: {exc}; install"
            " rllm-trainer-backend-torch for versions that can"
            " (pip install rllm-trainer-backend-torch)"
        ) from exc
    # transformers refuses save_pretrained on a GGUF-loaded model, so the weights move into a
    # plain model built from the same config, minus the GGUF entries.
    settings = loaded.config.to_dict()
    for key in _GGUF_CONFIG_KEYS:
        settings.pop(key, None)
    config = type(loaded.config).from_dict(settings)
    model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    try:
        model.load_state_dict(loaded.state_dict(), strict=True)
    except RuntimeError as exc:
        raise AssetError(
            f"the weights in {gguf.name} do not fit the {type(model).__name__} built from its"
            f" own config: {exc}"
        ) from exc
    model.generation_config = loaded.generation_config
    del loaded
    model.save_pretrained(str(out))
    save_gguf_tokenizer(gguf, out)

    reloaded = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    expected = model.state_dict()
    got = reloaded.state_dict()
    differing = sorted(
        key
        for key in expected.keys() | got.keys()
        if key not in expected
        or key not in got
        or got[key].dtype != expected[key].dtype
        or not torch.equal(got[key], expected[key])
    )
    if differing:
        raise AssetError(
            f"the folder saved from {gguf.name} loads different weights than were converted"
            f" ({', '.join(differing[:5])}); report this with transformers"
            f" {transformers.__version__} and torch {torch.__version__}"
        )
    return {
        "architecture": type(model).__name__,
        "parameters": sum(p.numel() for p in model.parameters()),
        "dtype": dtype,
        "transformers": transformers.__version__,
    }


def save_gguf_tokenizer(gguf: Path, out: Path) -> None:
    """Read the tokenizer and chat template stored in ``gguf`` and save them into ``out`` as
    ``tokenizer.json`` and ``tokenizer_config.json`` (plus ``chat_template.jinja`` where
    transformers writes one), loadable by transformers 4 and 5 alike.

    Raises :class:`AssetError` when a package is missing or the file has no chat template.
    """
    _require(f"reading the tokenizer in {gguf.name}", _TOKENIZER_MODULES)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, local_files_only=True
        )
    except ImportError as exc:
        raise AssetError(
            f"reading the tokenizer in {gguf.name} failed: {exc};"
            " pip install rllm-trainer-backend-torch"
        ) from exc
    if not tokenizer.chat_template:
        raise AssetError(f"{gguf.name} carries no chat template")
    tokenizer.save_pretrained(str(out))
    # transformers 5 names its own backend class and keeps the template in a side file; name
    # the class every version knows and put the template in the config too, so that older
    # transformers load the folder the same way.
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    for key in ("is_local", "local_files_only"):
        config.pop(key, None)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["chat_template"] = tokenizer.chat_template
    config_path.write_text(
        json.dumps(config, ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
    )


def _require(purpose: str, modules: Sequence[str]) -> None:
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise AssetError(
            f"{purpose} needs {', '.join(modules)}; not installed in {sys.executable}:"
            f" {', '.join(missing)}; pip install rllm-trainer-backend-torch"
        )
