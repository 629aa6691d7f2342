"""A run's teacher scoring (on-policy distillation), built once its components are.

:func:`teacher_scoring` returns the :class:`~rllm_core.algorithms.distill.TeacherScoring` the
producer half applies to every batch when the plan's ``[algorithm].advantage`` has a teacher,
after refusing a teacher whose tokenizer is not the student's
(:func:`~rllm_core.plan.teacher.teacher_issues`).
"""

from __future__ import annotations

from rllm_core.algorithms.distill import TeacherScoring, teacher_where
from rllm_core.errors import PlanError
from rllm_core.plan.teacher import teacher_issues
from rllm_core.ports import LogprobScorer, TokenAdvantages
from rllm_core.run.parts import RunParts

__all__ = ["teacher_scoring"]


def teacher_scoring(parts: RunParts) -> TeacherScoring | None:
    """The run's teacher scoring; None when the plan has no teacher.

    Raises :class:`~rllm_core.errors.PlanError` when the teacher's tokenizer differs from
    the student's, and ``TypeError`` when the estimator offers no per-token advantages or
    the teacher scores no tokens."""
    where = teacher_where()
    teacher = parts.components.placed.get(where)
    if teacher is None:
        return None
    estimator = parts.components.advantage
    advantage = parts.resolved.get("[algorithm].advantage")
    name = advantage.name if advantage is not None else "?"
    if not isinstance(estimator, TokenAdvantages):
        raise TypeError(
            f"{parts.resolved.path}: [algorithm].advantage: estimator {name!r} has a teacher"
            " but computes no per-token advantages (no token_advantages method)"
        )
    if not isinstance(teacher, LogprobScorer):
        raise TypeError(
            f"{parts.resolved.path}: {where}: the teacher's trainer backend computes no"
            ' logprobs of given tokens (no compute_logprobs); use name = "torch"'
        )
    issues = teacher_issues(parts.resolved)
    if issues:
        raise PlanError(issues)
    return TeacherScoring(estimator, teacher)
