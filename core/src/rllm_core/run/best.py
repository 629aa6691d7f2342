"""The best checkpoint of a run: ``[run].keep_best`` names an evaluation metric, and the
checkpoint of the step where it was highest is kept in ``checkpoints/best/``.

``checkpoints/best/`` holds what a cut's folder holds (``trainer/``, ``loop.json``,
``manifest.json``) plus ``best.json`` (``step``, ``metric``, ``value``, and ``cut``: the cut
it was taken from, relative to ``checkpoints/``), so ``rllm-core eval --checkpoint
<run>/checkpoints/best`` and ``rllm-core checkpoints export`` take it like any checkpoint
folder. Its files are hard links to the cut's (copies where the filesystem cannot link): a
cut's files are never rewritten, and deleting the cut later leaves the best one whole. A new
best replaces the folder in two renames, so a reader sees the old best or the new one.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

from rllm_core.run.folder import write_json

__all__ = ["BEST_DIR", "BEST_FILE", "BestCheckpoint"]

BEST_DIR = "best"
BEST_FILE = "best.json"


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


class BestCheckpoint:
    """The best checkpoint under ``root`` (a run's ``checkpoints/``) by ``metric``."""

    def __init__(self, root: Path, metric: str) -> None:
        self.root = Path(root)
        self.metric = metric
        self.path = self.root / BEST_DIR
        self.record: dict[str, Any] | None = self._read()

    def _read(self) -> dict[str, Any] | None:
        try:
            record = json.loads((self.path / BEST_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return record if record.get("metric") == self.metric else None

    def improves(self, value: float | None) -> bool:
        """Whether ``value`` beats the best so far (the first finite value always does)."""
        if value is None or not math.isfinite(value):
            return False
        return self.record is None or value > float(self.record["value"])

    def keep(self, *, step: int, value: float, cut: Path) -> Path:
        """Make the checkpoint folder ``cut`` (of ``step``, where the metric was ``value``)
        the best; returns ``checkpoints/best``."""
        staging = self.root / f"{BEST_DIR}.staging"
        old = self.root / f"{BEST_DIR}.old"
        for leftover in (staging, old):
            shutil.rmtree(leftover, ignore_errors=True)
        shutil.copytree(cut, staging, copy_function=_link_or_copy)
        try:
            where = cut.resolve().relative_to(self.root.resolve()).as_posix()
        except ValueError:
            where = str(cut)
        record = {"step": step, "metric": self.metric, "value": value, "cut": where}
        write_json(staging / BEST_FILE, record)
        if self.path.exists():
            self.path.rename(old)
        staging.rename(self.path)
        shutil.rmtree(old, ignore_errors=True)
        self.record = record
        return self.path
