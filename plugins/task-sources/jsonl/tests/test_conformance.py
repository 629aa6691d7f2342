"""The jsonl task source against the core's task source conformance suite, over train and eval
files and over one file split by a field; and the suite shown to reject sources that break
the port's rules."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from rllm_core.testing.suites.task_sources import GradeCase, TaskSourceConformance
from rllm_core.types import Grade, HarnessOutcome, Task, Termination
from rllm_task_source_jsonl.plugin import JsonlTasksConfig
from rllm_task_source_jsonl.source import JsonlTaskSource

ROWS = [
    {"id": "a", "question": "What is 2 + 3?", "answer": "5", "split": "train"},
    {"id": 7, "question": "What is 9 - 4?", "answer": 5, "split": "train"},
    {"question": "What is 1 + 1?", "answer": 2, "split": "train"},
    {"id": "e1", "question": "What is 6 + 6?", "answer": "12", "split": "eval"},
]


def write_lines(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def done(answer: str | None) -> HarnessOutcome:
    return HarnessOutcome(termination=Termination.DONE, answer=answer)


GRADE_CASES = [
    GradeCase("a", done("5"), reward=1.0),
    GradeCase("a", done("4"), reward=0.0),
    GradeCase("7", done(None), reward=0.0),
    GradeCase("e1", done("The answer is 12"), reward=1.0, split="eval"),
]


class TestJsonlTrainAndEvalFiles(TaskSourceConformance):
    task_splits = ("train", "eval")

    @pytest.fixture
    def rebuild_task_source(self, tmp_path: Path) -> Callable[[], JsonlTaskSource]:
        train = write_lines(tmp_path / "train.jsonl", ROWS[:3])
        evaluation = write_lines(tmp_path / "eval.jsonl", ROWS[3:])
        config = JsonlTasksConfig(path=train, eval_path=evaluation, reward="numeric")
        return lambda: JsonlTaskSource(config)

    @pytest.fixture
    def grade_cases(self) -> list[GradeCase]:
        return GRADE_CASES


class TestJsonlSplitField(TaskSourceConformance):
    task_splits = ("train", "eval")

    @pytest.fixture
    def rebuild_task_source(self, tmp_path: Path) -> Callable[[], JsonlTaskSource]:
        path = write_lines(tmp_path / "all.jsonl", ROWS)
        config = JsonlTasksConfig(path=path, split_field="split", reward="numeric")
        return lambda: JsonlTaskSource(config)


# ------------------------------------------------------------------ the suite rejects breakage

SUITE = TaskSourceConformance()
SUITE.task_splits = ("train", "eval")


@pytest.fixture
def rebuild(tmp_path: Path) -> Callable[[], JsonlTaskSource]:
    train = write_lines(tmp_path / "train.jsonl", ROWS[:3])
    evaluation = write_lines(tmp_path / "eval.jsonl", ROWS[3:])
    config = JsonlTasksConfig(path=train, eval_path=evaluation, reward="numeric")
    return lambda: JsonlTaskSource(config)


class Wrapped:
    """Delegates to a working source; subclasses break one rule."""

    def __init__(self, inner: JsonlTaskSource) -> None:
        self.inner = inner

    def tasks(self, split: str = "train") -> Sequence[Task]:
        return self.inner.tasks(split)

    async def grade(self, task: Task, outcome: HarnessOutcome, sandbox: Any) -> Grade:
        return await self.inner.grade(task, outcome, sandbox)


class Rotating(Wrapped):
    """Starts each listing one task further on."""

    calls = 0

    def tasks(self, split: str = "train") -> Sequence[Task]:
        tasks = list(self.inner.tasks(split))
        self.calls += 1
        shift = self.calls % len(tasks)
        return tasks[shift:] + tasks[:shift]


class EmptyForUnknownSplits(Wrapped):
    def tasks(self, split: str = "train") -> Sequence[Task]:
        return self.inner.tasks(split) if split in ("train", "eval") else []


class SharedIds(Wrapped):
    """Numbers tasks within each split, so the eval split reuses train's ids."""

    def tasks(self, split: str = "train") -> Sequence[Task]:
        tasks = self.inner.tasks(split)
        return [Task(task_id=f"t{i}", instruction=t.instruction) for i, t in enumerate(tasks)]


class SilentZero(Wrapped):
    """Lists a task without an answer, which the verifier cannot grade, and turns the error
    into a reward of 0."""

    def tasks(self, split: str = "train") -> Sequence[Task]:
        return [*self.inner.tasks(split), Task(task_id=f"{split}-no-answer", instruction="?")]

    async def grade(self, task: Task, outcome: HarnessOutcome, sandbox: Any) -> Grade:
        try:
            return await self.inner.grade(task, outcome, sandbox)
        except ValueError:
            return Grade(reward=0.0)


class SyncPrepare(Wrapped):
    def prepare(self, task: Task, sandbox: Any) -> None:
        return None


def test_catches_an_unstable_order(rebuild) -> None:
    with pytest.raises(AssertionError, match="split 'train': a second call lists"):
        SUITE.test_order_is_stable_across_calls_and_rebuilds(
            Rotating(rebuild()), lambda: Rotating(rebuild())
        )


def test_catches_an_unknown_split_that_is_not_a_key_error(rebuild) -> None:
    with pytest.raises(pytest.fail.Exception, match="an unknown split raises KeyError"):
        SUITE.test_an_unknown_split_raises_key_error(EmptyForUnknownSplits(rebuild()))


def test_catches_ids_repeated_across_splits(rebuild) -> None:
    with pytest.raises(AssertionError, match="task id 't0' appears in split 'train' and again"):
        SUITE.test_every_split_holds_tasks_with_ids_unique_across_the_source(SharedIds(rebuild()))


def test_catches_a_silent_reward(rebuild) -> None:
    case = GradeCase("train-no-answer", done("5"), reward=None)
    with pytest.raises(pytest.fail.Exception, match="raise an error instead of a silent reward"):
        SUITE.test_grades_each_case(SilentZero(rebuild()), [case])


def test_catches_a_wrong_reward(rebuild) -> None:
    with pytest.raises(AssertionError, match=r"reward 1.0, expected 0.0"):
        SUITE.test_grades_each_case(rebuild(), [GradeCase("a", done("5"), reward=0.0)])


def test_catches_a_synchronous_prepare(rebuild) -> None:
    with pytest.raises(AssertionError, match="must be `async def prepare"):
        SUITE.test_prepare_when_present_is_a_coroutine_function(SyncPrepare(rebuild()))
