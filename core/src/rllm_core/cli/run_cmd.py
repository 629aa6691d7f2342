"""``rllm-core run``: resolve a plan, build its components and train (``docs/running.md``)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from rllm_core.cli.output import (
    EXIT_FAILURE,
    EXIT_USAGE,
    err_console,
    fail,
    fail_plan,
    print_json,
)
from rllm_core.cli.plan_cmd import SET_HELP
from rllm_core.cli.preflight import check_gateway, resolve_or_exit
from rllm_core.docs_site import docs_page
from rllm_core.errors import PlanError
from rllm_core.numerics import prepare_environment

JSON_HELP = (
    "Print only one JSON object on stdout, at the end: the {what}'s summary.json plus its"
    ' folder ("run_folder") and that file ("summary"), also when it stops or fails after'
    " writing the summary. Messages, warnings and errors go to stderr ({ignored} no"
    " effect); a failure before there is a summary prints nothing on stdout. Exit"
    " statuses are as without --json."
)
"""The ``--json`` help of the commands that end with a summary (``run``, ``eval``, ``sft``)."""


@contextlib.contextmanager
def stdout_to_stderr(on: bool = True) -> Iterator[None]:
    """With ``on``, what is written to stdout inside the block goes to stderr: through
    ``sys.stdout`` and through file descriptor 1, which libraries, extensions and subprocesses
    write to. A ``--json`` command keeps stdout for its one JSON object."""
    if not on:
        yield
        return
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 1)
        os.close(saved)


def print_summary_json(summary: Mapping[str, Any], folder: Path, summary_file: Path) -> None:
    """What ``--json`` prints: ``summary`` (the content of ``summary_file``, read back when it
    was written) with the folder and the summary file's paths."""
    try:
        written = json.loads(summary_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        written = None
    content = written if isinstance(written, dict) else dict(summary)
    print_json(content | {"run_folder": str(folder), "summary": str(summary_file)})


@click.command(epilog=f"\b\nGuides: {docs_page('running')}\n        {docs_page('scaling')}")
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
    "--role",
    type=click.Choice(["both", "sampler", "trainer"]),
    default="both",
    show_default=True,
    help=(
        "both: sample and train in this process. sampler / trainer: one side of an async run"
        " whose processes share the plan's [object_store] (see the running guide below). A sampler"
        " runs in one process whatever [trainer].parallel.world_size says."
    ),
)
@click.option(
    "--incarnation",
    type=click.IntRange(min=1),
    default=None,
    help=(
        "With --role trainer: run this one trainer incarnation as a job of a scheduler"
        " ([scheduler].launcher), reading its command file from the [object_store]."
    ),
)
@click.option(
    "--node-class",
    default=None,
    metavar="CLASS",
    help=(
        "With --role trainer and [scheduler].nodes: only nodes of this class (a table of"
        " [scheduler.node_classes]) become the trainer."
    ),
)
@click.option(
    "--record-datums",
    is_flag=True,
    help="Also write datums.jsonl: every trained datum's tokens, masks and logprobs.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help=JSON_HELP.format(what="run", ignored="--quiet and --plain have"),
)
def run(
    plan_path: Path,
    overrides: tuple[str, ...],
    resume: Path | None,
    quiet: bool,
    plain: bool,
    role: str,
    incarnation: int | None,
    node_class: str | None,
    record_datums: bool,
    as_json: bool,
) -> None:
    """Train with the RL job described by PLAN.

    With ``[trainer].parallel.world_size`` above 1 it starts that many processes through
    ``torchrun`` (or is one of them)."""
    from rllm_core.run.launch import distributed_env, report_rank0

    try:
        group = distributed_env()
    except ValueError as exc:
        fail(str(exc), EXIT_USAGE)
    if group is not None and role == "sampler":
        fail(
            f"--role sampler runs in one process, and torchrun started this one as rank"
            f" {group.rank} of {group.world_size}: start the sampler without torchrun",
            EXIT_USAGE,
        )
    if incarnation is not None and role != "trainer":
        fail(
            f"--incarnation {incarnation} is one trainer incarnation: use it with --role trainer",
            EXIT_USAGE,
        )
    if node_class is not None and (role != "trainer" or incarnation is not None):
        fail(
            f"--node-class {node_class} chooses which nodes the scheduler converts into the"
            " trainer: use it with --role trainer (without --incarnation)",
            EXIT_USAGE,
        )
    if group is not None and group.rank > 0:
        with stdout_to_stderr(as_json):
            _follow(plan_path, overrides, group)
    launch_args = _run_args(
        plan_path, overrides, resume, quiet, plain, role, record_datums, as_json
    )
    with report_rank0():
        _run(
            plan_path,
            overrides,
            resume,
            quiet,
            plain,
            role,
            record_datums,
            group,
            launch_args,
            as_json,
            incarnation,
            node_class,
        )


def _run(
    plan_path: Path,
    overrides: tuple[str, ...],
    resume: Path | None,
    quiet: bool,
    plain: bool,
    role: str,
    record_datums: bool,
    group: Any,
    launch_args: list[str],
    as_json: bool = False,
    incarnation: int | None = None,
    node_class: str | None = None,
) -> None:
    from rllm_core.cli.run_display import make_display
    from rllm_core.run.folder import RunFolder
    from rllm_core.run.start import RunRefused, check_same_plan
    from rllm_core.training.entry import check_role, train

    # With --json, stdout is kept for the summary object: everything else goes to stderr.
    console = Console(highlight=False, stderr=as_json)
    if role != "both" and resume is not None:
        fail(
            f"--resume {resume} continues a one-process run; a --role {role} process continues"
            " from the run's state in the [object_store]: start it again without --resume",
            EXIT_USAGE,
        )
    try:
        if resume is not None:
            try:
                folder = RunFolder.existing(resume)
            except FileNotFoundError as exc:
                fail(str(exc), EXIT_USAGE)
            resolved = resolve_or_exit(plan_path, overrides, folder.path)
            check_same_plan(
                resolved,
                folder,
                plan_path,
                beyond=" (beyond run.steps and trainer.parallel.world_size)",
            )
            check_gateway(resolved)
            resolved = _place(resolved, role, group, launch_args)
        else:
            try:
                from rllm_core.plan.load import load_plan

                plan, _ = load_plan(plan_path, overrides)
            except PlanError as exc:
                fail_plan(exc)
            if plan.is_sft:
                fail(
                    f"{plan_path}: [sft]: this is a supervised fine-tuning plan; train it with"
                    f" `rllm-core sft {plan_path}` ({docs_page('sft')}), or remove [sft] for an"
                    " RL plan",
                    EXIT_USAGE,
                )
            # Everything that can fail on the plan fails here, before the folder exists.
            placeholder = Path(plan.run.output_dir) / "<run folder>"
            checked = resolve_or_exit(plan_path, overrides, placeholder)
            check_gateway(checked)
            _place(checked, role, group, launch_args)
            check_role(role, checked, node_class)
            folder = RunFolder.create(plan.run.output_dir, plan.run.name)
            resolved = _place(resolve_or_exit(plan_path, overrides, folder.path), role, group, None)
            folder.write_plan(plan_path.read_text(encoding="utf-8"), resolved.to_dict())
        with stdout_to_stderr(as_json):
            console.print(f"run folder: {folder.path}", markup=False, soft_wrap=True)
            for note in resolved.notes:
                err_console.print(f"warning: {note}", markup=False)
            display = make_display(
                console, resolved.plan.run.steps, quiet=quiet or as_json, plain=plain
            )
            prepare_environment(resolved.plan.run.deterministic)
            try:
                result = train(
                    resolved,
                    folder,
                    display=display,
                    role=role,
                    world_size=group.world_size if group is not None else None,
                    resume=resume is not None,
                    record_datums=record_datums,
                    warn=lambda message: err_console.print(f"warning: {message}", markup=False),
                    incarnation=incarnation,
                    overrides=overrides,
                    node_class=node_class,
                )
            finally:
                display.close()
    except RunRefused as exc:
        fail(str(exc), exc.exit_code)
    if as_json:
        print_summary_json(result.summary, folder.path, folder.summary)
    if result.status == "failed" and role == "trainer":
        fail(f"{result.reason}\nsummary: {folder.summary}", result.exit_code)
    if result.status == "failed":
        fail(
            f"{result.reason}\nThe run stopped at step {result.step + 1} without training it;"
            f" finished checkpoints in {folder.checkpoints} are intact, summary: {folder.summary}",
            EXIT_FAILURE,
        )
    if result.status == "interrupted":
        command = f"rllm-core run {plan_path} --resume {folder.path}"
        if overrides:
            command += "".join(f" --set {item}" for item in overrides)
        print(
            f"stopped after step {result.step}; resume with: {command}",
            file=sys.stderr,
        )
    elif not quiet and not as_json:
        console.print(json.dumps({"summary": str(folder.summary)}), markup=False)
    sys.exit(result.exit_code)


def _run_args(
    plan_path: Path,
    overrides: tuple[str, ...],
    resume: Path | None,
    quiet: bool,
    plain: bool,
    role: str,
    record_datums: bool,
    as_json: bool = False,
) -> list[str]:
    """This command's arguments, for the ranks the launcher starts."""
    args = ["run", str(plan_path)]
    for item in overrides:
        args += ["--set", item]
    if resume is not None:
        args += ["--resume", str(resume)]
    args += [flag for flag, on in (("--quiet", quiet), ("--plain", plain)) if on]
    if role != "both":
        args += ["--role", role]
    if record_datums:
        args.append("--record-datums")
    if as_json:
        args.append("--json")
    return args


def _parallel(resolved: Any) -> Any:
    """The trainer's ``parallel`` settings, or None when its backend has none."""
    from rllm_core.ports import ParallelSettings

    trainer = resolved.get("[trainer]")
    parallel = getattr(trainer.config, "parallel", None) if trainer is not None else None
    return parallel if isinstance(parallel, ParallelSettings) else None


def _place(resolved: Any, role: str, group: Any, launch_args: list[str] | None) -> Any:
    """Where this process stands in a run of ``parallel.world_size`` processes.

    Under torchrun the world sizes must agree. Otherwise, with a world size above 1 and
    ``launch_args``, this process becomes the launcher of the ranks and exits with rank 0's
    code. A sampler role always runs alone: its trainer is built with a world size of 1."""
    from rllm_core.run.launch import (
        WorldSizeMismatch,
        check_world_size,
        in_one_process,
        launch,
    )

    parallel = _parallel(resolved)
    world_size = parallel.world_size if parallel is not None else 1
    if group is not None:
        try:
            check_world_size(group, world_size, resolved.path)
        except WorldSizeMismatch as exc:
            fail(str(exc), EXIT_USAGE)
        return resolved
    if world_size == 1:
        return resolved
    if role == "sampler":
        return in_one_process(resolved)
    if launch_args is not None:
        sys.exit(launch(world_size, launch_args))
    return resolved


def _follow(plan_path: Path, overrides: tuple[str, ...], group: Any) -> None:
    """Rank ``group.rank`` > 0: build the plan's trainer only and carry out rank 0's calls
    until rank 0 closes it; then exit 0. It writes no run folder and starts no gateway."""
    import inspect
    import signal

    from rllm_core.run.signals import handled
    from rllm_core.run.start import RunRefused, build_one
    from rllm_core.training.entry import check_parallel

    resolved = resolve_or_exit(plan_path, overrides, Path("<run folder>"))
    _place(resolved, "both", group, None)
    prepare_environment(resolved.plan.run.deterministic)
    try:
        trainer = build_one(resolved, "[trainer]")
    except RunRefused as exc:
        fail(f"rank {group.rank}: {exc}", exc.exit_code)
    try:
        check_parallel(trainer, resolved, group.world_size)
        # Rank 0 decides when the run stops, and stops it with the ranks' help (its last
        # checkpoint is collective): a signal torchrun passes to every rank is rank 0's alone.
        with handled(signal.SIG_IGN):
            trainer.follow()
    except RunRefused as exc:
        fail(str(exc), exc.exit_code)
    except Exception as exc:
        fail(f"rank {group.rank}: following rank 0 failed: {type(exc).__name__}: {exc}")
    finally:
        close = getattr(trainer, "close", None)
        if callable(close):
            result = close()
            if inspect.isawaitable(result):
                asyncio.run(result)
    sys.exit(0)
