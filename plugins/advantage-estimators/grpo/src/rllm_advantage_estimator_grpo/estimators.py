"""Advantage estimators over grouped rewards, in pure Python.

``rewards[g][i]`` is the reward of rollout ``i`` of group ``g``. Every estimator returns
advantages of the same shape, counts the groups whose rewards are all equal (a group of one
rollout, or of none, counts: it carries no signal for a group baseline) and reports the mean, std
(population), min and max of all advantages as ``mean``, ``std``, ``min`` and ``max``.

Group-relative estimators give a zero-variance group exactly 0.0 for every rollout rather than
whatever rounding leaves of ``r - mean(r)``. Whether such groups are dropped from training is
decided by the run loop, not here. Sums use :func:`math.fsum`, so the result does not depend on
the order of rollouts within a group beyond the order of the output itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from pydantic import BaseModel
from rllm_core.ports import AdvantageResult
from rllm_core.types import Datum

from rllm_advantage_estimator_grpo.plugin import (
    DistillConfig,
    GRPOConfig,
    PRPOConfig,
    ReinforceAdvantageConfig,
    ReinforcePlusPlusBaselineConfig,
    StdKind,
)

__all__ = ["GRPO", "Distill", "PRPO", "RLOO", "Reinforce", "ReinforcePlusPlusBaseline"]


def _validated(rewards: Sequence[Sequence[float]]) -> list[list[float]]:
    out: list[list[float]] = []
    for g, group in enumerate(rewards):
        row: list[float] = []
        for i, reward in enumerate(group):
            try:
                value = float(reward)
            except (TypeError, ValueError):
                raise ValueError(
                    f"rewards[{g}][{i}] = {reward!r} is not a number; every reward must be a"
                    " finite float: check the verifier that produced it"
                ) from None
            if not math.isfinite(value):
                raise ValueError(
                    f"rewards[{g}][{i}] = {value!r} is not finite; every reward must be a finite"
                    " float: check the verifier that produced it"
                )
            row.append(value)
        out.append(row)
    return out


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def _std(values: Sequence[float], mean: float, kind: StdKind) -> float:
    """Standard deviation around ``mean``; 0.0 where it is undefined (fewer than 2 samples for
    the sample estimate, none for the population one)."""
    dof = len(values) - 1 if kind == "sample" else len(values)
    if dof <= 0:
        return 0.0
    return math.sqrt(math.fsum((v - mean) * (v - mean) for v in values) / dof)


def _all_equal(group: Sequence[float]) -> bool:
    """True for a group whose rewards are all equal, including groups of one or none."""
    return all(r == group[0] for r in group)


def _scaled(values: list[float], denominator: float) -> list[float]:
    # A zero denominator only arises when every value is zero (or epsilon is 0 and the spread
    # underflowed); the values are then already the right answer.
    if denominator > 0.0:
        return [v / denominator for v in values]
    return list(values)


def _result(advantages: list[list[float]], zero_variance_groups: int) -> AdvantageResult:
    flat = [a for group in advantages for a in group]
    if flat:
        mean = _mean(flat)
        metrics = {
            "mean": mean,
            "std": _std(flat, mean, "population"),
            "min": min(flat),
            "max": max(flat),
        }
    else:
        metrics = {"mean": 0.0, "std": 0.0, "min": 0.0, "max": 0.0}
    return AdvantageResult(
        advantages=advantages, zero_variance_groups=zero_variance_groups, metrics=metrics
    )


def _centered(group: list[float]) -> list[float]:
    if _all_equal(group):
        return [0.0] * len(group)
    mean = _mean(group)
    return [r - mean for r in group]


def _group_relative(
    rewards: Sequence[Sequence[float]], advantages_of: Callable[[list[float]], list[float]]
) -> AdvantageResult:
    """Apply ``advantages_of`` to every group that has a spread; all-equal groups (and groups of
    one) carry no signal, get 0.0 and are counted."""
    out: list[list[float]] = []
    zero = 0
    for group in _validated(rewards):
        if _all_equal(group):
            zero += 1
            out.append([0.0] * len(group))
        else:
            out.append(advantages_of(group))
    return _result(out, zero)


def _leave_one_out(group: list[float]) -> list[float]:
    n = len(group)
    total = math.fsum(group)
    return [r - (total - r) / (n - 1) for r in group]


class GRPO:
    """``A_i = (r_i - mean(r)) / (std(r) + epsilon)`` within each group; with
    ``normalize_std=false``, ``A_i = r_i - mean(r)`` (Dr. GRPO).

    ``std`` defaults to the sample (n-1) estimate: that is what ``torch.std`` computes and what
    the GRPO implementations used in published runs divide by, so advantages (and therefore
    learning rates) carry over. A group of one rollout has an undefined sample std; its
    advantage is 0.

    References: DeepSeekMath (arXiv 2402.03300); Dr. GRPO, "Understanding R1-Zero-Like
    Training" (arXiv 2503.20783).
    """

    def __init__(self, config: GRPOConfig) -> None:
        self.config = config

    def compute(self, rewards: Sequence[Sequence[float]]) -> AdvantageResult:
        return _group_relative(rewards, self._group)

    def _group(self, group: list[float]) -> list[float]:
        centered = _centered(group)
        if not self.config.normalize_std:
            return centered
        std = _std(group, _mean(group), self.config.std)
        return _scaled(centered, std + self.config.epsilon)


class RLOO:
    """Leave-one-out baseline: ``A_i = r_i - mean_{j != i}(r_j)``, which equals
    ``n / (n - 1) * (r_i - mean(r))``. A group of one rollout has no other rollout to compare
    with; its advantage is 0.

    Reference: Ahmadian et al., "Back to Basics: Revisiting REINFORCE Style Optimization for
    Learning from Human Feedback in LLMs" (arXiv 2402.14740).
    """

    def __init__(self, config: BaseModel) -> None:
        self.config = config

    def compute(self, rewards: Sequence[Sequence[float]]) -> AdvantageResult:
        return _group_relative(rewards, _leave_one_out)


class Reinforce:
    """``A_i = r_i - baseline`` with a constant baseline (0 by default). Groups play no role in
    the advantage; zero-variance groups are still counted for the run loop's statistics.

    Reference: Williams, "Simple Statistical Gradient-Following Algorithms for Connectionist
    Reinforcement Learning" (1992).
    """

    def __init__(self, config: ReinforceAdvantageConfig) -> None:
        self.config = config

    def compute(self, rewards: Sequence[Sequence[float]]) -> AdvantageResult:
        groups = _validated(rewards)
        baseline = self.config.baseline
        out = [[r - baseline for r in group] for group in groups]
        return _result(out, sum(1 for group in groups if _all_equal(group)))


class ReinforcePlusPlusBaseline:
    """REINFORCE++-baseline: ``c_i = r_i - mean(group)``, then ``A_i = c_i / (std(c) + epsilon)``
    where ``std(c)`` is taken over every centered reward of the batch (the mean of ``c`` over
    the batch is already 0). Zero-variance groups contribute zeros to the batch statistics and
    keep advantage 0.

    Reference: Hu et al., "REINFORCE++: A Simple and Efficient Approach for Aligning Large
    Language Models" (arXiv 2501.03262).
    """

    def __init__(self, config: ReinforcePlusPlusBaselineConfig) -> None:
        self.config = config

    def compute(self, rewards: Sequence[Sequence[float]]) -> AdvantageResult:
        groups = _validated(rewards)
        centered = [_centered(group) for group in groups]
        flat = [c for group in centered for c in group]
        if flat:
            std = _std(flat, _mean(flat), self.config.std)
            centered = [_scaled(group, std + self.config.epsilon) for group in centered]
        return _result(centered, sum(1 for group in groups if _all_equal(group)))


class PRPO:
    """Batch-wide normalization: ``A_i = (r_i - mean(batch)) / (std(batch) + epsilon)``, with
    mean and std over every reward of the batch regardless of group. A batch whose rewards are
    all equal gets advantage 0 everywhere.
    """

    def __init__(self, config: PRPOConfig) -> None:
        self.config = config

    def compute(self, rewards: Sequence[Sequence[float]]) -> AdvantageResult:
        groups = _validated(rewards)
        flat = [r for group in groups for r in group]
        zero = sum(1 for group in groups if _all_equal(group))
        if not flat or _all_equal(flat):
            return _result([[0.0] * len(group) for group in groups], zero)
        mean = _mean(flat)
        denominator = _std(flat, mean, self.config.std) + self.config.epsilon
        return _result([_scaled([r - mean for r in group], denominator) for group in groups], zero)


class Distill:
    """On-policy distillation (:class:`~rllm_core.ports.TokenAdvantages`): each token the
    policy sampled gets ``coef * (teacher_logprob - student_logprob)``, the negative of the
    per-token estimate of KL(student || teacher), with ``student_logprob`` the sampler's
    logprob recorded when the token was sampled; every other token gets 0.0. No discount: a
    token's advantage is its own term only.

    ``compute`` gives each episode ``reward_coef`` times its GRPO advantage (0.0 with the
    default ``reward_coef = 0``); the run merges it onto the episode's sampled tokens before
    ``token_advantages`` adds the teacher's signal to it.

    Reference: Agarwal et al., "On-Policy Distillation of Language Models" (arXiv
    2306.13649); Gu et al., "MiniLLM" (arXiv 2306.08543).
    """

    def __init__(self, config: DistillConfig) -> None:
        self.config = config
        self._grpo = GRPO(GRPOConfig())

    def compute(self, rewards: Sequence[Sequence[float]]) -> AdvantageResult:
        result = self._grpo.compute(rewards)
        coef = self.config.reward_coef
        scaled = [[coef * a for a in group] for group in result.advantages]
        return _result(scaled, result.zero_variance_groups)

    def token_advantages(
        self, datums: Sequence[Datum], teacher_logprobs: Sequence[Sequence[float]]
    ) -> list[list[float]]:
        coef = self.config.coef
        return [
            [
                base + coef * (float(teacher) - float(student)) if action else 0.0
                for base, teacher, student, action in zip(
                    datum.advantages, scored, datum.logprobs, datum.action_mask, strict=True
                )
            ]
            for datum, scored in zip(datums, teacher_logprobs, strict=True)
        ]
