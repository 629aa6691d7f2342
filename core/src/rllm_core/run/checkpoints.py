"""Checkpoints of a run: ``checkpoints/step-N/`` holds ``trainer/`` (the backend's
``save_state``) and ``loop.json`` (:class:`~rllm_core.run.state.LoopState`).

A checkpoint is written into ``step-N.partial/`` and renamed when complete, so an interrupted
save never leaves a folder that looks finished.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from rllm_core.run.folder import write_json
from rllm_core.run.state import LoopState

__all__ = ["TRAINER_DIR", "latest_checkpoint", "load_checkpoint", "save_checkpoint"]

LOOP_FILE = "loop.json"
TRAINER_DIR = "trainer"
_STEP = re.compile(r"^step-(\d+)$")


def save_checkpoint(checkpoints: Path, trainer: Any, state: LoopState) -> Path:
    """Save ``trainer`` and ``state`` as ``checkpoints/step-<state.step>``; returns the folder."""
    final = checkpoints / f"step-{state.step}"
    partial = checkpoints / f"step-{state.step}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    trainer.save_state(str(partial / TRAINER_DIR))
    write_json(partial / LOOP_FILE, state.to_dict())
    if final.exists():
        shutil.rmtree(final)
    partial.rename(final)
    return final


def latest_checkpoint(checkpoints: Path) -> Path | None:
    """The complete checkpoint with the highest step, or None."""
    if not checkpoints.is_dir():
        return None
    found = []
    for child in checkpoints.iterdir():
        match = _STEP.match(child.name)
        if match and (child / LOOP_FILE).is_file():
            found.append((int(match.group(1)), child))
    return max(found)[1] if found else None


def load_checkpoint(folder: Path, trainer: Any) -> LoopState:
    """Restore ``trainer`` from ``folder`` and return the loop state saved with it."""
    trainer.load_state(str(folder / TRAINER_DIR))
    return LoopState.from_dict(json.loads((folder / LOOP_FILE).read_text(encoding="utf-8")))
