"""The ``datasets`` task source: question/answer tasks from local parquet, arrow or JSON-lines
files, read with ``datasets.load_dataset``.

The keys, field mapping, splits, checks and reward functions are those the ``jsonl`` source
has too (:mod:`rllm_core.kit.qa_tasks`); a row stands where the jsonl source has a line,
numbered from 1 in each file or folder (``file:row``). Tasks carry ``source = "datasets"``.
Every file is read and checked when the source is built. Nothing is downloaded: ``path`` and
``eval_path`` name files on this machine.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rllm_core.errors import TaskProblem
from rllm_core.kit.qa_tasks import QATaskSource

from rllm_task_source_datasets.plugin import FORMATS, DatasetsTasksConfig

__all__ = ["DatasetsTaskSource"]


class DatasetsTaskSource(QATaskSource):
    """Implements :class:`~rllm_core.ports.TaskSource` over files ``datasets`` reads; see
    :class:`~rllm_core.kit.qa_tasks.QATaskSource` for splits, ids and grading."""

    source_name = "datasets"
    config: DatasetsTasksConfig

    def _rows(self, path: Path, problems: list[TaskProblem]) -> list[tuple[int, dict[str, Any]]]:
        files = self._files(path, problems)
        if not files:
            return []
        builder = self._builder(path, files, problems)
        if builder is None:
            return []
        os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
        import datasets

        try:
            table = datasets.load_dataset(
                builder, data_files=[str(f) for f in files], split="train"
            )
        except Exception as exc:  # datasets raises many kinds for a file it cannot read
            problems.append(
                TaskProblem(
                    task=str(path),
                    field="path",
                    message=f"datasets could not read it as {builder}: {type(exc).__name__}: {exc}",
                )
            )
            return []
        rows = [(number, dict(row)) for number, row in enumerate(table, start=1)]
        if not rows:
            problems.append(
                TaskProblem(task=str(path), field="path", message="the dataset holds no rows")
            )
        return rows

    @staticmethod
    def _files(path: Path, problems: list[TaskProblem]) -> list[Path]:
        if path.is_file():
            return [path]
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in FORMATS)
            if not files:
                problems.append(
                    TaskProblem(
                        task=str(path),
                        field="path",
                        message=f"the folder holds no {', '.join(sorted(FORMATS))} files",
                    )
                )
            return files
        problems.append(
            TaskProblem(task=str(path), field="path", message="file not found; check the path")
        )
        return []

    def _builder(self, path: Path, files: list[Path], problems: list[TaskProblem]) -> str | None:
        if self.config.format != "auto":
            return self.config.format
        builders = {FORMATS.get(f.suffix) for f in files}
        if len(builders) == 1 and None not in builders:
            return builders.pop()
        problems.append(
            TaskProblem(
                task=str(path),
                field="format",
                message="format 'auto' needs files of one kind named .parquet, .arrow, .jsonl"
                f" or .json, got {', '.join(sorted({f.suffix or '(none)' for f in files}))};"
                " set format",
            )
        )
        return None
