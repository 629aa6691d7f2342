"""The ``harbor`` task source: the reader, sandbox preparation, reference solutions and the
verifier of this package behind the core's task source contracts."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rllm_core.errors import TaskProblem, VerifierError
from rllm_core.ports.agents import DatasetCheck
from rllm_core.ports.sandboxes import Sandbox
from rllm_core.types import ExecResult, Grade, HarnessOutcome, Task

from rllm_task_source_harbor.plugin import HarborConfig
from rllm_task_source_harbor.prepare import prepare_sandbox
from rllm_task_source_harbor.reader import check_dataset, load_dataset
from rllm_task_source_harbor.solution import run_solution
from rllm_task_source_harbor.verifier import run_verifier

__all__ = ["HarborTaskSource"]


class HarborTaskSource:
    """Tasks from Harbor dataset directories, one per split.

    A split is read on first use and kept; a format problem raises ``TaskFormatError`` then,
    naming every bad field. ``prepare`` sets the episode's sandbox up, ``grade`` runs the
    task's verifier in it. Implements
    :class:`~rllm_core.ports.agents.CheckableTaskSource`, so ``rllm-core tasks check`` can
    check a split and run each task's reference solution.
    """

    def __init__(self, config: HarborConfig) -> None:
        self.config = config
        self._paths: dict[str, Path] = {"train": config.path}
        if config.eval_path is not None:
            self._paths["eval"] = config.eval_path
        self._paths.update(config.splits)
        self._loaded: dict[str, list[Task]] = {}

    @property
    def splits(self) -> list[str]:
        return list(self._paths)

    def _path(self, split: str) -> Path:
        if split not in self._paths:
            raise KeyError(
                f"the harbor task source has no split {split!r}; it has"
                f" {', '.join(self._paths)} (set eval_path or splits to add one)"
            )
        return self._paths[split]

    def tasks(self, split: str = "train") -> Sequence[Task]:
        self._path(split)
        if split not in self._loaded:
            tasks = load_dataset(
                self._paths[split],
                replay_dockerfile=self.config.replay_dockerfile,
                verifier_user=self.config.verifier_user,
                reward_key=self.config.reward_key,
            )
            if self.config.limit is not None:
                tasks = tasks[: self.config.limit]
            self._loaded[split] = tasks
        return self._loaded[split]

    async def grade(self, task: Task, outcome: HarnessOutcome, sandbox: Sandbox | None) -> Grade:
        """Run ``tests/test.sh`` in ``sandbox`` and return the reward it writes; the outcome
        is not consulted (the sandbox's state is what is graded)."""
        if sandbox is None:
            raise VerifierError(
                f"task {task.task_id}: a harbor task is graded in its sandbox, but none was"
                " given; run the episode with a sandbox backend",
                task_id=task.task_id,
            )
        return await run_verifier(task, sandbox)

    def check(self, split: str = "train", *, require_solution: bool = False) -> DatasetCheck:
        """Read every task of ``split`` afresh, without raising (``limit`` does not apply);
        with ``require_solution`` a task without ``solution/solve.sh`` is a problem."""
        report = check_dataset(
            self._path(split),
            replay_dockerfile=self.config.replay_dockerfile,
            verifier_user=self.config.verifier_user,
            reward_key=self.config.reward_key,
        )
        if require_solution:
            for task_check in report.tasks:
                if task_check.task is not None and not task_check.has_solution:
                    task_check.problems.append(
                        TaskProblem(
                            task=task_check.task_id,
                            field="solution/solve.sh",
                            message="missing; --solve needs a reference solution",
                        )
                    )
        return report

    async def prepare(self, task: Task, sandbox: Sandbox | None) -> None:
        """Create the task's workdir, replay its Dockerfile's ``RUN`` and ``COPY``/``ADD`` steps
        and run its healthcheck in ``sandbox`` (see
        :func:`~rllm_task_source_harbor.prepare.prepare_sandbox`); with no sandbox there is
        nothing to prepare. Raises ``TaskSetupError`` when a step or the healthcheck fails."""
        if sandbox is not None:
            await prepare_sandbox(task, sandbox)

    async def run_solution(self, task: Task, sandbox: Sandbox) -> ExecResult:
        """Run ``solution/solve.sh`` as the agent would (see
        :func:`~rllm_task_source_harbor.solution.run_solution`)."""
        return await run_solution(task, sandbox)
