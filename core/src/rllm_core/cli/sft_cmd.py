"""``rllm-core sft``: supervised fine-tuning described by a plan's ``[sft]`` section
(``docs/sft.md``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from rllm_core.cli.output import EXIT_USAGE, err_console, fail, fail_plan
from rllm_core.cli.plan_cmd import SET_HELP
from rllm_core.cli.run_cmd import JSON_HELP, print_summary_json, stdout_to_stderr
from rllm_core.docs_site import docs_page
from rllm_core.errors import ModelError, PlanError, PlanIssue
from rllm_core.numerics import prepare_environment

SFT_COMPONENTS = ("[trainer]", "[renderer]")
"""What an SFT run needs besides ``[sft]``."""


@click.command(epilog=f"\b\nGuide: {docs_page('sft')}")
@click.argument("plan_path", metavar="PLAN", type=click.Path(path_type=Path))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help=SET_HELP)
@click.option(
    "--resume",
    "resume",
    type=click.Path(path_type=Path),
    default=None,
    metavar="RUN_FOLDER",
    help="Continue the SFT run in RUN_FOLDER from its last checkpoint (same plan).",
)
@click.option("--quiet", is_flag=True, help="Print only the run folder, warnings and errors.")
@click.option(
    "--json", "as_json", is_flag=True, help=JSON_HELP.format(what="run", ignored="--quiet has")
)
def sft(
    plan_path: Path, overrides: tuple[str, ...], resume: Path | None, quiet: bool, as_json: bool
) -> None:
    """Supervised fine-tuning with the [sft] section of PLAN.

    Trains on the assistant tokens of chat examples (or of a run's episodes) with the plan's
    [trainer] and [renderer], writing a run folder as `rllm-core run` does."""
    from rllm_core.cli.sft_display import SftDisplay
    from rllm_core.run.components import fills_total_steps
    from rllm_core.run.folder import RunFolder
    from rllm_core.run.start import RunRefused, build_one, check_same_plan
    from rllm_core.sft.data import DataError
    from rllm_core.sft.entry import fine_tune
    from rllm_core.sft.prepare import load_sft_data

    # With --json, stdout is kept for the summary object: everything else goes to stderr.
    console = Console(highlight=False, stderr=as_json)
    try:
        from rllm_core.plan.load import load_plan

        plan, _ = load_plan(plan_path, overrides)
    except PlanError as exc:
        fail_plan(exc)
    if not plan.is_sft:
        fail(
            f"{plan_path} has no [sft] section: `rllm-core sft` trains on examples it names"
            f" ({docs_page('sft')}); train with rewards through `rllm-core run`",
            EXIT_USAGE,
        )
    folder = RunFolder.existing(resume) if resume is not None and _exists(resume) else None
    run_dir = folder.path if folder is not None else Path(plan.run.output_dir) / "<run folder>"
    fill = fills_total_steps(plan)
    first = _resolve(plan_path, overrides, run_dir)
    try:
        renderer = build_one(first, "[renderer]")
    except RunRefused as exc:
        fail(str(exc), exc.exit_code)
    try:
        data = load_sft_data(first, renderer)
    except DataError as exc:
        fail(f"{plan_path}: {exc}", EXIT_USAGE)
    total = data.total_steps(first.plan)
    filled = (f"trainer.total_steps={total}",) if fill else ()
    if resume is not None:
        if folder is None:
            fail(f"{resume!r} is not a run folder (it has no plan.resolved.json)", EXIT_USAGE)
        resolved = _resolve(plan_path, (*overrides, *filled), folder.path)
        try:
            check_same_plan(resolved, folder, plan_path)
        except RunRefused as exc:
            fail(str(exc), exc.exit_code)
    else:
        _resolve(plan_path, (*overrides, *filled), run_dir)
        folder = RunFolder.create(plan.run.output_dir, plan.run.name)
        resolved = _resolve(plan_path, (*overrides, *filled), folder.path)
        folder.write_plan(plan_path.read_text(encoding="utf-8"), resolved.to_dict())
    with stdout_to_stderr(as_json):
        console.print(f"run folder: {folder.path}", markup=False, soft_wrap=True)
        display = SftDisplay(console, err_console, total, quiet=quiet or as_json)
        for note in resolved.notes:
            display.warn(note)
        for warning in data.warnings:
            display.warn(warning)
        held = f", {len(data.held_out)} held out" if data.held_out else ""
        display.info(
            f"{len(data.train)} training examples{held}; {total} optimizer steps"
            f" ({resolved.plan.sft.epochs} epoch(s) of batch_size {resolved.plan.sft.batch_size})"
        )
        prepare_environment(resolved.plan.run.deterministic)
        try:
            result = fine_tune(resolved, folder, data, display=display, resume=resume is not None)
        except RunRefused as exc:
            fail(str(exc), exc.exit_code)
    if as_json:
        print_summary_json(result.summary, folder.path, folder.summary)
    if result.status == "interrupted":
        command = f"rllm-core sft {plan_path} --resume {folder.path}"
        command += "".join(f" --set {item}" for item in overrides)
        print(f"stopped after step {result.step}; resume with: {command}", file=sys.stderr)
    sys.exit(result.exit_code)


def _exists(path: Path) -> bool:
    return (path / "plan.resolved.json").is_file()


def _resolve(plan_path: Path, overrides: tuple[str, ...], run_dir: Path) -> Any:
    """The plan prepared for an SFT run in ``run_dir``, or exit 2 naming every problem."""
    from rllm_core.run.components import prepare_plan

    try:
        resolved = prepare_plan(plan_path, overrides, run_dir=run_dir, download=True)
    except PlanError as exc:
        fail_plan(exc)
    except ModelError as exc:
        fail(f"{plan_path}: [trainer].model: {exc}", EXIT_USAGE)
    missing = [
        PlanIssue(
            path=str(plan_path),
            section=where.strip("[]"),
            key="name",
            message="an SFT run needs it, and the plan selects none",
            hint=f'add a {where} section (name = "{example}")',
        )
        for where, example in zip(SFT_COMPONENTS, ("torch", "chatml"), strict=True)
        if resolved.get(where) is None
    ]
    if missing:
        fail_plan(PlanError(missing))
    return resolved
