"""The trainer's state on disk: one folder per checkpoint.

Layout:

- ``weights.safetensors``: the trainable parameters under their module names (only the adapter
  weights with LoRA; every parameter for full training).
- ``trainer.pt``: optimizer and scheduler state dicts and the random generators' states
  (Python, torch CPU, and every CUDA device when CUDA is initialized).
- ``state.json``: format version, counters (optimizer steps, weight version) and the identity
  of the model the state belongs to. A folder without it is not a checkpoint.
- ``adapter/`` (LoRA only): the same adapters as a PEFT adapter folder (``adapter_config.json``,
  ``adapter_model.safetensors``) over the base model folder, written by the backend after the
  rest (:data:`ADAPTER_DIR`), for peft and model servers; loading never reads it.

Loading checks the identity first and refuses a state saved for another model, another LoRA
shape or another dtype, naming both.

A weights folder (:func:`write_weights`, a policy release) holds only ``weights.safetensors``,
with the format, the identity and the weight version in the file's own metadata.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from rllm_trainer_backend_torch.checkpoint_files import (
    ADAPTER_DIR,
    FORMAT,
    SHARDED,
    STATE,
    TRAINER,
    WEIGHTS,
    CheckpointError,
    check_format,
    check_identity,
    describe,
    digest,
    read_state_file,
    rng_state,
    set_rng_state,
    write_state_file,
)
from rllm_trainer_backend_torch.sharded import read_full, to_indexed

__all__ = [
    "ADAPTER_DIR",
    "FORMAT",
    "CheckpointError",
    "describe",
    "read_state",
    "read_weights",
    "write_state",
    "write_weights",
]


def write_state(
    folder: str | os.PathLike[str],
    *,
    parameters: Mapping[str, torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    identity: Mapping[str, Any],
    counters: Mapping[str, int],
) -> None:
    """Write a checkpoint into ``folder`` (created if needed; files of an older one are
    replaced)."""
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    (target / STATE).unlink(missing_ok=True)
    weights = {name: param.detach().contiguous().cpu() for name, param in parameters.items()}
    save_file(weights, str(target / WEIGHTS))
    torch.save(
        {
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": rng_state(),
        },
        target / TRAINER,
    )
    write_state_file(
        target,
        {
            "format": FORMAT,
            "counters": dict(counters),
            "identity": dict(identity),
            "digest": digest(identity),
        },
    )


def read_state(
    folder: str | os.PathLike[str],
    *,
    parameters: Mapping[str, torch.nn.Parameter],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    identity: Mapping[str, Any],
) -> dict[str, int]:
    """Restore a checkpoint written by :func:`write_state` into the given objects, in place,
    and return its counters. Raises :class:`CheckpointError` when the folder is not a
    checkpoint or its identity differs from ``identity``."""
    source = Path(folder)
    state = read_state_file(source)
    check_format(source, state)
    check_identity(source, state.get("identity", {}), identity)
    if state.get("layout") == SHARDED:
        # A sharded checkpoint (several processes wrote it) read whole into this process.
        state, weights, named = read_full(source)
        _check_tensors(source, weights, parameters)
        trainer = torch.load(source / TRAINER, map_location="cpu", weights_only=True)
        trainer["optimizer"] = to_indexed(named, list(parameters))
    else:
        weights = _load_weights(source, parameters)
        trainer = torch.load(source / TRAINER, map_location="cpu", weights_only=True)
    with torch.no_grad():
        for name, param in parameters.items():
            param.copy_(weights[name])
    optimizer.load_state_dict(trainer["optimizer"])
    scheduler.load_state_dict(trainer["scheduler"])
    set_rng_state(trainer["rng"])
    return {key: int(value) for key, value in state["counters"].items()}


def write_weights(
    folder: str | os.PathLike[str],
    *,
    parameters: Mapping[str, torch.nn.Parameter],
    identity: Mapping[str, Any],
    version: int,
) -> None:
    """Write the trainable ``parameters`` of weight version ``version`` into ``folder``."""
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    weights = {name: param.detach().contiguous().cpu() for name, param in parameters.items()}
    metadata = {
        "format": str(FORMAT),
        "identity": json.dumps(dict(identity), sort_keys=True),
        "weight_version": str(version),
    }
    temporary = target / (WEIGHTS + ".tmp")
    save_file(weights, str(temporary), metadata=metadata)
    temporary.replace(target / WEIGHTS)


def read_weights(
    folder: str | os.PathLike[str],
    *,
    parameters: Mapping[str, torch.nn.Parameter],
    identity: Mapping[str, Any],
) -> None:
    """Copy the weights :func:`write_weights` saved into ``parameters``, in place. Raises
    :class:`CheckpointError` (changing nothing) when the folder holds no weights or weights
    of another model, dtype or shape."""
    source = Path(folder)
    file = source / WEIGHTS
    if not file.is_file():
        raise CheckpointError(
            f"{source} holds no policy weights (no {WEIGHTS}); give the folder that"
            " save_weights wrote"
        )
    with safe_open(str(file), framework="pt") as handle:
        metadata = handle.metadata() or {}
    if metadata.get("format") != str(FORMAT) or "identity" not in metadata:
        raise CheckpointError(
            f"{file} is not a weights file of format {FORMAT} (its metadata: format"
            f" {metadata.get('format')!r}); save it with this version's save_weights"
        )
    check_identity(source, json.loads(metadata["identity"]), identity)
    weights = _load_weights(source, parameters)
    with torch.no_grad():
        for name, param in parameters.items():
            param.copy_(weights[name])


def _load_weights(
    source: Path, parameters: Mapping[str, torch.nn.Parameter]
) -> dict[str, torch.Tensor]:
    weights = load_file(str(source / WEIGHTS))
    _check_tensors(source, weights, parameters)
    return weights


def _check_tensors(
    source: Path, weights: Mapping[str, torch.Tensor], parameters: Mapping[str, torch.nn.Parameter]
) -> None:
    if set(weights) != set(parameters) or any(
        weights[name].shape != param.shape for name, param in parameters.items()
    ):
        raise CheckpointError(
            f"{source}/{WEIGHTS} holds {len(weights)} tensors whose names or shapes differ from"
            f" the {len(parameters)} parameters this backend trains; the file is damaged or"
            " from another model"
        )
