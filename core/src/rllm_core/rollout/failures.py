"""When excluded rollouts are too many to go on: the ``[rollout].max_failed_fraction`` policy.

Infrastructure failures are retried, then excluded from the batch (see
:mod:`rllm_core.rollout.classify`). A few excluded rollouts are normal; a verifier that crashes
on every attempt would exclude them all and leave a run training on nothing.
:func:`check_failures` stops that: when the excluded rollouts exceed ``max_fraction`` of a
batch's rollouts it raises :class:`TooManyFailedRollouts`, whose message names the failure
kind, the task, the failure's own error (a verifier's output tail) and what to do.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

from rllm_core.rollout.records import InfraFailure, RolloutBatch
from rllm_core.types import Task, Termination

__all__ = [
    "TooManyFailedRollouts",
    "TooManyVerifierTimeouts",
    "check_failures",
    "failure_hint",
    "failure_report",
]


class TooManyFailedRollouts(Exception):
    """More of a batch's rollouts failed on infrastructure than the plan allows.

    ``failures`` are the batch's excluded rollouts, ``rollouts`` the batch's total,
    ``example`` the failure the message quotes (the first of the most common kind).
    """

    def __init__(
        self,
        message: str,
        *,
        failures: Sequence[InfraFailure],
        rollouts: int,
        example: InfraFailure,
    ) -> None:
        super().__init__(message)
        self.failures = list(failures)
        self.rollouts = rollouts
        self.example = example

    def to_dict(self) -> dict[str, object]:
        """The failure as ``summary.json`` records it."""
        return {
            "kind": str(self.example.termination),
            "task_id": self.example.task_id,
            "error": self.example.error,
            "failed": len(self.failures),
            "rollouts": self.rollouts,
        }


class TooManyVerifierTimeouts(TooManyFailedRollouts):
    """More rollout attempts ended ``verifier_timeout`` over a run than
    ``[rollout].max_verifier_timeouts`` allows. ``timeouts`` counts them per task id, in the
    order the tasks first timed out; ``limit`` is the cap."""

    def __init__(self, *, timeouts: Mapping[str, int], limit: int) -> None:
        total = sum(timeouts.values())
        named = ", ".join(
            f"{task!r} ({count} time{'s' if count > 1 else ''})" for task, count in timeouts.items()
        )
        message = (
            f"{total} rollout attempt{'s' if total > 1 else ''} ended verifier_timeout in this"
            f" run, more than [rollout].max_verifier_timeouts = {limit} allows; the verifier of"
            f" task {named} ran past its timeout.\n"
            "What to do: raise the task's verifier timeout ([verifier].timeout_sec in its"
            " task.toml) or make its tests faster, or raise [rollout].max_verifier_timeouts"
            " (leave it unset for no limit)."
        )
        Exception.__init__(self, message)
        self.timeouts = dict(timeouts)
        self.limit = limit
        self.failures = []
        self.rollouts = total
        self.example = None

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": "verifier_timeout",
            "task_id": next(iter(self.timeouts)),
            "tasks": dict(self.timeouts),
            "error": str(self),
            "failed": sum(self.timeouts.values()),
            "limit": self.limit,
        }


def failure_hint(termination: Termination, task: Task | None) -> str:
    """What to do about rollouts that keep failing with ``termination``."""
    if termination in (Termination.VERIFIER_ERROR, Termination.GRADING_ERROR):
        task_dir = task.data.get("task_dir") if task is not None else None
        if task_dir:
            return (
                f"fix the task's verifier {task_dir}/tests/test.sh so that it writes a reward"
                f" to /logs/verifier/reward.txt (try it with: rllm-core tasks check"
                f" {Path(task_dir).parent} --solve)"
            )
        return "fix the task's verifier so that it produces a reward"
    if termination is Termination.SANDBOX_ERROR:
        return "fix the sandbox backend or the task's environment (the error says which failed)"
    if termination is Termination.ENVIRONMENT_START_TIMEOUT:
        return (
            "raise the limit the error names (the backend's start timeout, or the task's"
            " [environment].build_timeout_sec) or use a prebuilt image"
        )
    if termination is Termination.AGENT_SETUP_TIMEOUT:
        return "raise the harness's install timeout or make its install script faster"
    if termination is Termination.VERIFIER_TIMEOUT:
        return "raise the task's verifier timeout ([verifier].timeout_sec) or speed up its tests"
    if termination is Termination.NO_MODEL_CALL:
        return (
            "check that the agent reaches the model (its base URL and key) and that the model"
            " answers with text; or take no_model_call out of [rollout].mask to score it"
        )
    return "check that the model server behind the trainer backend is up and answering"


def check_failures(
    batch: RolloutBatch,
    *,
    max_fraction: float,
    context: str,
    tasks: Sequence[Task] = (),
) -> None:
    """Raise :class:`TooManyFailedRollouts` when ``batch``'s excluded rollouts exceed
    ``max_fraction`` of its rollouts (so ``1.0`` never raises).

    ``context`` starts the message (``"step 3"``); ``tasks`` (the batch's tasks) lets the
    message point at a Harbor task's folder.
    """
    failures = batch.infra_failures
    if failures and len(failures) > max_fraction * _rollouts(batch):
        raise failure_report(
            batch,
            context=context,
            rule=f"more than [rollout].max_failed_fraction = {max_fraction:g} allows",
            remedy="raise [rollout].max_failed_fraction to go on with the rollouts that succeed",
            tasks=tasks,
        )


def failure_report(
    batch: RolloutBatch,
    *,
    context: str,
    rule: str,
    remedy: str | None = None,
    tasks: Sequence[Task] = (),
) -> TooManyFailedRollouts:
    """The :class:`TooManyFailedRollouts` describing ``batch``'s excluded rollouts (it must
    have some): counts per kind, ``rule`` (why that is too many), the first failure of the
    most common kind with its error, and what to do (``remedy`` is the alternative offered)."""
    failures = batch.infra_failures
    rollouts = _rollouts(batch)
    kinds = Counter(failure.termination for failure in failures)
    kind = kinds.most_common(1)[0][0]
    example = next(failure for failure in failures if failure.termination is kind)
    by_id = {task.task_id: task for task in tasks}
    counts = ", ".join(f"{count} {name}" for name, count in kinds.most_common())
    attempts = example.attempt + 1
    todo = failure_hint(kind, by_id.get(example.task_id))
    if remedy:
        todo += f"; or {remedy}"
    message = (
        f"{context}: {len(failures)} of {rollouts} rollouts failed on infrastructure ({counts})"
        f" and were excluded, {rule}. Task {example.task_id!r} (rollout {example.index}, {kind},"
        f" after {attempts} attempt{'s' if attempts > 1 else ''}): {example.error}\n"
        f"What to do: {todo}."
    )
    return TooManyFailedRollouts(message, failures=failures, rollouts=rollouts, example=example)


def _rollouts(batch: RolloutBatch) -> int:
    return sum(len(group) for group in batch.groups) + len(batch.infra_failures)
