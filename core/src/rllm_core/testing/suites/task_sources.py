"""Conformance suite for task sources (the :class:`~rllm_core.ports.TaskSource` port).

Subclass the suite in a test module and provide its fixtures::

    class TestMySource(TaskSourceConformance):
        task_splits = ("train", "eval")

        @pytest.fixture
        def rebuild_task_source(self, tmp_path):
            write_my_files(tmp_path)
            return lambda: MySource(MyConfig(path=tmp_path / "train.jsonl",
                                             eval_path=tmp_path / "eval.jsonl"))

        @pytest.fixture
        def grade_cases(self):
            done = HarnessOutcome(termination=Termination.DONE, answer="5")
            return [GradeCase("a", done, reward=1.0)]

Fixtures:

- ``rebuild_task_source`` (required): a callable that builds a new source over the same data
  and configuration every time it is called. ``task_source`` (one built with it) is what most
  checks use; the stability check compares two.
- ``grade_cases`` (optional): :class:`GradeCase` s, each a task (by split and id), an outcome,
  the sandbox to grade in (``None`` for a source that grades without one) and the reward
  expected; ``reward=None`` marks a case the verifier cannot produce a reward for (a missing
  reward file, a crash): grading it must raise. Without cases the grading check is skipped.

The class attribute ``task_splits`` names the splits the fixture's source provides (``("train",)``
by default); each must hold at least one task.

What the checks hold the source to, from the port's contract:

- ``tasks(split)`` returns :class:`~rllm_core.types.Task` s whose ids are non-empty strings,
  unique across every split of the source; ``tasks()`` is the ``"train"`` split;
- the order is stable: calling again, or on a source rebuilt over the same data, gives the same
  tasks in the same order;
- an unknown split raises ``KeyError``;
- ``grade`` returns a :class:`~rllm_core.types.Grade` with a finite float reward (the one
  each case expects), and raises, rather than returning a reward, when it cannot produce one;
- an optional ``prepare`` is a coroutine function;
- a :class:`~rllm_core.ports.agents.CheckableTaskSource` reports one check per task of a split
  in task-id order, and raises ``KeyError`` for an unknown split.

Checks drive ``grade`` with :func:`asyncio.run` in plain synchronous tests. Every test method
takes its fixtures as arguments, so a test can call one directly with a hand-built source.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from rllm_core.ports import TaskSource
from rllm_core.ports.agents import CheckableTaskSource, DatasetCheck
from rllm_core.types import Grade, HarnessOutcome, Task

__all__ = ["UNKNOWN_SPLIT", "GradeCase", "TaskSourceConformance"]

UNKNOWN_SPLIT = "no-such-split"
"""The split name every source must refuse with ``KeyError``."""


@dataclass(frozen=True)
class GradeCase:
    """Grade task ``task_id`` of ``split`` after ``outcome``, in ``sandbox``: the reward must be
    ``reward``, or, with ``reward=None``, grading must raise."""

    task_id: str
    outcome: HarnessOutcome
    reward: float | None
    split: str = "train"
    sandbox: Any = None


def _ids(tasks: Sequence[Task]) -> list[str]:
    return [task.task_id for task in tasks]


def _tasks(source: Any, split: str) -> Sequence[Task]:
    tasks = source.tasks(split)
    assert isinstance(tasks, Sequence), (
        f"tasks({split!r}) returned {type(tasks).__name__}; return a sequence (a list)"
    )
    for index, task in enumerate(tasks):
        assert isinstance(task, Task), (
            f"tasks({split!r})[{index}] is {type(task).__name__}, not rllm_core.types.Task"
        )
        assert isinstance(task.task_id, str) and task.task_id, (
            f"tasks({split!r})[{index}] has task_id {task.task_id!r}; ids are non-empty strings"
        )
    return tasks


@pytest.mark.rllm_conformance
class TaskSourceConformance:
    """The :class:`~rllm_core.ports.TaskSource` contract; see the module docstring."""

    task_splits: ClassVar[tuple[str, ...]] = ("train",)

    @pytest.fixture
    def rebuild_task_source(self) -> Callable[[], Any]:
        pytest.fail(
            f"{type(self).__name__} must define a 'rebuild_task_source' fixture returning a"
            " callable that builds the source"
        )

    @pytest.fixture
    def task_source(self, rebuild_task_source: Callable[[], Any]) -> Any:
        return rebuild_task_source()

    @pytest.fixture
    def grade_cases(self) -> Sequence[GradeCase]:
        return ()

    def test_is_a_task_source(self, task_source: Any) -> None:
        assert isinstance(task_source, TaskSource), (
            f"{type(task_source).__name__} lacks tasks() or grade() of the TaskSource port"
        )

    def test_every_split_holds_tasks_with_ids_unique_across_the_source(
        self, task_source: Any
    ) -> None:
        seen: dict[str, str] = {}
        for split in self.task_splits:
            tasks = _tasks(task_source, split)
            assert tasks, f"split {split!r} holds no task; task_splits names it"
            for task_id in _ids(tasks):
                assert task_id not in seen, (
                    f"task id {task_id!r} appears in split {seen[task_id]!r} and again in"
                    f" {split!r}; ids are unique within a source"
                )
                seen[task_id] = split

    def test_the_default_split_is_train(self, task_source: Any) -> None:
        if "train" not in self.task_splits:
            pytest.skip("the source has no 'train' split")
        assert _ids(task_source.tasks()) == _ids(_tasks(task_source, "train")), (
            "tasks() without a split differs from tasks('train')"
        )

    def test_order_is_stable_across_calls_and_rebuilds(
        self, task_source: Any, rebuild_task_source: Callable[[], Any]
    ) -> None:
        again = rebuild_task_source()
        for split in self.task_splits:
            first = _tasks(task_source, split)
            for label, other in (
                ("a second call", _tasks(task_source, split)),
                ("a source rebuilt over the same data", _tasks(again, split)),
            ):
                assert _ids(other) == _ids(first), (
                    f"split {split!r}: {label} lists {_ids(other)}, the first call {_ids(first)}"
                )
                assert [t.instruction for t in other] == [t.instruction for t in first], (
                    f"split {split!r}: {label} gives the same ids different instructions"
                )

    def test_an_unknown_split_raises_key_error(self, task_source: Any) -> None:
        try:
            got = task_source.tasks(UNKNOWN_SPLIT)
        except KeyError:
            return
        pytest.fail(
            f"tasks({UNKNOWN_SPLIT!r}) returned {type(got).__name__} ({len(got)} tasks);"
            " an unknown split raises KeyError"
        )

    def test_grades_each_case(self, task_source: Any, grade_cases: Sequence[GradeCase]) -> None:
        if not grade_cases:
            pytest.skip("provide a 'grade_cases' fixture to check grading")
        for case in grade_cases:
            by_id = {task.task_id: task for task in _tasks(task_source, case.split)}
            assert case.task_id in by_id, (
                f"grade case names task {case.task_id!r}, not in split {case.split!r}"
            )
            task = by_id[case.task_id]
            coroutine = task_source.grade(task, case.outcome, case.sandbox)
            if case.reward is None:
                try:
                    got = asyncio.run(coroutine)
                except Exception:
                    continue
                pytest.fail(
                    f"task {case.task_id!r}: the verifier could not produce a reward, yet grade"
                    f" returned {got!r}; raise an error instead of a silent reward"
                )
            grade = asyncio.run(coroutine)
            assert isinstance(grade, Grade), (
                f"task {case.task_id!r}: grade returned {type(grade).__name__}, not Grade"
            )
            assert isinstance(grade.reward, float) and math.isfinite(grade.reward), (
                f"task {case.task_id!r}: reward {grade.reward!r} is not a finite float"
            )
            assert grade.reward == pytest.approx(case.reward), (
                f"task {case.task_id!r} after {case.outcome!r}: reward {grade.reward},"
                f" expected {case.reward}"
            )
            for name, value in grade.signals.items():
                assert isinstance(value, float), (
                    f"task {case.task_id!r}: signal {name!r} is {type(value).__name__}"
                )

    def test_prepare_when_present_is_a_coroutine_function(self, task_source: Any) -> None:
        prepare = getattr(task_source, "prepare", None)
        if prepare is None:
            pytest.skip("the source has no prepare")
        assert inspect.iscoroutinefunction(prepare), (
            "prepare must be `async def prepare(task, sandbox)`: the rollout runner awaits it"
        )

    def test_a_checkable_source_checks_every_task_of_a_split(self, task_source: Any) -> None:
        if not isinstance(task_source, CheckableTaskSource):
            pytest.skip("the source is not a CheckableTaskSource")
        for split in self.task_splits:
            report = task_source.check(split)
            assert isinstance(report, DatasetCheck), (
                f"check({split!r}) returned {type(report).__name__}, not DatasetCheck"
            )
            checked = [check.task_id for check in report.tasks]
            assert checked == sorted(checked), f"check({split!r}) lists {checked}, not in id order"
            missing = set(_ids(_tasks(task_source, split))) - set(checked)
            assert not missing, f"check({split!r}) has no check for tasks {sorted(missing)}"
        with pytest.raises(KeyError):
            task_source.check(UNKNOWN_SPLIT)
