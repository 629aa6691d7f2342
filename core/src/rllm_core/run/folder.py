"""The run folder: where one run keeps its plan, metrics, episodes, traces and checkpoints.

Layout of ``<output_dir>/<name>-<YYYYmmdd-HHMMSS>/``::

    plan.toml            the plan file as written (overrides applied in plan.resolved.json)
    plan.resolved.json   every resolved component and its validated config
    numerics.json        what bitwise reproducibility depends on (rllm_core.numerics)
    metrics.jsonl        one JSON object per training step
    episodes.jsonl       one JSON object per scored episode
    evals.jsonl          [run].eval_every: one JSON object per evaluation (step, summary,
                         per-task results; rllm_core.evaluation.during_run)
    queue.jsonl          async pipeline: one JSON object per rollout batch put in the sample
                         buffer (rllm_core.training.pipeline.Ticket)
    traces/              the trace store (when the plan's store keeps files)
    checkpoints/         cuts of trainer and loop state (see rllm_core.run.checkpoints)
    reward.png loss.png  plots, rewritten after every step (eval.png too with eval_every)
    summary.json         written when the run ends
    run.log              library warnings and captured ``warnings`` (rllm_core.run.runlog)
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rllm_core.docs_site import docs_page
from rllm_core.numerics import NUMERICS_FILE, changed_conditions

__all__ = ["RunFolder", "folder_name"]

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def folder_name(name: str, when: float) -> str:
    """``<name>-<YYYYmmdd-HHMMSS>`` in local time, with characters outside ``[A-Za-z0-9._-]``
    of ``name`` replaced by ``-``."""
    safe = _UNSAFE.sub("-", name).strip("-.") or "run"
    return f"{safe}-{time.strftime('%Y%m%d-%H%M%S', time.localtime(when))}"


class RunFolder:
    """Paths of one run folder and the append-only record files in it."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @classmethod
    def create(cls, output_dir: str | Path, name: str, *, when: float | None = None) -> RunFolder:
        """Make a new, empty run folder; a second run started in the same second gets a
        ``-2``, ``-3`` ... suffix instead of sharing a folder."""
        base = folder_name(name, time.time() if when is None else when)
        root = Path(output_dir)
        root.mkdir(parents=True, exist_ok=True)
        suffix = 1
        while True:
            candidate = root / (base if suffix == 1 else f"{base}-{suffix}")
            try:
                candidate.mkdir()
            except FileExistsError:
                suffix += 1
                continue
            return cls(candidate)

    @classmethod
    def existing(cls, path: str | Path) -> RunFolder:
        """An existing run folder (to resume); raises ``FileNotFoundError`` naming ``path``
        when it holds no ``plan.resolved.json``."""
        folder = cls(path)
        if not folder.resolved_plan.is_file():
            raise FileNotFoundError(
                f"{str(path)!r} is not a run folder (it has no plan.resolved.json); pass the"
                " folder `rllm-core run` printed when the run started"
            )
        return folder

    @property
    def plan_file(self) -> Path:
        return self.path / "plan.toml"

    @property
    def resolved_plan(self) -> Path:
        return self.path / "plan.resolved.json"

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def queue(self) -> Path:
        return self.path / "queue.jsonl"

    @property
    def episodes(self) -> Path:
        return self.path / "episodes.jsonl"

    @property
    def traces(self) -> Path:
        return self.path / "traces"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def summary(self) -> Path:
        return self.path / "summary.json"

    @property
    def log(self) -> Path:
        return self.path / "run.log"

    @property
    def numerics(self) -> Path:
        return self.path / NUMERICS_FILE

    def record_numerics(self, current: Mapping[str, Any], *, resume: bool) -> str | None:
        """Write ``current`` (:func:`rllm_core.numerics.conditions`) for a new run. A resumed
        run keeps the file of its start and gets back a warning naming each condition that
        changed, or None when none did."""
        if resume and self.numerics.is_file():
            changes = changed_conditions(json.loads(self.numerics.read_text("utf-8")), current)
            if not changes:
                return None
            return (
                f"{self.numerics}: this resume runs under other conditions than the run's start"
                f" ({'; '.join(changes)}); its results will not be bitwise equal to an"
                f" uninterrupted run's ({docs_page('running', 'reproducibility')})"
            )
        write_json(self.numerics, current)
        return None

    def write_plan(self, plan_text: str, resolved: Mapping[str, Any]) -> None:
        """Store the plan file's text and the resolved plan."""
        self.plan_file.write_text(plan_text, encoding="utf-8")
        write_json(self.resolved_plan, resolved)

    def read_resolved(self) -> dict[str, Any]:
        return json.loads(self.resolved_plan.read_text(encoding="utf-8"))

    def append(self, path: Path, records: list[Mapping[str, Any]] | Mapping[str, Any]) -> None:
        """Append records as JSON lines and flush them, so a killed run keeps finished steps."""
        rows = [records] if isinstance(records, Mapping) else records
        if not rows:
            return
        with path.open("a", encoding="utf-8") as out:
            for row in rows:
                out.write(json.dumps(row, sort_keys=True) + "\n")

    @staticmethod
    def read_jsonl(path: Path) -> list[dict[str, Any]]:
        """Every complete line of a JSON-lines file (none when it is missing); a torn last line
        left by a killed process is skipped."""
        if not path.is_file():
            return []
        rows = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return rows

    def truncate_after(self, step: int) -> None:
        """Drop metric, episode and evaluation lines of steps after ``step`` (work a resumed
        run redoes)."""
        for path in (self.metrics, self.episodes, self.path / "evals.jsonl"):
            if path.is_file():
                self.rewrite(
                    path, [row for row in self.read_jsonl(path) if int(row["step"]) <= step]
                )

    @staticmethod
    def rewrite(path: Path, rows: list[dict[str, Any]]) -> None:
        """Replace a JSON-lines file with ``rows``."""
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(json.dumps(row, sort_keys=True) + "\n" for row in rows), "utf-8")
        tmp.replace(path)


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON through a temporary file, so readers never see half."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)
