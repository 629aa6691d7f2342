"""``rllm-core eval``: pass@k of a plan's model (base or checkpoint) on a task split."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from rllm_core.cli.output import EXIT_FAILURE, EXIT_USAGE, fail, fail_plan
from rllm_core.cli.plan_cmd import SET_HELP
from rllm_core.cli.preflight import check_gateway, resolve_or_exit
from rllm_core.cli.run_cmd import JSON_HELP, print_summary_json, stdout_to_stderr
from rllm_core.docs_site import docs_page
from rllm_core.errors import PlanError
from rllm_core.run.launch import in_one_process


@click.command(name="eval", epilog=f"\b\nGuide: {docs_page('running')}")
@click.argument("plan_path", metavar="PLAN", type=click.Path(path_type=Path))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help=SET_HELP)
@click.option(
    "--checkpoint",
    type=click.Path(path_type=Path),
    default=None,
    metavar="PATH",
    help=(
        "A run folder (its latest checkpoint) or a checkpoint folder of a run"
        " (checkpoints/objects/cuts/<cut>, or checkpoints/best with [run].keep_best) to load"
        " before sampling (default: the base model)."
    ),
)
@click.option(
    "--attempts",
    "-k",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Rollouts per task; a task passes when any attempt has reward >= 1 (pass@k).",
)
@click.option("--split", default="eval", show_default=True, help="The task split to evaluate.")
@click.option(
    "--limit", type=click.IntRange(min=1), default=None, help="Evaluate only the first N tasks."
)
@click.option(
    "--temperature",
    type=click.FloatRange(min=0.0),
    default=None,
    help="Sampling temperature (default: the plan's [sampling].temperature).",
)
@click.option("--plain", is_flag=True, help="One line per task instead of the progress bar.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help=JSON_HELP.format(what="evaluation", ignored="--plain has"),
)
def eval_(
    plan_path: Path,
    overrides: tuple[str, ...],
    checkpoint: Path | None,
    attempts: int,
    split: str,
    limit: int | None,
    temperature: float | None,
    plain: bool,
    as_json: bool,
) -> None:
    """Evaluate the model of PLAN on its evaluation tasks."""
    from rllm_core.evaluation import CheckpointNotFound, EvalFolder, checkpoint_state_dir
    from rllm_core.numerics import conditions, prepare_environment
    from rllm_core.plan.load import load_plan
    from rllm_core.run.components import BuildError, build_components
    from rllm_core.run.runlog import RunLog

    if temperature is not None:
        overrides = (*overrides, f"sampling.temperature={temperature!r}")
    state_dir = None
    if checkpoint is not None:
        try:
            state_dir = checkpoint_state_dir(checkpoint)
        except CheckpointNotFound as exc:
            fail(str(exc), EXIT_USAGE)
    try:
        plan, _ = load_plan(plan_path, overrides)
    except PlanError as exc:
        fail_plan(exc)
    placeholder = Path(plan.run.output_dir) / "<eval folder>"
    check_gateway(resolve_or_exit(plan_path, overrides, placeholder, training=False))
    folder = EvalFolder.create(plan.run.output_dir, plan.run.name)
    # Evaluating only samples: the trainer runs in this one process whatever its world size.
    resolved = in_one_process(resolve_or_exit(plan_path, overrides, folder.path, training=False))
    folder.write_plan(plan_path.read_text(encoding="utf-8"), resolved.to_dict())
    # With --json, stdout is kept for the summary object: everything else goes to stderr.
    console = Console(highlight=False, stderr=as_json)
    with stdout_to_stderr(as_json):
        console.print(f"eval folder: {folder.path}", markup=False, soft_wrap=True)
        deterministic = resolved.plan.run.deterministic
        prepare_environment(deterministic)
        with RunLog(folder.log):
            try:
                components = build_components(resolved, training=False)
            except BuildError as exc:
                fail(str(exc), EXIT_FAILURE)
            folder.record_numerics(conditions(deterministic, components.placed), resume=False)
            try:
                summary, failure = _evaluate(
                    console,
                    resolved,
                    components,
                    folder,
                    state_dir,
                    split,
                    limit,
                    attempts,
                    plain,
                    quiet=as_json,
                )
            finally:
                asyncio.run(components.aclose())
    if as_json:
        print_summary_json(summary, folder.path, folder.summary)
    if failure is not None:
        fail(
            f"{failure}\nResults of every attempt: {folder.results}, summary: {folder.summary}",
            EXIT_FAILURE,
        )
    if not as_json:
        console.print(json.dumps({"summary": str(folder.summary)}), markup=False)


def _evaluate(
    console: Console,
    resolved: Any,
    components: Any,
    folder: Any,
    state_dir: Path | None,
    split: str,
    limit: int | None,
    attempts: int,
    plain: bool,
    *,
    quiet: bool = False,
) -> tuple[Mapping[str, Any], Any]:
    """Run the evaluation and write its results; returns the summary, and the failure when
    every attempt failed on infrastructure (a ``TooManyFailedRollouts``), else None. Exits on
    anything that stops it earlier. ``quiet``: no progress lines and no summary line."""
    from rllm_core.evaluation import Evaluation
    from rllm_core.evaluation.display import make_display
    from rllm_core.rollout.gateway_address import GatewayBindError

    if state_dir is not None:
        try:
            components.trainer.load_state(str(state_dir))
        except Exception as exc:
            fail(
                f"cannot load checkpoint {str(state_dir.parent)!r}: {type(exc).__name__}: {exc}",
                EXIT_USAGE,
            )
    try:
        tasks = list(components.tasks.tasks(split))
    except KeyError as exc:
        fail(str(exc.args[0]) if exc.args else f"no split {split!r}", EXIT_USAGE)
    if limit is not None:
        tasks = tasks[:limit]
    if not tasks:
        fail(f"the task split {split!r} has no tasks; choose another with --split", EXIT_USAGE)
    display = _Silent() if quiet else make_display(console, len(tasks), attempts, plain=plain)
    evaluation = Evaluation(
        plan=resolved.plan,
        components=components,
        tasks=tasks,
        attempts=attempts,
        run_id=folder.path.name,
        on_event=display.on_event,
        plan_path=resolved.path,
    )
    try:
        outcome = asyncio.run(evaluation.run())
    except KeyboardInterrupt:
        display.close()
        fail("evaluation interrupted; no results written", 130)
    except GatewayBindError as exc:
        display.close()
        fail(str(exc), EXIT_USAGE)
    except Exception as exc:
        display.close()
        fail(f"the evaluation failed: {type(exc).__name__}: {exc}", EXIT_FAILURE)
    display.close()
    summary = outcome.summary | {
        "split": split,
        "checkpoint": str(state_dir.parent) if state_dir is not None else None,
        "eval_dir": str(folder.path),
    }
    folder.write_results(outcome.results, summary, outcome.episodes)
    display.finish(summary)
    return summary, outcome.failure


class _Silent:
    """No progress and no summary line (``--json`` prints the summary as its object)."""

    def on_event(self, event: Any) -> None:
        pass

    def finish(self, summary: Mapping[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass
