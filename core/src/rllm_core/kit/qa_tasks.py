"""Question/answer task sources: the keys, the checks and the grading that sources of
question/answer rows share (``[tasks] name = "jsonl"``, ``name = "datasets"``).

A source subclasses :class:`QATasksConfig` for its keys and :class:`QATaskSource` for its
reader (:meth:`QATaskSource._rows`). Its files are read and checked when it is built, so a bad
dataset fails before a run starts: every problem (a row that is not an object, a missing or
mistyped field, a duplicate id) is collected and raised together as a
:class:`~rllm_core.errors.TaskFormatError` whose problems name ``file:row`` and the field.

A task built from a row has ``instruction`` = the question, ``source`` = the source's name,
``data = {"answer": ..., "reward": ...}`` (plus ``"system_prompt"`` when configured),
``metadata = {"split": ..., "file": ..., "line": <row number>}`` and no sandbox environment.
Rewards are those of :mod:`rllm_core.kit.answers`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rllm_core.errors import TaskFormatError, TaskProblem
from rllm_core.kit.answers import REWARDS, Score, parse_number
from rllm_core.ports.sandboxes import Sandbox
from rllm_core.types import Grade, HarnessOutcome, Task

__all__ = ["QATaskSource", "QATasksConfig"]


class QATasksConfig(BaseModel):
    """The keys every question/answer task source takes (``[tasks] name = "jsonl"``, ...):
    where the rows are, which fields hold what, and the reward. A source subclasses it,
    redescribing ``path`` and ``eval_path`` for its files and adding its own keys."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Path = Field(
        description="the file of tasks, one per row: the train split, or every split when"
        " split_field is set; relative paths are read from the plan's folder"
    )
    eval_path: Path | None = Field(
        default=None,
        description="the file of the eval split (cannot be combined with split_field)",
    )
    split_field: str | None = Field(
        default=None,
        description="field of each row naming its split (e.g. 'split'); the splits are the"
        " values found in path",
    )
    id_field: str = Field(
        default="id",
        description="field holding the task id; a row without it gets '<file stem>-<row>'",
    )
    question_field: str = Field(default="question", description="field holding the question")
    answer_field: str = Field(
        default="answer", description="field holding the expected answer (string or number)"
    )
    reward: Literal["exact", "numeric", "boxed"] = Field(
        default="exact",
        description="how a reply is compared with the answer: exact (whole reply, stripped,"
        " case-sensitive), numeric (last number in the reply) or boxed (last \\boxed{})",
    )
    tolerance: float = Field(
        default=1e-6,
        ge=0.0,
        description="absolute tolerance of the numeric and boxed comparisons",
    )
    first_number_credit: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="numeric only: reward when the last number is wrong but the first number"
        " of the reply is right (0 turns partial credit off)",
    )
    system_prompt: str | None = Field(
        default=None,
        description="system prompt stored in every task as data['system_prompt'] for the"
        " harness to send",
    )
    limit: int | None = Field(
        default=None, ge=1, description="keep only the first N tasks of each split"
    )

    @model_validator(mode="after")
    def _check_combinations(self) -> QATasksConfig:
        if self.eval_path is not None and self.split_field is not None:
            raise ValueError(
                "set either eval_path (one file per split) or split_field (one file with a"
                " split column), not both"
            )
        if self.first_number_credit > 0.0 and self.reward != "numeric":
            raise ValueError(
                f"first_number_credit applies to reward = 'numeric', not {self.reward!r};"
                " remove it or switch the reward"
            )
        return self


class QATaskSource:
    """Implements :class:`~rllm_core.ports.TaskSource` over the rows of one or two files; a
    subclass reads them (:meth:`_rows`) and names itself (:attr:`source_name`).

    Splits: without ``split_field``, ``"train"`` is ``path`` and ``"eval"`` is ``eval_path``
    (when set). With ``split_field``, each row's value of that field names its split. Task ids
    are unique across the whole source. ``grade`` compares ``outcome.answer`` (``None`` counts
    as an empty reply) with the task's answer using the configured reward function and
    returns the ``parsed`` signal (1.0 when the reply held something to compare).
    """

    source_name = "qa"
    """The name tasks carry as ``Task.source`` and errors call the source by."""

    def __init__(self, config: QATasksConfig) -> None:
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
    def _scorer(config: QATasksConfig) -> Callable[[str, str], Score]:
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
        """The rows of ``path`` as ``(row number from 1, object)``; what is wrong with the file
        goes to ``problems`` (naming ``path``), which the source raises together."""
        raise NotImplementedError

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
