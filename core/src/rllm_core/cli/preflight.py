"""What ``run`` and ``eval`` check before they create a folder or load a model.

The plan parses, validates and resolves; it selects every component the command needs; the
trainer's model is cached; the gateway can bind ``[gateway].host`` / ``[gateway].port``. Each
failure prints one message naming the file, the key and what to do, and exits 2.
"""

from __future__ import annotations

from pathlib import Path

from rllm_core.cli.output import EXIT_USAGE, fail, fail_plan
from rllm_core.docs_site import docs_page
from rllm_core.errors import ModelError, PlanError, PlanIssue
from rllm_core.plan import ResolvedPlan
from rllm_core.plugins.catalog import FIRST_PARTY
from rllm_core.plugins.specs import Kind

__all__ = ["SUGGESTED", "check_gateway", "missing_components", "resolve_or_exit"]

SUGGESTED: dict[str, tuple[Kind, str]] = {
    "[trainer]": (Kind.TRAINER_BACKEND, "torch"),
    "[renderer]": (Kind.RENDERER, "chatml"),
    "[harness]": (Kind.HARNESS, "single-turn"),
    "[tasks]": (Kind.TASK_SOURCE, "jsonl"),
    "[trace_store]": (Kind.TRACE_STORE, "deltachain"),
    "[algorithm].loss": (Kind.LOSS, "dppo-tv"),
    "[algorithm].advantage": (Kind.ADVANTAGE_ESTIMATOR, "grpo"),
}
"""Each component a run can need, with the first-party one to suggest when it is missing."""


def missing_components(resolved: ResolvedPlan, *, training: bool = True) -> list[PlanIssue]:
    """One issue per component a run (``training``) or an evaluation needs and the plan does
    not select."""
    from rllm_core.run.components import SAMPLING_COMPONENTS, TRAINING_COMPONENTS

    needed = TRAINING_COMPONENTS if training else SAMPLING_COMPONENTS
    what = "a run" if training else "an evaluation"
    issues = []
    for where in needed:
        if resolved.get(where) is not None:
            continue
        kind, example = SUGGESTED[where]
        section, _, key = where.strip("[").partition("]")
        key = key.lstrip(".") or None
        provider = FIRST_PARTY[kind][example]
        selector = f'{key} = "{example}"' if key else f'name = "{example}"'
        issues.append(
            PlanIssue(
                path=resolved.path,
                section=section,
                key=key,
                message=f"{what} needs a {kind.label}, and the plan selects none",
                hint=f"add {selector} under [{section}] ({example} comes with {provider})",
            )
        )
    return issues


def resolve_or_exit(
    plan_path: Path, overrides: tuple[str, ...], run_dir: Path, *, training: bool = True
) -> ResolvedPlan:
    """The plan prepared for a run in ``run_dir``
    (:func:`~rllm_core.run.components.prepare_plan`), or exit 2 with every plan problem,
    an uncached model or the components the command needs and the plan lacks."""
    from rllm_core.run.components import prepare_plan

    try:
        resolved = prepare_plan(plan_path, overrides, run_dir=run_dir, download=True)
    except PlanError as exc:
        fail_plan(exc)
    except ModelError as exc:
        fail(f"{plan_path}: [trainer].model: {exc}", EXIT_USAGE)
    if resolved.plan.is_sft:
        fail(
            f"{plan_path}: [sft]: this is a supervised fine-tuning plan; train it with"
            f" `rllm-core sft {plan_path}` ({docs_page('sft')}), or remove [sft] for an RL plan",
            EXIT_USAGE,
        )
    missing = missing_components(resolved, training=training)
    if missing:
        fail_plan(PlanError(missing))
    return resolved


def check_gateway(resolved: ResolvedPlan) -> None:
    """Exit 2 when the gateway cannot bind the plan's ``[gateway]`` address (a port in use);
    the model is not loaded yet, so this fails in a second, not after a minute."""
    from rllm_core.rollout.gateway_address import GatewayBindError, check_gateway_address

    gateway = resolved.plan.gateway
    try:
        check_gateway_address(gateway.host, gateway.port, plan_path=resolved.path)
    except GatewayBindError as exc:
        fail(str(exc), EXIT_USAGE)
