"""The ``harbor`` task source over the core's Harbor reader and verifier."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rllm_core.errors import VerifierError
from rllm_core.ports.sandboxes import Sandbox
from rllm_core.tasks import load_dataset, run_verifier
from rllm_core.types import Grade, HarnessOutcome, Task

from rllm_task_source_harbor.plugin import HarborConfig

__all__ = ["HarborTaskSource"]


class HarborTaskSource:
    """Tasks from Harbor dataset directories, one per split.

    A split is read on first use and kept; a format problem raises ``TaskFormatError`` then,
    naming every bad field. ``grade`` runs the task's verifier in the episode's sandbox.
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

    def tasks(self, split: str = "train") -> Sequence[Task]:
        if split not in self._paths:
            raise KeyError(
                f"the harbor task source has no split {split!r}; it has"
                f" {', '.join(self._paths)} (set eval_path or splits to add one)"
            )
        if split not in self._loaded:
            tasks = load_dataset(
                self._paths[split],
                replay_dockerfile=self.config.replay_dockerfile,
                verifier_user=self.config.verifier_user,
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
