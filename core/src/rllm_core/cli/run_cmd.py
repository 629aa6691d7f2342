"""``rllm-core run``: resolve a plan, build its components and train (``docs/running.md``)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from rllm_core.cli.output import EXIT_FAILURE, EXIT_USAGE, fail, fail_plan
from rllm_core.cli.plan_cmd import SET_HELP
from rllm_core.errors import ModelError, PlanError, PlanIssue
from rllm_core.plan import ResolvedPlan
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


def _resolve(plan_path: Path, overrides: tuple[str, ...], run_dir: Path) -> ResolvedPlan:
    from rllm_core.training.components import prepare_plan

    try:
        resolved = prepare_plan(plan_path, overrides, run_dir=run_dir)
    except PlanError as exc:
        fail_plan(exc)
    except ModelError as exc:
        fail(str(exc), EXIT_USAGE)
    missing = missing_components(resolved)
    if missing:
        fail_plan(PlanError(missing))
    return resolved


def _comparable(data: dict) -> dict:
    plan = dict(data["plan"])
    plan["run"] = {k: v for k, v in plan.get("run", {}).items() if k != "steps"}
    return plan


@click.command()
@click.argument("plan_path", metavar="PLAN", type=click.Path(path_type=Path))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help=SET_HELP)
@click.option(
    "--resume",
    "resume",
    type=click.Path(path_type=Path),
    default=None,
    metavar="RUN_FOLDER",
    help="Continue the run in RUN_FOLDER from its last checkpoint (same plan; run.steps may grow).",
)
@click.option("--quiet", is_flag=True, help="Print only the run folder, warnings and errors.")
@click.option("--plain", is_flag=True, help="One line per step instead of the live display.")
@click.option(
    "--record-datums",
    is_flag=True,
    help="Also write datums.jsonl: every trained datum's tokens, masks and logprobs.",
)
def run(
    plan_path: Path,
    overrides: tuple[str, ...],
    resume: Path | None,
    quiet: bool,
    plain: bool,
    record_datums: bool,
) -> None:
    """Train with the RL job described by PLAN; see docs/running.md."""
    from rllm_core.training.components import BuildError, build_components
    from rllm_core.training.display import make_display
    from rllm_core.training.folder import RunFolder
    from rllm_core.training.loop import ResumeError, TrainingLoop

    console = Console(highlight=False)
    if resume is not None:
        try:
            folder = RunFolder.existing(resume)
        except FileNotFoundError as exc:
            fail(str(exc), EXIT_USAGE)
        resolved = _resolve(plan_path, overrides, folder.path)
        if _comparable(resolved.to_dict()) != _comparable(folder.read_resolved()):
            fail(
                f"{plan_path} (with these --set values) differs from the plan {folder.path} was"
                f" started with (beyond run.steps); resume with that plan: {folder.plan_file}",
                EXIT_USAGE,
            )
    else:
        try:
            from rllm_core.plan.load import load_plan

            plan, _ = load_plan(plan_path, overrides)
        except PlanError as exc:
            fail_plan(exc)
        placeholder = Path(plan.run.output_dir) / "<run folder>"
        _resolve(plan_path, overrides, placeholder)
        folder = RunFolder.create(plan.run.output_dir, plan.run.name)
        resolved = _resolve(plan_path, overrides, folder.path)
        folder.write_plan(plan_path.read_text(encoding="utf-8"), resolved.to_dict())
    console.print(f"run folder: {folder.path}", markup=False, soft_wrap=True)
    display = make_display(console, resolved.plan.run.steps, quiet=quiet, plain=plain)
    try:
        try:
            components = build_components(
                resolved,
                on_built=lambda c: display.info(f"built {c.where}: {c.kind.value}:{c.name}"),
            )
        except BuildError as exc:
            fail(str(exc), EXIT_FAILURE)
        loop = TrainingLoop(
            resolved=resolved,
            components=components,
            folder=folder,
            display=display,
            resume=resume is not None,
            record_datums=record_datums,
        )
        try:
            result = asyncio.run(_run(loop, components))
        except ResumeError as exc:
            fail(str(exc), EXIT_USAGE)
        except Exception as exc:
            fail(
                f"the run failed: {type(exc).__name__}: {exc}; finished checkpoints in"
                f" {folder.checkpoints} are intact",
                EXIT_FAILURE,
            )
    finally:
        display.close()
    if result.status == "interrupted":
        command = f"rllm-core run {plan_path} --resume {folder.path}"
        if overrides:
            command += "".join(f" --set {item}" for item in overrides)
        print(
            f"stopped after step {result.step}; resume with: {command}",
            file=sys.stderr,
        )
    elif not quiet:
        console.print(json.dumps({"summary": str(folder.summary)}), markup=False)
    sys.exit(result.exit_code)


async def _run(loop: Any, components: Any) -> Any:
    try:
        return await loop.run()
    finally:
        await components.aclose()
