"""A run's checkpoints: cuts (:mod:`rllm_core.run.cuts`) in the run folder.

Every checkpoint has one format, the cut a split run's trainer writes into its object store:
the backend's ``save_state`` files, ``loop.json`` (the
:class:`~rllm_core.run.state.LoopState`) and a manifest with each file's sha256, made the
latest only once complete, and checked against the digests before anything is loaded. A
one-process run (RL or SFT) keeps its cuts in a folder object store
(:class:`~rllm_core.storage.folder_objects.FolderObjectStore`) at ``checkpoints/``, so the cut
of step ``N`` written by the run's ``i``-th process lies on disk as
``checkpoints/objects/cuts/<N:010d>-<i:06d>/`` with ``trainer/`` and ``loop.json`` in it: the
folder ``rllm-core eval --checkpoint`` and ``rllm-core checkpoints export`` take. Each process
that saves claims an incarnation first, so a resumed run never writes over what the run wrote
before it and an older process can no longer move ``LATEST``.

Runs written before cuts kept ``checkpoints/step-N/`` (``trainer/`` and ``loop.json``): they
still resume and evaluate, read as they are; new checkpoints of such a run are cuts.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rllm_core.run.cuts import (
    LOOP_FILE,
    TRAINER_DIR,
    CutRef,
    claim_incarnation,
    latest_cut,
    restore_cut,
    write_cut,
)
from rllm_core.run.state import LoopState
from rllm_core.storage.folder_objects import FolderObjectStore
from rllm_core.types import CutTrigger

__all__ = [
    "CHECKPOINT_FOLDERS",
    "TRAINER_DIR",
    "Checkpoint",
    "RunCheckpoints",
    "checkpoint_folder",
    "checkpoint_steps",
    "run_folder_of",
]

CHECKPOINT_FOLDERS = (
    "the run folder itself for its latest checkpoint, or"
    " checkpoints/objects/cuts/<step>-<incarnation> in it, or checkpoints/best (a run with"
    " [run].keep_best); checkpoints/step-N of a run written before cuts"
)
"""Where a run's checkpoint folders are, for messages that ask for one."""

_LEGACY = re.compile(r"^step-(\d+)$")
_STAGING = "staging"


@dataclass(frozen=True)
class Checkpoint:
    """One complete checkpoint: its step and the folder holding ``trainer/`` and
    ``loop.json``; ``ref`` is its cut (None for a ``step-N`` folder of an older run)."""

    step: int
    path: Path
    ref: CutRef | None = None


class RunCheckpoints:
    """The checkpoints of the run folder whose ``checkpoints/`` is ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._store: FolderObjectStore | None = None
        self._incarnation: int | None = None

    @property
    def store(self) -> FolderObjectStore:
        if self._store is None:
            self._store = FolderObjectStore(self.root)
        return self._store

    def cut_path(self, ref: CutRef) -> Path:
        """Where the cut ``ref`` lies on disk."""
        return self.root / "objects" / "cuts" / ref.name

    def save(self, trainer: Any, state: LoopState, *, trigger: CutTrigger) -> Path:
        """Write ``trainer`` and ``state`` as the cut of step ``state.step`` and make it the
        latest; returns its folder."""
        if self._incarnation is None:
            self._incarnation = claim_incarnation(self.store, "")
        staging = self.root / _STAGING
        try:
            ref = write_cut(
                self.store,
                "",
                trainer,
                state,
                trigger=trigger,
                incarnation=self._incarnation,
                workdir=staging,
            )
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return self.cut_path(ref)

    def latest(self) -> Checkpoint | None:
        """The newest complete checkpoint: the cut ``LATEST`` names or, in a run written
        before cuts, the ``step-N`` folder with the highest step; None when there is none."""
        if (self.root / "objects").is_dir():
            ref = latest_cut(self.store, "")
            if ref is not None:
                return Checkpoint(step=ref.step, path=self.cut_path(ref), ref=ref)
        legacy = _legacy(self.root)
        return max(legacy, key=lambda c: c.step) if legacy else None

    def load(self, checkpoint: Checkpoint, trainer: Any) -> LoopState:
        """Restore ``trainer`` from ``checkpoint`` (a cut's files checked against its
        digests first) and return the loop state saved with it."""
        if checkpoint.ref is None:
            trainer.load_state(str(checkpoint.path / TRAINER_DIR))
            loop = (checkpoint.path / LOOP_FILE).read_text(encoding="utf-8")
            return LoopState.from_dict(json.loads(loop))
        staging = self.root / _STAGING
        try:
            state, _ = restore_cut(self.store, "", trainer, staging, checkpoint.ref)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return state


def checkpoint_steps(root: Path) -> list[int]:
    """The steps of every complete checkpoint under ``root`` (a run's ``checkpoints/``),
    ascending: cuts with a manifest, and ``step-N`` folders of an older run."""
    steps = {c.step for c in _legacy(root)}
    cuts = root / "objects" / "cuts"
    if cuts.is_dir():
        for child in cuts.iterdir():
            name, _, _ = child.name.partition("-")
            if name.isdigit() and (child / "manifest.json").is_file():
                steps.add(int(name))
    return sorted(steps)


def checkpoint_folder(path: Path) -> Path:
    """``path`` as a checkpoint folder: a run folder (it holds ``plan.resolved.json``) means
    its latest checkpoint; any other path is taken as it is."""
    path = Path(path)
    if (path / "plan.resolved.json").is_file():
        latest = RunCheckpoints(path / "checkpoints").latest()
        if latest is not None:
            return latest.path
    return path


def run_folder_of(checkpoint: Path) -> Path | None:
    """The run folder a checkpoint folder belongs to (the nearest folder above it holding
    ``plan.resolved.json``), or None."""
    for parent in Path(checkpoint).resolve().parents:
        if (parent / "plan.resolved.json").is_file():
            return parent
    return None


def _legacy(root: Path) -> list[Checkpoint]:
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _LEGACY.match(child.name)
        if match and (child / LOOP_FILE).is_file():
            found.append(Checkpoint(step=int(match.group(1)), path=child))
    return found
