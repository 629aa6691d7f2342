"""The ``jsonl`` task source: question/answer tasks read from JSON-lines files.

Every non-blank line of a file is one JSON object, one task. The files are read and checked
when the source is built, so a bad dataset fails before a run starts: every problem (a line
that is not JSON, a missing or mistyped field, a duplicate id) is collected and raised
together as a :class:`~rllm_core.errors.TaskFormatError` whose problems name ``file:line`` and
the field.

A task built from a line has ``instruction`` = the question, ``source = "jsonl"``,
``data = {"answer": ..., "reward": ...}`` (plus ``"system_prompt"`` when configured),
``metadata = {"split": ..., "file": ..., "line": ...}`` and no sandbox environment.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from rllm_core.errors import TaskFormatError, TaskProblem
from rllm_core.ports.sandboxes import Sandbox
from rllm_core.types import Grade, HarnessOutcome, Task

from rllm_task_source_jsonl.plugin import JsonlTasksConfig
from rllm_task_source_jsonl.rewards import REWARDS, Score, parse_number

__all__ = ["JsonlTaskSource"]

_LINE = "(line)"


class JsonlTaskSource:
    """Implements :class:`~rllm_core.ports.TaskSource` over one or two JSON-lines files.

    Splits: without ``split_field``, ``"train"`` is ``path`` and ``"eval"`` is ``eval_path``
    (when set). With ``split_field``, each line's value of that field names its split. Task ids
    are unique across the whole source. ``grade`` compares ``outcome.answer`` (``None`` counts
    as an empty reply) with the task's answer using the configured reward function and
    returns the ``parsed`` signal (1.0 when the reply held something to compare).

    Other sources of question/answer rows reuse the field mapping, the checks and the rewards
    by subclassing: they set :attr:`source_name` and read their files in :meth:`_rows`.
    """

    source_name = "jsonl"
    """The name tasks carry as ``Task.source`` and errors call the source by."""

    def __init__(self, config: JsonlTasksConfig) -> None:
        self.config = config
        self._score = self._scorer(config)
        self._splits = self._load()

    @property
    def splits(self) -> tuple[str, ...]:
        """The split names this source provides, in the order they first appear."""
        return tuple(self._splits)

    def tasks(self, split: str = "train") -> Sequence[Task]:
        try:
            return self._splits[split]
        except KeyError:
            raise KeyError(
                f"the {self.source_name} task source over {self.config.path} has no split"
                f" {split!r}; available: {', '.join(self._splits) or 'none'}"
            ) from None

    async def grade(self, task: Task, outcome: HarnessOutcome, sandbox: Sandbox | None) -> Grade:
        answer = task.data.get("answer")
        if not isinstance(answer, str):
            raise ValueError(
                f"task {task.task_id!r} has no string data['answer']; grade only tasks this"
                f" {self.source_name} source produced"
            )
        score = self._score(outcome.answer or "", answer)
        return Grade(reward=score.reward, signals={"parsed": 1.0 if score.parsed else 0.0})

    # ------------------------------------------------------------------ loading

    @staticmethod
    def _scorer(config: JsonlTasksConfig) -> Callable[[str, str], Score]:
        function = REWARDS[config.reward]
        if config.reward == "numeric":
            return partial(
                function,
                tolerance=config.tolerance,
                first_number_credit=config.first_number_credit,
            )
        if config.reward == "boxed":
            return partial(function, tolerance=config.tolerance)
        return function

    def _load(self) -> dict[str, list[Task]]:
        config = self.config
        problems: list[TaskProblem] = []
        files = [(config.path, None if config.split_field else "train")]
        if config.eval_path is not None:
            files.append((config.eval_path, "eval"))
        splits: dict[str, list[Task]] = {} if config.split_field else {"train": []}
        if config.eval_path is not None:
            splits["eval"] = []
        seen_ids: dict[str, str] = {}
        for path, fixed_split in files:
            for where, row in self._rows(path, problems):
                task = self._task(path, where, row, fixed_split, seen_ids, problems)
                if task is not None:
                    splits.setdefault(task.metadata["split"], []).append(task)
        if problems:
            raise TaskFormatError(problems)
        if config.limit is not None:
            splits = {name: tasks[: config.limit] for name, tasks in splits.items()}
        return splits

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

    def _task(
        self,
        path: Path,
        number: int,
        row: dict[str, Any],
        fixed_split: str | None,
        seen_ids: dict[str, str],
        problems: list[TaskProblem],
    ) -> Task | None:
        config = self.config
        where = f"{path}:{number}"
        found = len(problems)

        def problem(field: str, message: str) -> None:
            problems.append(TaskProblem(task=where, field=field, message=message))

        question = row.get(config.question_field)
        if not isinstance(question, str) or not question.strip():
            problem(config.question_field, f"needs a non-empty string, got {question!r}")

        answer = _answer_text(row.get(config.answer_field))
        if answer is None:
            problem(
                config.answer_field,
                f"needs a string or a number, got {row.get(config.answer_field)!r}",
            )
        elif config.reward == "numeric":
            try:
                parse_number(answer)
            except ValueError as exc:
                problem(config.answer_field, f"reward 'numeric' needs a number: {exc}")

        split = fixed_split
        if split is None:
            value = row.get(config.split_field or "")
            if isinstance(value, str) and value.strip():
                split = value
            else:
                problem(config.split_field or "", f"needs a split name, got {value!r}")

        raw_id = row.get(config.id_field)
        if raw_id is None:
            task_id = f"{path.stem}-{number}"
        elif isinstance(raw_id, (str, int)) and not isinstance(raw_id, bool) and str(raw_id):
            task_id = str(raw_id)
        else:
            task_id = ""
            problem(config.id_field, f"needs a non-empty string or an integer, got {raw_id!r}")
        if task_id:
            if task_id in seen_ids:
                problem(config.id_field, f"id {task_id!r} is already used at {seen_ids[task_id]}")
            else:
                seen_ids[task_id] = where

        if len(problems) > found:
            return None
        data: dict[str, Any] = {"answer": answer, "reward": config.reward}
        if config.system_prompt is not None:
            data["system_prompt"] = config.system_prompt
        return Task(
            task_id=task_id,
            instruction=question,
            source=self.source_name,
            data=data,
            metadata={"split": split, "file": str(path), "line": number},
        )


def _answer_text(value: Any) -> str | None:
    """The answer as text: strings as they are, integers and finite floats written out."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        return value if value.strip() else None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    return None
