"""The results folder of one evaluation: ``<output_dir>/<name>-eval-<YYYYmmdd-HHMMSS>/``::

plan.toml            the plan file as written (overrides applied in plan.resolved.json)
plan.resolved.json   every resolved component and its validated config
results.jsonl        one line per task: rewards, terminations, passed, infra failures
episodes.jsonl       one line per scored attempt, as a run's (step 0): session, reward, traces
summary.json         tasks, attempts, pass@k, pass@1, mean reward, failures, wall time
traces/              the trace store (when the plan's store keeps files)
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rllm_core.evaluation.scoring import TaskResult
from rllm_core.run.folder import RunFolder, write_json
from rllm_core.run.metrics import episode_record
from rllm_core.types import Episode

__all__ = ["EvalFolder"]


class EvalFolder(RunFolder):
    """A run folder whose records are an evaluation's results."""

    @classmethod
    def create(cls, output_dir: str | Path, name: str, *, when: float | None = None) -> EvalFolder:
        """A new, empty ``<name>-eval-<timestamp>`` folder under ``output_dir``."""
        return cls(RunFolder.create(output_dir, f"{name}-eval", when=when).path)

    @property
    def results(self) -> Path:
        return self.path / "results.jsonl"

    def write_results(
        self,
        results: Sequence[TaskResult],
        summary: Mapping[str, Any],
        episodes: Sequence[Episode] = (),
    ) -> None:
        """Write ``results.jsonl`` (in task order), ``episodes.jsonl`` (one record per scored
        attempt, :func:`~rllm_core.run.metrics.episode_record` at step 0, so the folder's
        traces read as a run's) and ``summary.json``."""
        text = "".join(json.dumps(r.to_dict(), sort_keys=True) + "\n" for r in results)
        self.results.write_text(text, encoding="utf-8")
        lines = "".join(json.dumps(episode_record(0, e), sort_keys=True) + "\n" for e in episodes)
        self.episodes.write_text(lines, encoding="utf-8")
        write_json(self.summary, dict(summary))
