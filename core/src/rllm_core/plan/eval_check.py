"""What ``plan check`` refuses in ``[run]``'s evaluation keys (``eval_every``,
``eval_attempts``, ``keep_best``) of an RL plan, and the metrics an evaluation during a run
writes.

An evaluation during a run scores ``eval_attempts`` attempts of every task of the task
source's ``eval`` split (``docs/running.md``) and writes these metrics into the step's line:
``eval/pass@1``, ``eval/pass@<k>`` (``k = eval_attempts``), ``eval/mean_reward`` (higher is
better: :func:`rankable_metrics`, what ``keep_best`` may name), and the counts
``eval/tasks_scored``, ``eval/episodes`` and ``eval/infra_failures``, and the evaluation's
seconds as ``time/eval_s``.

Refused: ``eval_every`` with a task source whose config has an ``eval_path`` key left unset
(and no ``split_field``; a source without either key is asked for its split when the run
starts), ``eval_every`` with an ``[object_store]`` (its run splits into a sampler role and a
trainer role, and the trainer role has no gateway to evaluate through), ``keep_best`` or
``eval_attempts > 1`` without ``eval_every``, and ``keep_best`` naming a metric not in
:func:`rankable_metrics`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rllm_core.errors import PlanIssue
from rllm_core.plan.schema import Plan

__all__ = ["EVAL_PREFIX", "EVAL_TIME", "eval_issues", "eval_metric", "rankable_metrics"]

EVAL_PREFIX = "eval/"
EVAL_TIME = "time/eval_s"

_COUNTS = ("tasks_scored", "episodes", "infra_failures")


def eval_metric(score: str) -> str:
    """The metric name of an evaluation summary's key (``pass@1`` -> ``eval/pass@1``,
    ``wall_s`` -> ``time/eval_s``)."""
    return EVAL_TIME if score == "wall_s" else EVAL_PREFIX + score


def rankable_metrics(attempts: int) -> list[str]:
    """The metrics of an evaluation with ``attempts`` attempts per task that ``keep_best``
    may name (higher is better)."""
    names = ["pass@1"] + ([f"pass@{attempts}"] if attempts > 1 else []) + ["mean_reward"]
    return [eval_metric(name) for name in names]


def summary_keys(attempts: int) -> list[str]:
    """The keys of the evaluation summary that become ``eval/*`` metrics."""
    return [
        "pass@1",
        *([f"pass@{attempts}"] if attempts > 1 else []),
        "mean_reward",
        *_COUNTS,
        "wall_s",
    ]


def eval_issues(plan: Plan, components: Mapping[str, Any], path: str) -> list[PlanIssue]:
    """Every problem of ``plan``'s evaluation keys; ``components`` are the resolved ones
    (``"[tasks]"`` ...)."""
    run = plan.run
    issues: list[PlanIssue] = []

    def issue(section: str, key: str, value: Any, message: str, hint: str) -> None:
        issues.append(
            PlanIssue(path=path, section=section, key=key, value=value, message=message, hint=hint)
        )

    if not run.eval_every:
        if run.keep_best is not None:
            issue(
                "run",
                "keep_best",
                run.keep_best,
                "the best checkpoint is chosen by the evaluations during the run, and"
                " eval_every = 0 runs none",
                "set [run].eval_every (e.g. 5) or remove keep_best",
            )
        if run.eval_attempts > 1:
            issue(
                "run",
                "eval_attempts",
                run.eval_attempts,
                "attempts per eval task are used by the evaluations during the run, and"
                " eval_every = 0 runs none",
                "set [run].eval_every (e.g. 5) or remove eval_attempts",
            )
        return issues
    tasks = components.get("[tasks]")
    config = getattr(tasks, "config", None)
    fields = type(config).model_fields if config is not None else {}
    if (
        "eval_path" in fields
        and getattr(config, "eval_path", None) is None
        and getattr(config, "split_field", None) is None
    ):
        issue(
            "tasks",
            "eval_path",
            None,
            f"[run].eval_every = {run.eval_every} evaluates on the task source's eval split, and"
            f" [tasks] ({tasks.name}) has none",
            "set [tasks].eval_path to the held-out tasks, or set [run].eval_every = 0",
        )
    if plan.object_store is not None:
        issue(
            "run",
            "eval_every",
            run.eval_every,
            "evaluation during a run happens in the one-process run; with an [object_store]"
            " the run splits into --role sampler and --role trainer, and the trainer role has"
            " no gateway to evaluate through",
            "set [run].eval_every = 0 and evaluate the checkpoints with `rllm-core eval"
            " --checkpoint`, or remove [object_store] to train in one process",
        )
    valid = rankable_metrics(run.eval_attempts)
    if run.keep_best is not None and run.keep_best not in valid:
        issue(
            "run",
            "keep_best",
            run.keep_best,
            f"the evaluation with eval_attempts = {run.eval_attempts} writes no metric"
            f" {run.keep_best!r} to rank checkpoints by",
            f"set keep_best to one of {', '.join(repr(name) for name in valid)}",
        )
    return issues
