"""The state folder of a Tinker checkpoint: one small JSON file naming Tinker's checkpoint.

The weights and the optimizer state stay on Tinker; the folder records their ``tinker://``
path, what they must match to load (base model and LoRA shape) and the backend's counters.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rllm_core.errors import RllmError

__all__ = ["STATE_FILE", "CheckpointError", "read_state", "write_state"]

STATE_FILE = "tinker_state.json"
_FORMAT = 1


class CheckpointError(RllmError, ValueError):
    """A state folder is missing, unreadable, or belongs to another base model or LoRA shape."""


def write_state(
    folder: str | os.PathLike[str],
    *,
    tinker_path: str,
    identity: Mapping[str, Any],
    counters: Mapping[str, int],
) -> Path:
    """Write ``tinker_state.json`` into ``folder`` (created when missing), atomically."""
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    record = {
        "format": _FORMAT,
        "tinker_path": tinker_path,
        "identity": dict(identity),
        "counters": dict(counters),
    }
    path = target / STATE_FILE
    partial = target / f".{STATE_FILE}.partial"
    partial.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(partial, path)
    return path


def read_state(
    folder: str | os.PathLike[str], *, identity: Mapping[str, Any]
) -> tuple[str, dict[str, int]]:
    """The Tinker path and counters saved in ``folder``; raises :class:`CheckpointError` when
    the file is missing or malformed, or its identity differs from ``identity``."""
    path = Path(folder) / STATE_FILE
    if not path.is_file():
        raise CheckpointError(
            f"{path} does not exist; pass a folder written by the tinker backend's save_state"
        )
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        tinker_path = record["tinker_path"]
        saved_identity = record["identity"]
        counters = {
            "optimizer_steps": int(record["counters"]["optimizer_steps"]),
            "weight_version": int(record["counters"]["weight_version"]),
        }
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"{path} is not a valid tinker state file ({exc}); save the state again"
        ) from exc
    if record.get("format") != _FORMAT:
        raise CheckpointError(
            f"{path} has format {record.get('format')!r}; this backend reads format {_FORMAT}"
        )
    if not isinstance(tinker_path, str) or not tinker_path.startswith("tinker://"):
        raise CheckpointError(f"{path} names {tinker_path!r}, which is not a tinker:// path")
    if isinstance(saved_identity, dict) and "base_model" in saved_identity:
        # Folders saved before the key was renamed name the model base_model.
        saved_identity = {
            ("model" if key == "base_model" else key): value
            for key, value in saved_identity.items()
        }
    if saved_identity != dict(identity):
        raise CheckpointError(
            f"{path} was saved by a backend with {_describe(saved_identity)}, but this one has"
            f" {_describe(identity)}; build the backend with the checkpoint's settings"
        )
    return tinker_path, counters


def _describe(identity: Mapping[str, Any]) -> str:
    return ", ".join(f"{key}={identity[key]!r}" for key in sorted(identity))
