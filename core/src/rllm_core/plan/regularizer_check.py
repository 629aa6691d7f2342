"""What ``plan check`` refuses of the objective's regularizers: ``[algorithm.kl] coef > 0``
on a trainer backend that cannot compute reference logprobs for the chosen placement (its
spec's trait ``reference_kl``, the placements it honours), and ``[algorithm].entropy_coef >
0`` on one that cannot pass the policy's entropy (trait ``entropy``). A backend may declare
``reference_kl_refusal`` and ``entropy_refusal``, a sentence saying why it cannot, which the
issue quotes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rllm_core.errors import PlanIssue
from rllm_core.plan.schema import Plan

__all__ = ["regularizer_issues"]


def regularizer_issues(plan: Plan, components: Mapping[str, Any], path: str) -> list[PlanIssue]:
    """The issues of ``plan``'s KL and entropy settings against its ``[trainer]`` component
    (none when the plan names no trainer)."""
    trainer = components.get("[trainer]")
    if trainer is None:
        return []
    spec = trainer.spec
    algorithm = plan.algorithm
    issues = []
    kl = algorithm.kl
    if kl.coef > 0:
        placements = tuple(spec.trait("reference_kl") or ())
        if kl.apply_in not in placements:
            reason = spec.trait("reference_kl_refusal") or "it has no reference model to score"
            offers = (
                f" (it offers in = {' or '.join(repr(p) for p in placements)})"
                if placements
                else ""
            )
            issues.append(
                PlanIssue(
                    path=path,
                    section="algorithm.kl",
                    key="coef",
                    value=kl.coef,
                    message=(
                        f"trainer backend {trainer.name!r} cannot compute the KL to the reference"
                        f' model with in = "{kl.apply_in}": {reason}{offers}'
                    ),
                    hint=(
                        "set [algorithm.kl] coef = 0, choose an `in` it offers, or use a trainer"
                        " backend that computes reference logprobs (torch)"
                    ),
                )
            )
    if algorithm.entropy_coef > 0 and not spec.trait("entropy"):
        reason = spec.trait("entropy_refusal") or "it does not compute the policy's entropy"
        issues.append(
            PlanIssue(
                path=path,
                section="algorithm",
                key="entropy_coef",
                value=algorithm.entropy_coef,
                message=(
                    f"trainer backend {trainer.name!r} cannot add the entropy bonus: {reason}"
                ),
                hint="set entropy_coef = 0 or use a trainer backend that computes it (torch)",
            )
        )
    return issues
