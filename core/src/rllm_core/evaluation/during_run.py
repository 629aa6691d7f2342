"""Evaluation during an RL run (``[run].eval_every``, ``eval_attempts``, ``keep_best``).

Every ``eval_every`` steps and after the last step, once the step's update is done (so the
trainer's sampler, or a ``[sampler]`` the update synced, serves the current weights), the run
rolls out ``eval_attempts`` attempts of every task of the task source's ``eval`` split through
its own gateway, with the plan's ``[sampling]``, and scores them as ``rllm-core eval`` does
(:mod:`.scoring`). The summary becomes the step's ``eval/*`` metrics
(:mod:`rllm_core.plan.eval_check` names them) and a line of ``evals.jsonl`` in the run folder
(``step``, ``summary``, per-task ``results``). Evaluation rollouts are sessions of the run id
with ``.eval`` appended, so they never enter a training batch, the datum builder or the
sample buffer.

With ``keep_best``, a step whose metric beats every evaluation before it gets its checkpoint
(saved then, unless the step was just saved) copied to ``checkpoints/best/``
(:mod:`rllm_core.run.best`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rllm_core.evaluation.scoring import summarize, task_results
from rllm_core.plan.eval_check import eval_metric, summary_keys
from rllm_core.rollout import RolloutRunner
from rllm_core.rollout.context import RolloutContext, rollout_settings
from rllm_core.rollout.seeding import SeededGateway
from rllm_core.rollout.sessions import SessionKey
from rllm_core.run.best import BestCheckpoint
from rllm_core.run.checkpoints import RunCheckpoints
from rllm_core.run.lifecycle import ResumeError
from rllm_core.run.parts import RunParts
from rllm_core.run.state import LoopState
from rllm_core.types import Task

__all__ = ["EVALS_FILE", "EvalSplitMissing", "RunEvaluator", "eval_run_id", "is_eval_step"]

EVALS_FILE = "evals.jsonl"


class EvalSplitMissing(ResumeError):
    """The task source has no eval split to evaluate on (the run cannot start); the message
    says what to set."""


def is_eval_step(step: int, *, every: int, last: int) -> bool:
    """Whether a run of ``last`` steps evaluating every ``every`` evaluates after ``step``."""
    return bool(every) and (step % every == 0 or step == last)


def eval_run_id(run_id: str) -> str:
    """The run id of a run's evaluation sessions (never parsed as one of ``run_id``'s)."""
    return f"{run_id}.eval"


class RunEvaluator:
    """Evaluates the policy of the run ``parts`` at its evaluation steps; see the module
    docstring. ``tasks`` is the eval split."""

    def __init__(
        self, parts: RunParts, rollouts: RolloutContext, *, run_id: str, tasks: list[Task]
    ) -> None:
        plan = parts.plan
        self.parts = parts
        self.every = plan.run.eval_every
        self.last_step = plan.run.steps
        self.attempts = plan.run.eval_attempts
        self.tasks = tasks
        self.run_id = eval_run_id(run_id)
        c = parts.components
        self.runner = RolloutRunner(
            task_source=c.tasks,
            harness=c.harness,
            sandbox_backend=c.sandbox,
            gateway=SeededGateway(rollouts.gateway, seed=plan.run.seed, run_id=self.run_id),
            trace_store=rollouts.traces,
            settings=rollout_settings(plan, group_size=self.attempts),
            run_id=self.run_id,
        )
        self.best = (
            BestCheckpoint(parts.folder.checkpoints, plan.run.keep_best)
            if plan.run.keep_best is not None
            else None
        )
        self.latest: dict[str, float] = {}
        self.last: dict[str, Any] | None = None
        self._task: asyncio.Task[Any] | None = None
        self._cancelled = False
        self._cleaned = False

    @classmethod
    def for_run(
        cls, parts: RunParts, rollouts: RolloutContext | None, *, run_id: str
    ) -> RunEvaluator | None:
        """The evaluator of a run whose plan sets ``eval_every``, else None. Raises
        :class:`EvalSplitMissing` when the task source has no eval tasks."""
        plan = parts.plan
        if not plan.run.eval_every or rollouts is None:
            return None
        try:
            tasks = list(parts.components.tasks.tasks("eval"))
        except KeyError as exc:
            reason = exc.args[0] if exc.args else "no split 'eval'"
            raise EvalSplitMissing(
                f"{parts.resolved.path}: [run].eval_every = {plan.run.eval_every} evaluates on"
                f" the task source's eval split: {reason}; give [tasks] an eval split (for"
                " jsonl: eval_path) or set [run].eval_every = 0"
            ) from None
        if not tasks:
            raise EvalSplitMissing(
                f"{parts.resolved.path}: [run].eval_every = {plan.run.eval_every}: the task"
                " source's eval split has no tasks; add some or set [run].eval_every = 0"
            )
        return cls(parts, rollouts, run_id=run_id, tasks=tasks)

    def due(self, step: int) -> bool:
        return is_eval_step(step, every=self.every, last=self.last_step)

    def cancel(self) -> None:
        """Stop an evaluation in flight (a stop signal); its step records no eval metrics."""
        self._cancelled = True
        if self._task is not None:
            self._task.cancel()

    async def evaluate(self, step: int) -> dict[str, float]:
        """The ``eval/*`` metrics of step ``step`` when it is an evaluation step, else none
        (none either when a stop cancelled the evaluation)."""
        self.latest = {}
        if not self.due(step) or self._cancelled:
            return {}
        if not self._cleaned:
            await asyncio.to_thread(self._forget_from, step)
        began = time.monotonic()
        self._task = asyncio.ensure_future(self.runner.run(self.tasks, step=step))
        try:
            batch = await self._task
        except asyncio.CancelledError:
            if not self._cancelled:
                raise
            return {}
        finally:
            self._task = None
        results = task_results(self.tasks, batch)
        summary = summarize(results, attempts=self.attempts, wall_s=time.monotonic() - began)
        folder = self.parts.folder
        folder.append(
            folder.path / EVALS_FILE,
            {"step": step, "summary": summary, "results": [r.to_dict() for r in results]},
        )
        self.latest = {
            eval_metric(key): float(summary[key])
            for key in summary_keys(self.attempts)
            if summary.get(key) is not None
        }
        shown = ", ".join(
            f"{name.removeprefix('eval/')} {value:.3f}"
            for name, value in self.latest.items()
            if name.startswith("eval/pass@") or name == "eval/mean_reward"
        )
        self.parts.display.info(
            f"step {step} eval: {shown or 'no task scored'} ({len(self.tasks)} tasks x"
            f" {self.attempts})"
        )
        if batch.infra_failures:
            self.parts.display.warn(
                f"step {step} eval: {len(batch.infra_failures)} attempts excluded after"
                " infrastructure failures"
            )
        self.last = {"step": step} | self.latest
        return dict(self.latest)

    def keep_best(
        self,
        state: LoopState,
        checkpoints: RunCheckpoints,
        save: Callable[[LoopState], Path | str],
    ) -> None:
        """After step ``state.step`` is recorded (and saved, when scheduled): with
        ``keep_best``, make its checkpoint the best when its evaluation beat every one before
        (saving it with ``save`` unless it is the latest checkpoint already)."""
        if self.best is None:
            return
        value = self.latest.get(self.best.metric)
        if not self.best.improves(value):
            return
        assert value is not None
        latest = checkpoints.latest()
        if latest is None or latest.step != state.step:
            save(state)
            latest = checkpoints.latest()
        assert latest is not None and latest.step == state.step
        where = self.best.keep(step=state.step, value=value, cut=latest.path)
        self.parts.display.info(
            f"step {state.step}: best {self.best.metric} so far ({value:.3f}): {where}"
        )

    def summary(self) -> dict[str, Any]:
        """The evaluation part of ``summary.json``: ``eval_last`` (the step and metrics of the
        last evaluation of this process) and, with ``keep_best``, ``best`` (``best.json``)."""
        summary: dict[str, Any] = {"eval_last": self.last}
        if self.best is not None:
            summary["best"] = self.best.record
        return summary

    def _forget_from(self, step: int) -> None:
        """Drop what an earlier process of this run evaluated at ``step`` or later (a resumed
        run evaluates those steps again with the same session ids)."""
        self._cleaned = True
        store = self.parts.components.trace_store
        for session in store.sessions():
            key = SessionKey.parse(session, run=self.run_id)
            if key is not None and key.step >= step:
                store.delete_session(session)
