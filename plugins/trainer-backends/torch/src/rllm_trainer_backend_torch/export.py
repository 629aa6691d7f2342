"""The policy as model servers load it: a PEFT adapter folder (LoRA), or a transformers model
folder (full training, or LoRA merged into the base weights), written whole or not at all."""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from rllm_core.types import ExportedWeights

__all__ = ["SERVED_FILES", "TOKENIZER_FILES", "export_policy"]

SERVED_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)
"""Files of the base model folder that a full export carries over when the model's own
``save_pretrained`` did not write them: what a server needs to tokenize and to apply the chat
template."""

TOKENIZER_FILES = tuple(name for name in SERVED_FILES if name != "generation_config.json")
"""The files of :data:`SERVED_FILES` that make up the tokenizer and its chat template."""


def export_policy(
    model: torch.nn.Module,
    path: str | os.PathLike[str],
    *,
    version: int,
    base_model: Path,
    lora_rank: int,
    state_dict: Mapping[str, torch.Tensor] | None = None,
    merge: bool = False,
    tokenizer: bool = True,
) -> ExportedWeights:
    """Write ``model`` into the folder ``path`` and describe it.

    A peft model (``lora_rank > 0``) writes its adapters with peft's ``save_pretrained``
    (``adapter_config.json``, ``adapter_model.safetensors``), their base being ``base_model``,
    plus the :data:`TOKENIZER_FILES` of ``base_model`` when ``tokenizer`` is true. With
    ``merge`` it writes instead a copy of the model with the adapters merged into the base
    weights (peft's ``merge_and_unload``; ``model`` itself is not changed), as a plain model. A
    plain transformers model writes ``config.json`` and safetensors weights, plus the
    :data:`SERVED_FILES` of ``base_model``, so the folder loads on its own with
    ``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained``.
    ``state_dict`` replaces the model's own (the whole, unsharded tensors, when the parameters
    are sharded across processes); it cannot be merged.

    Everything is written into a sibling folder first, then renamed to ``path``, replacing a
    folder already there: a reader sees the old folder, or the new one complete.
    """
    if merge and lora_rank > 0 and state_dict is not None:
        raise ValueError("a merged export takes the model's own weights, not a state_dict")
    adapter = lora_rank > 0 and not merge
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        options: dict[str, Any] = {"safe_serialization": True}
        if state_dict is not None:
            options["state_dict"] = dict(state_dict)
        if adapter:
            _save_adapter(model, staging, base_model, options)
            if tokenizer:
                _copy_files(base_model, staging, TOKENIZER_FILES)
        else:
            plain = _merged_copy(model) if lora_rank > 0 else model
            plain.save_pretrained(str(staging), **options)
            _copy_files(base_model, staging, SERVED_FILES)
        _replace(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ExportedWeights(
        path=str(target),
        version=version,
        kind="lora" if adapter else "full",
        base_model=str(base_model),
        lora_rank=lora_rank if adapter else 0,
    )


def _save_adapter(
    model: torch.nn.Module, folder: Path, base_model: Path, options: dict[str, Any]
) -> None:
    from peft import PeftModel

    if not isinstance(model, PeftModel):
        raise TypeError(
            f"a LoRA export needs a peft model, got {type(model).__name__}; export with"
            " lora_rank = 0 for a plain model"
        )
    config = model.peft_config["default"]
    named = config.base_model_name_or_path
    # Servers resolve the adapter's base by this field: name the folder the backend loaded.
    config.base_model_name_or_path = str(base_model)
    try:
        model.save_pretrained(str(folder), **options)
    finally:
        config.base_model_name_or_path = named


def _merged_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A plain transformers model equal to the peft ``model`` with its adapters merged into
    the weights they adapt; ``model`` keeps its adapters."""
    from peft import PeftModel

    if not isinstance(model, PeftModel):
        raise TypeError(
            f"a merged LoRA export needs a peft model, got {type(model).__name__}; export with"
            " lora_rank = 0 for a plain model"
        )
    merged = copy.deepcopy(model).merge_and_unload()
    # The copy is what servers load: no dropout, no gradients, no peft bookkeeping.
    return merged.eval().requires_grad_(False)


def _copy_files(base_model: Path, folder: Path, names: tuple[str, ...]) -> None:
    for name in names:
        source = base_model / name
        if source.is_file() and not (folder / name).exists():
            shutil.copyfile(source, folder / name)


def _replace(staging: Path, target: Path) -> None:
    """Rename ``staging`` to ``target``; an existing ``target`` is moved aside first (a
    folder cannot be renamed over a non-empty one) and deleted after."""
    if not target.exists():
        os.replace(staging, target)
        return
    old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
    os.replace(target, old)
    try:
        os.replace(staging, target)
    except BaseException:
        os.replace(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)
