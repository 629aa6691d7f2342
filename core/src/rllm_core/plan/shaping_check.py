"""What ``plan check`` refuses of the reward shaping (:mod:`rllm_core.algorithms.shaping`):
a soft overlong buffer as long as ``[sampling].max_tokens`` or longer (the penalty would start
before the first token), a soft punishment whose ``penalty_factor`` is 0 (it would change
nothing), a ``penalty_factor`` written for another mode than ``soft`` (nothing reads it), and
reward shaping (the soft overlong punishment, ``length_penalty``) under
an advantage estimator whose config says it reads no reward (``reads_rewards`` false, see
:class:`~rllm_core.ports.AdvantageEstimator`): the shaped reward would reach nothing."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rllm_core.errors import PlanIssue
from rllm_core.plan.schema import Plan

__all__ = ["shaping_issues"]


def shaping_issues(
    plan: Plan, path: str, components: Mapping[str, Any] | None = None
) -> list[PlanIssue]:
    """The issues of ``plan``'s ``[algorithm.overlong]`` against its ``[sampling]``, and of
    its reward shaping against the advantage estimator in ``components``."""
    overlong = plan.algorithm.overlong
    max_tokens = plan.sampling.max_tokens
    issues: list[PlanIssue] = []

    def refuse(key: str, value: object, message: str, hint: str) -> None:
        issues.append(
            PlanIssue(
                path=path,
                section="algorithm.overlong",
                key=key,
                value=value,
                message=message,
                hint=hint,
            )
        )

    buffer = overlong.buffer_tokens
    if overlong.mode == "soft" and buffer is not None and buffer >= max_tokens:
        refuse(
            "buffer_tokens",
            buffer,
            f"[algorithm.overlong] buffer_tokens = {buffer} is not below [sampling] max_tokens"
            f" = {max_tokens}: the soft punishment runs over the last buffer_tokens before the"
            " limit, so it would already apply to an empty completion",
            f"set buffer_tokens below {max_tokens} (DAPO uses a fifth of max_tokens or so), or"
            " raise [sampling] max_tokens",
        )
    if overlong.mode == "soft" and overlong.penalty_factor == 0:
        refuse(
            "penalty_factor",
            0.0,
            "a soft overlong punishment with penalty_factor = 0 never changes a reward",
            'set penalty_factor above 0, or mode = "off"',
        )
    if overlong.mode != "soft" and "penalty_factor" in overlong.model_fields_set:
        refuse(
            "penalty_factor",
            overlong.penalty_factor,
            f"penalty_factor is only read by mode 'soft' (mode is {overlong.mode!r})",
            "remove penalty_factor, or set mode = 'soft' with buffer_tokens",
        )
    issues.extend(_unread_shaping(plan, path, components or {}))
    return issues


def _unread_shaping(plan: Plan, path: str, components: Mapping[str, Any]) -> list[PlanIssue]:
    estimator = components.get("[algorithm].advantage")
    if estimator is None or getattr(estimator.config, "reads_rewards", True):
        return []
    algorithm = plan.algorithm
    shaped: list[tuple[str, str, object]] = []
    if algorithm.overlong.mode == "soft":
        shaped.append(("algorithm.overlong", "mode", "soft"))
    if algorithm.length_penalty > 0:
        shaped.append(("algorithm", "length_penalty", algorithm.length_penalty))
    return [
        PlanIssue(
            path=path,
            section=section,
            key=key,
            value=value,
            message=(
                f"[{section}] {key} = {value!r} shapes the reward, but advantage estimator"
                f" {estimator.name!r} as configured reads no reward, so the shaping would change"
                " nothing"
            ),
            hint=(
                "remove it, give the estimator a reward weight (distill: reward_coef > 0), or"
                " use a reward-based estimator"
            ),
        )
        for section, key, value in shaped
    ]
