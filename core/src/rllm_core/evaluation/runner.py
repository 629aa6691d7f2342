"""Run an evaluation: ``k`` attempts of every task through the in-process gateway.

:class:`Evaluation` reuses the training path
(:func:`~rllm_core.rollout.context.open_rollouts`): the trainer's sampler behind a loopback
:class:`~rllm_core.gateway.server.Gateway`, the plan's ``[sampling]`` enforced on every
session (with a per-attempt seed from ``run.seed``), and a
:class:`~rllm_core.rollout.RolloutRunner` with ``group_size = attempts`` and the plan's
``[rollout]`` concurrency and infrastructure retries. Every task runs as one batch (step 0).
When every attempt failed on infrastructure, :attr:`EvalResult.failure` says why (the results
are still complete: every attempt excluded).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rllm_core.evaluation.scoring import TaskResult, summarize, task_results
from rllm_core.plan.schema import Plan
from rllm_core.rollout import (
    RolloutEvent,
    RolloutSettings,
    TooManyFailedRollouts,
    failure_report,
)
from rllm_core.rollout.context import open_rollouts, rollout_settings
from rllm_core.run.checkpoints import CHECKPOINT_FOLDERS, TRAINER_DIR, checkpoint_folder
from rllm_core.run.components import Components
from rllm_core.types import Episode, Task

__all__ = ["CheckpointNotFound", "EvalResult", "Evaluation", "checkpoint_state_dir"]


class CheckpointNotFound(Exception):
    """The ``--checkpoint`` path is not a checkpoint folder; the message names it."""


def checkpoint_state_dir(path: str | Path) -> Path:
    """The trainer state inside a run's checkpoint ``path`` (a run folder for its latest
    checkpoint, a cut's folder ``checkpoints/objects/cuts/<step>-<incarnation>/``, or an older
    run's ``checkpoints/step-N/``).

    Raises :class:`CheckpointNotFound` when ``path`` does not exist or holds no ``trainer/``.
    """
    folder = checkpoint_folder(Path(path))
    if not folder.is_dir():
        raise CheckpointNotFound(
            f"checkpoint folder {str(folder)!r} does not exist; pass a checkpoint folder of a"
            f" run ({CHECKPOINT_FOLDERS})"
        )
    state = folder / TRAINER_DIR
    if not state.is_dir():
        raise CheckpointNotFound(
            f"{str(folder)!r} is not a checkpoint (it has no {TRAINER_DIR}/ folder); pass a"
            f" checkpoint folder of a run ({CHECKPOINT_FOLDERS})"
        )
    return state


@dataclass
class EvalResult:
    """Per-task results in task order and the summary (see :mod:`.scoring`); ``failure`` is
    set when every attempt failed on infrastructure. ``episodes`` are the scored attempts, in
    task order, then attempt order."""

    results: list[TaskResult]
    summary: dict[str, Any]
    failure: TooManyFailedRollouts | None = None
    episodes: list[Episode] = field(default_factory=list)


class Evaluation:
    """``attempts`` rollouts of each of ``tasks`` with the built ``components`` of ``plan``.

    ``run_id`` prefixes every gateway session id; ``on_event`` gets every
    :class:`~rllm_core.rollout.RolloutEvent` (for progress displays); ``plan_path`` is named
    in error messages.
    """

    def __init__(
        self,
        *,
        plan: Plan,
        components: Components,
        tasks: Sequence[Task],
        attempts: int,
        run_id: str,
        on_event: Callable[[RolloutEvent], None] | None = None,
        plan_path: str = "plan.toml",
    ) -> None:
        if attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {attempts}")
        self.plan = plan
        self.c = components
        self.tasks = list(tasks)
        self.attempts = attempts
        self.run_id = run_id
        self.on_event = on_event
        self.plan_path = plan_path

    def settings(self) -> RolloutSettings:
        """The rollout settings: the plan's ``[rollout]`` and ``[sampling]``, ``attempts``
        rollouts per task."""
        return rollout_settings(self.plan, group_size=self.attempts)

    async def run(self) -> EvalResult:
        """Run every attempt and score them. Raises
        :class:`~rllm_core.rollout.gateway_address.GatewayBindError` when the gateway cannot
        bind the plan's ``[gateway]`` address."""
        began = time.monotonic()
        async with open_rollouts(
            self.plan,
            self.c,
            settings=self.settings(),
            run_id=self.run_id,
            on_event=self.on_event,
            plan_path=self.plan_path,
        ) as rollouts:
            batch = await rollouts.runner.run(self.tasks, step=0)
        results = task_results(self.tasks, batch)
        summary = summarize(results, attempts=self.attempts, wall_s=time.monotonic() - began)
        failure = None
        if batch.infra_failures and not batch.episodes_done:
            failure = failure_report(
                batch, context="evaluation", rule="so no attempt was scored", tasks=self.tasks
            )
        episodes = [
            e
            for group in batch.groups
            for e in sorted(group, key=lambda e: int(e.metadata.get("index", 0)))
        ]
        return EvalResult(results=results, summary=summary, failure=failure, episodes=episodes)
