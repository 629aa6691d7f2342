"""``rllm-core run``: resolve a plan, construct every component, run it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from rllm_core.cli.output import EXIT_FAILURE, console, fail, fail_plan
from rllm_core.cli.plan_cmd import SET_HELP
from rllm_core.errors import PlanError, PlanIssue
from rllm_core.plan import ResolvedPlan, resolve_plan_file
from rllm_core.plugins.catalog import FIRST_PARTY
from rllm_core.plugins.specs import Kind

REQUIRED: list[tuple[str, Kind, str]] = [
    ("[trainer]", Kind.TRAINER_BACKEND, "torch"),
    ("[renderer]", Kind.RENDERER, "chatml"),
    ("[harness]", Kind.HARNESS, "single-turn"),
    ("[tasks]", Kind.TASK_SOURCE, "jsonl"),
    ("[trace_store]", Kind.TRACE_STORE, "deltachain"),
    ("[algorithm].loss", Kind.LOSS, "dppo-tv"),
    ("[algorithm].advantage", Kind.ADVANTAGE_ESTIMATOR, "grpo"),
]
"""What a training run needs, with the first-party component to suggest for each."""


def missing_components(resolved: ResolvedPlan) -> list[PlanIssue]:
    issues = []
    for where, kind, example in REQUIRED:
        if resolved.get(where) is not None:
            continue
        section, _, key = where.strip("[").partition("]")
        key = key.lstrip(".") or None
        provider = FIRST_PARTY[kind][example]
        selector = f'{key} = "{example}"' if key else f'name = "{example}"'
        issues.append(
            PlanIssue(
                path=resolved.path,
                section=section,
                key=key,
                message=f"a run needs a {kind.label}, and the plan selects none",
                hint=f"add {selector} under [{section}] ({example} comes with {provider})",
            )
        )
    return issues


@click.command()
@click.argument("plan_path", metavar="PLAN", type=click.Path(path_type=Path))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help=SET_HELP)
def run(plan_path: Path, overrides: tuple[str, ...]) -> None:
    """Run the RL job described by PLAN."""
    try:
        resolved = resolve_plan_file(plan_path, overrides)
    except PlanError as exc:
        fail_plan(exc)
    missing = missing_components(resolved)
    if missing:
        fail_plan(PlanError(missing))
    built = []
    try:
        for component in resolved:
            try:
                built.append(component.build())
            except Exception as exc:
                fail(
                    f"{component.where}: building {component.kind.value}:{component.name}"
                    f" ({component.provider}) failed: {type(exc).__name__}: {exc}"
                )
            console.print(
                f"built {component.where}: {component.kind.value}:{component.name}", markup=False
            )
    finally:
        for instance in reversed(built):
            close = getattr(instance, "close", None)
            if callable(close) and not asyncio.iscoroutinefunction(close):
                close()
    fail(
        "every component was built, but this version of rllm-core has no training loop to"
        " run them; use `rllm-core plan check` to validate plans",
        EXIT_FAILURE,
    )
