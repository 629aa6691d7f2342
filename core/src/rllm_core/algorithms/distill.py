"""On-policy distillation: a teacher model scores the tokens the policy sampled.

An advantage estimator that offers :class:`~rllm_core.ports.TokenAdvantages` names a teacher
(a trainer backend that offers :class:`~rllm_core.ports.LogprobScorer`) under its config key
``teacher`` (its spec has the trait ``teacher``; see :mod:`rllm_core.plan.teacher`). After
the datum builder merged a batch's datums with the reward advantages, :class:`TeacherScoring`
asks the teacher for the logprobs of every datum's tokens and the estimator for per-token
advantages from them, and reports, over the batch's action tokens:

- ``distill/reverse_kl``: the mean of ``student_logprob - teacher_logprob``, the per-token
  estimate of KL(student || teacher) on the student's own samples;
- ``distill/teacher_logprob_mean``: the mean of the teacher's logprobs.

Works on prefix-merged multi-turn datums as they are: prompt and observation tokens get no
signal, only the tokens the policy sampled. Pure Python over lists; the teacher computes.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Sequence

import msgspec

from rllm_core.algorithms.groups import DatumBatch
from rllm_core.ports import LogprobScorer, TokenAdvantages
from rllm_core.types import Datum

__all__ = [
    "DISTILL_REVERSE_KL",
    "DISTILL_TEACHER_LOGPROB",
    "TEACHER_KEY",
    "TEACHER_TRAIT",
    "TeacherScoring",
    "distill_metrics",
    "teacher_where",
]

DISTILL_REVERSE_KL = "distill/reverse_kl"
DISTILL_TEACHER_LOGPROB = "distill/teacher_logprob_mean"

TEACHER_TRAIT = "teacher"
"""The advantage estimator spec's trait saying that its config holds a teacher."""

TEACHER_KEY = "teacher"
"""The key of such an estimator's config that holds the teacher's table."""


def teacher_where() -> str:
    """Where a resolved plan keeps the teacher of ``[algorithm].advantage``."""
    return f"[algorithm].advantage.{TEACHER_KEY}"


def distill_metrics(
    datums: Sequence[Datum], teacher_logprobs: Sequence[Sequence[float]]
) -> dict[str, float]:
    """``distill/reverse_kl`` and ``distill/teacher_logprob_mean`` over the action tokens of
    ``datums`` (0.0 without any); see the module docstring."""
    gaps: list[float] = []
    teacher: list[float] = []
    for datum, scored in zip(datums, teacher_logprobs, strict=True):
        for student, mine, action in zip(datum.logprobs, scored, datum.action_mask, strict=True):
            if action:
                gaps.append(float(student) - float(mine))
                teacher.append(float(mine))
    n = len(gaps)
    return {
        DISTILL_REVERSE_KL: math.fsum(gaps) / n if n else 0.0,
        DISTILL_TEACHER_LOGPROB: math.fsum(teacher) / n if n else 0.0,
    }


class TeacherScoring:
    """Replaces the advantages of a built batch with ``estimator``'s per-token advantages
    from ``teacher``'s logprobs (see the module docstring).

    Calls into the teacher are serialized: batches rolled out concurrently score one at a
    time. :meth:`ascore` runs the teacher off the event loop, so the gateway keeps serving the
    rollouts still running.
    """

    def __init__(self, estimator: TokenAdvantages, teacher: LogprobScorer) -> None:
        self.estimator = estimator
        self.teacher = teacher
        self._lock = threading.Lock()

    def score(self, batch: DatumBatch) -> tuple[DatumBatch, dict[str, float]]:
        """``batch`` with the per-token advantages, and the distillation metrics.

        Raises ``ValueError`` when the teacher or the estimator returns another shape than
        the datums, or a non-finite advantage."""
        datums = batch.datums
        if not datums:
            return batch, distill_metrics((), ())
        with self._lock:
            scored = self.teacher.compute_logprobs(datums)
        self._check(datums, scored, "teacher", "logprobs")
        advantages = self.estimator.token_advantages(datums, scored)
        self._check(datums, advantages, type(self.estimator).__name__, "advantages")
        for d, (datum, row) in enumerate(zip(datums, advantages, strict=True)):
            for t, (value, action) in enumerate(zip(row, datum.action_mask, strict=True)):
                if not math.isfinite(value) or (value != 0.0 and not action):
                    raise ValueError(
                        f"{type(self.estimator).__name__} gave datum {d} token {t} the"
                        f" advantage {value!r}; token advantages must be finite and 0 off"
                        " the action mask"
                    )
        samples = tuple(
            msgspec.structs.replace(
                sample, datum=msgspec.structs.replace(sample.datum, advantages=list(row))
            )
            for sample, row in zip(batch.samples, advantages, strict=True)
        )
        return DatumBatch(samples=samples, report=batch.report), distill_metrics(datums, scored)

    async def ascore(self, batch: DatumBatch) -> tuple[DatumBatch, dict[str, float]]:
        """:meth:`score` in a worker thread."""
        return await asyncio.to_thread(self.score, batch)

    @staticmethod
    def _check(
        datums: Sequence[Datum], rows: Sequence[Sequence[float]], who: str, what: str
    ) -> None:
        expected = [len(datum.token_ids) for datum in datums]
        got = [len(row) for row in rows]
        if expected != got:
            raise ValueError(
                f"{who} returned {what} of lengths {got} for datums of lengths {expected};"
                " it must return one value per token of each datum"
            )
