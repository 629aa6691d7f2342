"""A loss that pins its aggregation, and what the run reduces with.

A loss whose formula holds for one aggregation mode only says so through its config's optional
method ``pinned_aggregation()``, which returns that mode (one of
:data:`~rllm_core.algorithms.aggregation.AGGREGATION_MODES`) or ``None`` for no pin. The loss
itself reduces with ``ctx.aggregate(values, mask, mode=<that mode>)``, so it computes what it
promises whatever the objective's mode. Against the plan:

- ``[algorithm].aggregation`` left unset: the run uses the pinned mode for the whole objective
  (every loss and the regularizers), and ``plan check`` notes it;
- set to the pinned mode: nothing to say;
- set to another mode, or two losses pinning different modes: ``plan check`` refuses the plan,
  naming the loss, its pin and the key;
- a pin to ``seq-mean-token-sum-norm`` needs ``[algorithm].norm_length``, as the plan's own
  choice of that mode does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rllm_core.errors import PlanIssue
from rllm_core.plan.schema import Plan

__all__ = ["PIN_METHOD", "aggregation_issues", "aggregation_notes", "effective_aggregation"]

PIN_METHOD = "pinned_aggregation"
"""The name of the optional loss-config method that returns the mode a loss pins."""

_NORM_MODE = "seq-mean-token-sum-norm"


def _pins(components: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """``(where, loss name, mode)`` of every loss of the objective whose config pins a mode."""
    out = []
    for where, component in components.items():
        if not (where == "[algorithm].loss" or where.startswith("[algorithm].aux_losses")):
            continue
        if getattr(component, "coef", None) == 0:
            continue
        method = getattr(component.config, PIN_METHOD, None)
        mode = method() if callable(method) else None
        if mode is not None:
            out.append((where, component.name, mode))
    return out


def effective_aggregation(plan: Plan, components: Mapping[str, Any]) -> str:
    """The mode the run's objective reduces with: the one a loss pins when the plan leaves
    ``[algorithm].aggregation`` unset, else the plan's (``plan check`` has refused a plan
    whose pins disagree with it)."""
    algorithm = plan.algorithm
    pins = _pins(components)
    if pins and "aggregation" not in algorithm.model_fields_set:
        return pins[0][2]
    return algorithm.aggregation


def aggregation_issues(plan: Plan, components: Mapping[str, Any], path: str) -> list[PlanIssue]:
    """The issues of the plan's aggregation against the losses that pin one."""
    from rllm_core.algorithms.aggregation import AGGREGATION_MODES

    algorithm = plan.algorithm
    explicit = "aggregation" in algorithm.model_fields_set
    issues = []
    pins = _pins(components)
    for where, name, mode in pins:
        if mode not in AGGREGATION_MODES:
            issues.append(
                PlanIssue(
                    path=path,
                    section="algorithm",
                    key=where.removeprefix("[algorithm]."),
                    value=mode,
                    message=(
                        f"loss {name!r} pins the aggregation mode {mode!r}, which the core does"
                        f" not have (valid: {', '.join(AGGREGATION_MODES)})"
                    ),
                    hint=f"fix the loss's {PIN_METHOD}() or report it to its authors",
                )
            )
    valid = [pin for pin in pins if pin[2] in AGGREGATION_MODES]
    if not valid:
        return issues
    wanted = algorithm.aggregation if explicit else valid[0][2]
    for where, name, mode in valid:
        if mode == wanted:
            continue
        if explicit:
            message = (
                f"loss {name!r} ({where}) pins the aggregation {mode!r}: its formula holds for"
                f" that mode only, and [algorithm].aggregation = {wanted!r} disagrees"
            )
        else:
            first_where, first, _ = valid[0]
            message = (
                f"loss {name!r} ({where}) pins the aggregation {mode!r} and loss {first!r}"
                f" ({first_where}) pins {wanted!r}; one objective reduces with one mode"
            )
        issues.append(
            PlanIssue(
                path=path,
                section="algorithm",
                key="aggregation",
                value=algorithm.aggregation if explicit else mode,
                message=message,
                hint=(
                    f'set [algorithm].aggregation = "{mode}" or remove the key, or choose'
                    " losses that agree"
                    if explicit
                    else "choose losses that pin the same mode, or unpin one"
                ),
            )
        )
    if wanted == _NORM_MODE and not explicit and algorithm.norm_length is None:
        where, name, _ = valid[0]
        issues.append(
            PlanIssue(
                path=path,
                section="algorithm",
                key="norm_length",
                value=None,
                message=(
                    f"loss {name!r} ({where}) pins the aggregation {_NORM_MODE!r}, which"
                    " divides each sequence's token sum by a constant length"
                ),
                hint="set [algorithm].norm_length (for example [sampling].max_tokens)",
            )
        )
    return issues


def aggregation_notes(plan: Plan, components: Mapping[str, Any], path: str) -> list[str]:
    """A note when the run reduces with a loss's pinned mode in place of the default."""
    pins = [pin for pin in _pins(components) if pin[2] != plan.algorithm.aggregation]
    if not pins or "aggregation" in plan.algorithm.model_fields_set:
        return []
    where, name, mode = pins[0]
    return [
        f"{path}: [algorithm].aggregation: unset, and loss {name!r} ({where}) pins {mode!r};"
        f' the run reduces with {mode!r} (set aggregation = "{mode}" to say so in the plan)'
    ]
