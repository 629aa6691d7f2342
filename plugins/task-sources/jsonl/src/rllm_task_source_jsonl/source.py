"""The ``jsonl`` task source: question/answer tasks read from JSON-lines files.

Every non-blank line of a file is one JSON object, one task. The keys, the checks, the tasks
and the grading are those every question/answer source shares
(:mod:`rllm_core.kit.qa_tasks`); problems name ``file:line`` and the field. Tasks carry
``source = "jsonl"``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rllm_core.errors import TaskProblem
from rllm_core.kit.qa_tasks import QATaskSource

from rllm_task_source_jsonl.plugin import JsonlTasksConfig

__all__ = ["JsonlTaskSource"]

_LINE = "(line)"


class JsonlTaskSource(QATaskSource):
    """Implements :class:`~rllm_core.ports.TaskSource` over one or two JSON-lines files.

    Splits: without ``split_field``, ``"train"`` is ``path`` and ``"eval"`` is ``eval_path``
    (when set). With ``split_field``, each line's value of that field names its split. Task ids
    are unique across the whole source. ``grade`` compares ``outcome.answer`` (``None`` counts
    as an empty reply) with the task's answer using the configured reward function and
    returns the ``parsed`` signal (1.0 when the reply held something to compare).
    """

    source_name = "jsonl"
    config: JsonlTasksConfig

    def _rows(self, path: Path, problems: list[TaskProblem]) -> list[tuple[int, dict[str, Any]]]:
        """The rows of ``path`` as ``(line number, object)``; what is wrong with the file goes
        to ``problems``."""
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            problems.append(
                TaskProblem(task=str(path), field="path", message="file not found; check the path")
            )
            return []
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(TaskProblem(task=str(path), field="path", message=f"unreadable: {exc}"))
            return []
        rows = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                problems.append(TaskProblem(task=where, field=_LINE, message=f"not JSON: {exc}"))
                continue
            if not isinstance(row, dict):
                problems.append(
                    TaskProblem(
                        task=where,
                        field=_LINE,
                        message=f"expected a JSON object, got {type(row).__name__}",
                    )
                )
                continue
            rows.append((number, row))
        if not rows and not problems:
            problems.append(
                TaskProblem(task=str(path), field="path", message="the file holds no tasks")
            )
        return rows
