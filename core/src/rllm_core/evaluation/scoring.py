"""Per-task results and the pass@k summary of an evaluation.

A task's attempts are its ``k`` rollouts. An attempt *passes* when its reward is at least
:data:`PASS_REWARD`. Attempts that failed on infrastructure (after the runner's retries) are
excluded, never scored 0: a task's ``scored`` attempts are the rest.

- ``pass@k``: the fraction of tasks with at least one scored attempt where some attempt passed.
- ``pass@1``: the mean over those tasks of (passing attempts / scored attempts), the unbiased
  estimate of a single attempt's pass rate from the ``k`` samples.
- ``mean reward``: the mean reward of every scored attempt.

Tasks without any scored attempt are counted in ``tasks_unscored`` and left out of all three.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rllm_core.rollout import InfraFailure, RolloutBatch
from rllm_core.types import Episode, Task

__all__ = ["PASS_REWARD", "TaskResult", "summarize", "task_results"]

PASS_REWARD = 1.0
"""An attempt with a reward at least this high passes."""


@dataclass
class TaskResult:
    """One task's attempts: scored rewards and terminations in rollout order, and the
    attempts excluded after infrastructure failures."""

    task_id: str
    rewards: list[float] = field(default_factory=list)
    terminations: list[str] = field(default_factory=list)
    infra_failures: list[dict[str, Any]] = field(default_factory=list)

    @property
    def scored(self) -> int:
        return len(self.rewards)

    @property
    def passes(self) -> int:
        return sum(1 for reward in self.rewards if reward >= PASS_REWARD)

    @property
    def passed(self) -> bool:
        return self.passes > 0

    def to_dict(self) -> dict[str, Any]:
        """The task's line in ``results.jsonl``."""
        return {
            "task_id": self.task_id,
            "rewards": list(self.rewards),
            "terminations": list(self.terminations),
            "passed": self.passed,
            "pass@1": self.passes / self.scored if self.scored else None,
            "infra_failures": list(self.infra_failures),
        }


def _failure(failure: InfraFailure) -> dict[str, Any]:
    return {
        "index": failure.index,
        "termination": str(failure.termination),
        "error": failure.error,
    }


def task_results(tasks: Sequence[Task], batch: RolloutBatch) -> list[TaskResult]:
    """One :class:`TaskResult` per task of ``tasks`` (the order the batch ran them in)."""
    results = [TaskResult(task_id=task.task_id) for task in tasks]
    by_id = {result.task_id: result for result in results}
    for result, group in zip(results, batch.groups, strict=True):
        ordered: list[Episode] = sorted(group, key=lambda e: int(e.metadata.get("index", 0)))
        result.rewards = [float(e.reward) for e in ordered]
        result.terminations = [str(e.termination) for e in ordered]
    for failure in sorted(batch.infra_failures, key=lambda f: f.index):
        by_id[failure.task_id].infra_failures.append(_failure(failure))
    return results


def summarize(results: Sequence[TaskResult], *, attempts: int, wall_s: float) -> dict[str, Any]:
    """The evaluation's ``summary.json`` figures; see the module docstring. Rates are
    ``None`` when no task was scored."""
    scored = [r for r in results if r.scored]
    rewards = [reward for r in scored for reward in r.rewards]
    return {
        "tasks": len(results),
        "tasks_scored": len(scored),
        "tasks_unscored": len(results) - len(scored),
        "attempts": attempts,
        f"pass@{attempts}": sum(r.passed for r in scored) / len(scored) if scored else None,
        "pass@1": sum(r.passes / r.scored for r in scored) / len(scored) if scored else None,
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
        "episodes": len(rewards),
        "infra_failures": sum(len(r.infra_failures) for r in results),
        "wall_s": wall_s,
    }
