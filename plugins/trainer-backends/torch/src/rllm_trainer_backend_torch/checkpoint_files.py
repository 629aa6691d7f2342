"""What every trainer checkpoint folder holds, whichever process layout wrote it: the file
names, the format numbers, ``state.json`` (read and written), the identity check and the
random generators' states.

:mod:`rllm_trainer_backend_torch.checkpoint` (one process) and
:mod:`rllm_trainer_backend_torch.sharded` (several) both build on this module, and it imports
neither.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from rllm_core.errors import RllmError

__all__ = [
    "ADAPTER_DIR",
    "FORMAT",
    "SHARDED",
    "SHARDED_FORMAT",
    "STATE",
    "TRAINER",
    "WEIGHTS",
    "CheckpointError",
    "check_format",
    "check_identity",
    "describe",
    "digest",
    "read_state_file",
    "rng_state",
    "set_rng_state",
    "write_state_file",
]

FORMAT = 1
SHARDED_FORMAT = 2
SHARDED = "sharded"
WEIGHTS = "weights.safetensors"
TRAINER = "trainer.pt"
STATE = "state.json"
ADAPTER_DIR = "adapter"


class CheckpointError(RllmError, ValueError):
    """A checkpoint folder is missing, incomplete, or belongs to another model or shape."""


def describe(identity: Mapping[str, Any]) -> str:
    """One line naming what an identity describes, for error messages."""
    training = identity.get("training")
    if training == "lora":
        lora = identity.get("lora") or {}
        shape = (
            f"LoRA rank {lora.get('rank')}, alpha {lora.get('alpha')}, on"
            f" {','.join(lora.get('target_modules', []))}"
        )
    else:
        shape = "full-parameter training"
    return f"model {identity.get('model')!r} ({shape}, {identity.get('dtype')})"


def digest(identity: Mapping[str, Any]) -> str:
    """A short, stable hash of an identity."""
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def write_state_file(folder: Path, state: Mapping[str, Any]) -> None:
    """Write ``state.json`` into ``folder`` whole (a temporary file renamed over it): the
    last file of a checkpoint, whose presence makes the folder one."""
    temporary = folder / (STATE + ".tmp")
    temporary.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    temporary.replace(folder / STATE)


def read_state_file(source: Path) -> dict[str, Any]:
    """``source``'s ``state.json``. Raises :class:`CheckpointError` when there is none (the
    folder is not a checkpoint)."""
    state_file = source / STATE
    if not state_file.is_file():
        raise CheckpointError(
            f"{source} is not a trainer checkpoint (no {STATE}); give the folder that"
            " save_state wrote"
        )
    return json.loads(state_file.read_text(encoding="utf-8"))


def check_format(source: Path, state: Mapping[str, Any]) -> None:
    """Raise :class:`CheckpointError` unless ``state`` (``source``'s ``state.json``) has the
    format this version reads for its layout (sharded or single-process)."""
    if state.get("layout") == SHARDED:
        if state.get("format") != SHARDED_FORMAT:
            raise CheckpointError(
                f"{source} holds sharded checkpoint format {state.get('format')!r}; this"
                f" version of rllm-trainer-backend-torch reads format {SHARDED_FORMAT}"
            )
    elif state.get("format") != FORMAT:
        raise CheckpointError(
            f"{source} holds checkpoint format {state.get('format')!r}; this version of"
            f" rllm-trainer-backend-torch reads format {FORMAT} (and sharded checkpoints)"
        )


def check_identity(source: Path, saved: Mapping[str, Any], identity: Mapping[str, Any]) -> None:
    """Raise :class:`CheckpointError`, naming both and the keys that differ, when the
    identity ``source`` was ``saved`` for is not ``identity``."""
    if dict(saved) != dict(identity):
        differing = sorted(
            key for key in {*saved, *identity} if saved.get(key) != identity.get(key)
        )
        raise CheckpointError(
            f"{source} was saved for {describe(saved)}, but this backend trains"
            f" {describe(identity)} (differing: {', '.join(differing)}); build the backend with"
            " the checkpoint's settings or start from scratch"
        )


def rng_state() -> dict[str, Any]:
    """The random generators' states: Python's, torch's CPU one and, when CUDA is
    initialized, every CUDA device's."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what :func:`rng_state` returned (after a round trip through ``torch.save``)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
