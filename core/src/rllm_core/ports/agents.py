"""Contracts for task sources and harnesses (agent loops)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from rllm_core.errors import TaskProblem
from rllm_core.ports.sandboxes import Sandbox
from rllm_core.types import ExecResult, Grade, HarnessOutcome, LLMEndpoint, Task

__all__ = ["CheckableTaskSource", "DatasetCheck", "Harness", "TaskCheck", "TaskSource"]


@runtime_checkable
class TaskSource(Protocol):
    """Provides tasks and grades their outcomes.

    Contract:

    - ``tasks(split)`` returns the tasks of a split (``"train"``, ``"eval"``) in a stable order;
      task ids are unique within a source. An unknown split raises ``KeyError``.
    - ``grade(task, outcome, sandbox)`` returns the task's :class:`~rllm_core.types.Grade`.
      A verifier that cannot produce a reward (missing or unparseable reward file, timeout,
      crash) raises an error; it never returns a silent 0.
    - Optionally, ``async prepare(task, sandbox)``: the rollout runner awaits it once after
      creating the task's sandbox (``None`` for a task without an environment) and before the
      harness runs, to set the sandbox up; an error it raises fails the attempt like any other
      sandbox setup error. A source without it gets the sandbox as the backend created it.

    Example::

        for task in source.tasks("train"):
            grade = await source.grade(task, outcome, sandbox)
    """

    def tasks(self, split: str = "train") -> Sequence[Task]: ...

    async def grade(
        self, task: Task, outcome: HarnessOutcome, sandbox: Sandbox | None
    ) -> Grade: ...


@dataclass
class TaskCheck:
    """What reading one task found, without raising.

    ``task`` is ``None`` when there are ``problems``; ``warnings`` name ignored or unknown
    fields; ``notes`` say what setting the sandbox up skips. ``has_solution`` says whether the
    task ships a reference solution; ``settings`` holds source-specific settings to list next
    to the task's environment (JSON-ready values); ``setup`` says in a few words what
    ``prepare`` does before the agent runs (``rllm-core tasks check`` lists it).
    """

    task_dir: Path
    task_id: str
    task: Task | None = None
    problems: list[TaskProblem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    has_solution: bool = False
    settings: dict[str, Any] = field(default_factory=dict)
    setup: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class DatasetCheck:
    """What reading a set of tasks found: one :class:`TaskCheck` per task, in task-id order,
    plus problems and warnings of the set itself; ``name`` is the set's name."""

    path: Path
    name: str
    tasks: list[TaskCheck] = field(default_factory=list)
    problems: list[TaskProblem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def all_problems(self) -> list[TaskProblem]:
        return [*self.problems, *(p for check in self.tasks for p in check.problems)]

    @property
    def ok(self) -> bool:
        return not self.all_problems


@runtime_checkable
class CheckableTaskSource(TaskSource, Protocol):
    """A task source whose tasks can be checked before training: what
    ``rllm-core tasks check`` calls. Optional; the ``harbor`` task source implements it.

    Contract:

    - ``check(split, require_solution=...)`` reads every task of ``split`` and reports what it
      found as a :class:`DatasetCheck`; it never raises for a bad task (each problem names its
      task and field). With ``require_solution``, a task without a reference solution is a
      problem. An unknown split raises ``KeyError``.
    - ``prepare(task, sandbox)`` sets a fresh sandbox up for ``task`` (as the rollout runner
      calls it, see :class:`TaskSource`); a failing setup step raises ``TaskSetupError``.
    - ``run_solution(task, sandbox)`` runs the task's reference solution in a prepared
      sandbox, as the agent would, and returns its result whatever the exit code; a task
      without one raises ``TaskFormatError``.
    - ``grade(task, outcome, sandbox)`` (from :class:`TaskSource`) is the verifier: after
      ``run_solution`` it must give reward 1, on an untouched sandbox reward 0.

    Example::

        report = source.check("train", require_solution=True)
        for task in (c.task for c in report.tasks if c.task is not None):
            async with await backend.create(task.environment) as sandbox:
                await source.prepare(task, sandbox)
                await source.run_solution(task, sandbox)
                done = HarnessOutcome(termination=Termination.DONE)
                grade = await source.grade(task, done, sandbox)
    """

    def check(self, split: str = "train", *, require_solution: bool = False) -> DatasetCheck: ...

    async def prepare(self, task: Task, sandbox: Sandbox | None) -> None: ...

    async def run_solution(self, task: Task, sandbox: Sandbox) -> ExecResult: ...


@runtime_checkable
class Harness(Protocol):
    """Runs one episode of one task.

    The harness talks to the model only through ``llm`` (an OpenAI-compatible endpoint for this
    episode's session; the gateway records the tokens) and acts only through ``sandbox``. It
    returns how the episode ended; it does not grade.

    Optionally, ``sandbox_network``: the :class:`~rllm_core.types.NetworkPolicy` that programs
    the harness runs inside the sandbox need. A harness whose agent runs in the sandbox and
    calls ``llm`` from there declares ``GATEWAY``. The rollout then creates the sandbox with the
    wider of it and the task's own ``environment.network``, sets the spec's ``gateway_url`` to
    the session's URL when the result is ``GATEWAY``, and passes ``llm`` with the sandbox's
    ``gateway_url`` as its ``base_url`` (:func:`rllm_core.rollout.network.sandbox_spec`,
    :func:`rllm_core.rollout.network.agent_endpoint`). Without it, the task's network is used
    as it is.

    Example::

        outcome = await harness.run(task, LLMEndpoint(base_url=url, api_key=key, model="policy"),
                                    sandbox)
    """

    async def run(
        self, task: Task, llm: LLMEndpoint, sandbox: Sandbox | None
    ) -> HarnessOutcome: ...
