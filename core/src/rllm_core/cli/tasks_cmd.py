"""``rllm-core tasks check``: validate a Harbor dataset; optionally solve each task in a sandbox.

The core does not read the format: the command builds the ``harbor`` task source through the
plugin manager and calls the methods of :class:`~rllm_core.ports.agents.CheckableTaskSource`
on it.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.markup import escape
from rich.text import Text

from rllm_core.cli.output import (
    EXIT_FAILURE,
    EXIT_USAGE,
    Cell,
    Column,
    console,
    err_console,
    print_json,
    print_table,
)
from rllm_core.errors import ComponentError, RllmError, UnknownComponentError
from rllm_core.plugins.manager import get_plugin_manager
from rllm_core.ports.agents import CheckableTaskSource, DatasetCheck, TaskCheck
from rllm_core.ports.sandboxes import task_for_backend
from rllm_core.types import HarnessOutcome, Task, Termination

HARBOR = "harbor"
HARBOR_DISTRIBUTION = "rllm-task-source-harbor"


@dataclass
class _Run:
    """One task run in a fresh sandbox: ``mode`` is ``solve`` or ``noop``."""

    task_id: str
    mode: str
    reward: float | None = None
    signals: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    detail: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        if self.reward is None:
            return False
        return self.reward >= 1.0 if self.mode == "solve" else self.reward <= 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "reward": self.reward,
            "signals": self.signals,
            "passed": self.passed,
            "error": self.error,
            "detail": self.detail,
            "seconds": round(self.seconds, 3),
        }


@click.group()
def tasks() -> None:
    """Work with Harbor-format task datasets."""


@tasks.command("check")
@click.argument("directory", type=click.Path(path_type=Path))
@click.option("--solve", is_flag=True, help="Run each task's solution/solve.sh, then its verifier.")
@click.option(
    "--noop",
    is_flag=True,
    help="Run each task's verifier on an untouched sandbox: the reward a no-op agent gets.",
)
@click.option(
    "--sandbox",
    "sandbox_name",
    default="local",
    show_default=True,
    help="Sandbox backend for --solve/--noop, built with its default config.",
)
@click.option(
    "--replay/--no-replay",
    "replay",
    default=None,
    help="Force Dockerfile replay on or off (default: on for a base image, off for a"
    " prebuilt docker_image).",
)
@click.option(
    "--jobs",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Tasks run at the same time with --solve/--noop.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("-v", "--verbose", is_flag=True, help="Also show what Dockerfile replay skips.")
def check(
    directory: Path,
    solve: bool,
    noop: bool,
    sandbox_name: str,
    replay: bool | None,
    jobs: int,
    as_json: bool,
    verbose: bool,
) -> None:
    """Validate the tasks in DIRECTORY and list their resolved settings.

    Exits 2 when any task has a format problem (each is printed with its task and field).
    With --solve (reward 1 expected) or --noop (reward 0 expected) every task runs in a fresh
    sandbox; the command exits 1 when a reward is not the expected one or a run fails.
    """
    source = _harbor_source(directory, replay, as_json=as_json)
    dataset = source.check("train", require_solution=solve)
    problems = dataset.all_problems
    if problems:
        _report(dataset, [], as_json=as_json, verbose=verbose)
        sys.exit(EXIT_USAGE)
    runs: list[_Run] = []
    if solve or noop:
        modes = [mode for mode, on in (("solve", solve), ("noop", noop)) if on]
        try:
            runs = asyncio.run(_run_all(source, dataset, modes, sandbox_name, jobs))
        except ComponentError as exc:
            _fail(str(exc), as_json=as_json)
    _report(dataset, runs, as_json=as_json, verbose=verbose)
    if any(not run.passed for run in runs):
        sys.exit(EXIT_FAILURE)


def _fail(message: str, *, as_json: bool) -> NoReturn:
    if as_json:
        print_json({"ok": False, "error": message})
    else:
        err_console.print(f"[bold red]error:[/] {escape(message)}")
    sys.exit(EXIT_USAGE)


def _harbor_source(directory: Path, replay: bool | None, *, as_json: bool) -> Any:
    """The ``harbor`` task source reading ``directory`` as its train split; exits 2 naming
    the package to install when no plugin provides it."""
    try:
        spec = get_plugin_manager().get("task_source", HARBOR)
    except UnknownComponentError as exc:
        _fail(
            f"rllm-core tasks check reads tasks through the {HARBOR} task source"
            f" (pip install {HARBOR_DISTRIBUTION}), which is not available: {exc}",
            as_json=as_json,
        )
    config: dict[str, Any] = {"path": str(directory)}
    if replay is not None:
        config["replay_dockerfile"] = replay
    try:
        source = spec.build(config)
    except (ComponentError, ValueError) as exc:
        _fail(f"could not build the {HARBOR} task source for {directory}: {exc}", as_json=as_json)
    if not isinstance(source, CheckableTaskSource):
        _fail(
            f"the installed {HARBOR} task source ({type(source).__name__}) cannot check tasks:"
            " it lacks check, prepare or run_solution; upgrade it with"
            f" pip install -U {HARBOR_DISTRIBUTION}",
            as_json=as_json,
        )
    return source


# ---------------------------------------------------------------- running


async def _run_all(
    source: CheckableTaskSource,
    dataset: DatasetCheck,
    modes: list[str],
    sandbox_name: str,
    jobs: int,
) -> list[_Run]:
    backend = get_plugin_manager().get("sandbox_backend", sandbox_name).build({})
    limit = asyncio.Semaphore(jobs)
    tasks = [check.task for check in dataset.tasks if check.task is not None]

    async def one(task: Task, mode: str) -> _Run:
        async with limit:
            return await _run_task(source, backend, task, mode)

    try:
        return list(await asyncio.gather(*(one(task, mode) for task in tasks for mode in modes)))
    finally:
        await backend.close()


async def _run_task(source: CheckableTaskSource, backend: Any, task: Task, mode: str) -> _Run:
    run = _Run(task_id=task.task_id, mode=mode)
    started = time.monotonic()
    task = task_for_backend(task, backend)
    try:
        async with await backend.create(task.environment) as sandbox:
            await source.prepare(task, sandbox)
            if mode == "solve":
                result = await source.run_solution(task, sandbox)
                if result.exit_code != 0:
                    run.detail = f"solve.sh exited {result.exit_code}"
            outcome = HarnessOutcome(termination=Termination.DONE)
            grade = await source.grade(task, outcome, sandbox)
            run.reward = grade.reward
            run.signals = dict(grade.signals)
    except RllmError as exc:
        run.error = f"{type(exc).__name__}: {exc}"
    run.seconds = time.monotonic() - started
    return run


# ---------------------------------------------------------------- output


def _settings(check: TaskCheck) -> dict[str, Any]:
    task = check.task
    if task is None or task.environment is None:
        return {}
    spec = task.environment
    return {
        "image": spec.image,
        "workdir": spec.workdir,
        "cpu": spec.cpu,
        "memory_mb": spec.memory_mb,
        "disk_mb": spec.disk_mb,
        "network": spec.network.value,
        "agent_timeout_s": task.agent_timeout_s,
        "verifier_timeout_s": task.verifier_timeout_s,
        "lifetime_s": spec.lifetime_s,
        "agent_user": spec.user,
        **check.settings,
        "env": dict(spec.env),
        "has_solution": check.has_solution,
        "setup": check.setup,
    }


def _report(dataset: DatasetCheck, runs: list[_Run], *, as_json: bool, verbose: bool) -> None:
    by_task: dict[str, dict[str, _Run]] = {}
    for run in runs:
        by_task.setdefault(run.task_id, {})[run.mode] = run
    if as_json:
        print_json(
            {
                "ok": dataset.ok and all(run.passed for run in runs),
                "dataset": dataset.name,
                "path": str(dataset.path),
                "problems": [p.to_dict() for p in dataset.all_problems],
                "warnings": dataset.warnings,
                "tasks": [
                    {
                        "task_id": check.task_id,
                        "task_dir": str(check.task_dir),
                        "settings": _settings(check),
                        "problems": [p.to_dict() for p in check.problems],
                        "warnings": check.warnings,
                        "notes": check.notes,
                        "runs": {
                            mode: run.to_dict()
                            for mode, run in by_task.get(check.task_id, {}).items()
                        },
                    }
                    for check in dataset.tasks
                ],
            }
        )
        return
    _print_settings(dataset)
    for warning in [*dataset.warnings, *(w for c in dataset.tasks for w in c.warnings)]:
        err_console.print(f"[yellow]warning:[/] {escape(warning)}")
    if verbose:
        for note in (n for c in dataset.tasks for n in c.notes):
            console.print(f"[dim]note:[/] {escape(note)}")
    problems = dataset.all_problems
    if problems:
        count = len(problems)
        err_console.print(
            f"[bold red]task format error[/] ({count} problem{'s' if count != 1 else ''}):"
        )
        for problem in problems:
            err_console.print(f"  {problem}", markup=False)
        return
    if runs:
        _print_runs(dataset, by_task)


def _print_settings(dataset: DatasetCheck) -> None:
    columns = [
        Column("Task"),
        Column("Image", fold=True),
        Column("Workdir", fold=True),
        Column("Resources", nowrap=True),
        Column("Timeouts", nowrap=True),
        Column("Setup", nowrap=True),
        Column("Solution"),
    ]
    rows: list[list[Cell]] = []
    for check in dataset.tasks:
        s = _settings(check)
        if not s:
            rows.append([check.task_id, Text("invalid", style="red"), *[""] * 5])
            continue
        resources = f"{s['cpu']:g} cpu {s['memory_mb']}M"
        if s["network"] != "none":
            resources += f" net={s['network']}"
        rows.append(
            [
                check.task_id,
                str(s["image"] or "-"),
                s["workdir"],
                resources,
                f"{s['agent_timeout_s']:g}/{s['verifier_timeout_s']:g}s",
                s["setup"] or "-",
                "yes" if s["has_solution"] else "no",
            ]
        )
    title = f"{dataset.name}: {len(dataset.tasks)} task(s) in {dataset.path}"
    print_table(title, columns, rows)


def _print_runs(dataset: DatasetCheck, by_task: dict[str, dict[str, _Run]]) -> None:
    modes = sorted({mode for runs in by_task.values() for mode in runs}, reverse=True)
    columns = [Column("Task")]
    columns += [Column("solve (want 1)" if m == "solve" else "no-op (want 0)") for m in modes]
    columns += [Column("Seconds", justify="right"), Column("Detail", fold=True)]
    rows: list[list[Cell]] = []
    failed = 0
    for check in dataset.tasks:
        runs = by_task.get(check.task_id, {})
        cells: list[Cell] = [check.task_id]
        details = []
        for mode in modes:
            run = runs.get(mode)
            if run is None:
                cells.append("-")
                continue
            failed += not run.passed
            colour = "green" if run.passed else "red"
            cells.append(Text("error" if run.reward is None else f"{run.reward:g}", style=colour))
            for text in (run.error, run.detail):
                if text:
                    details.append(f"{mode}: {text}")
        seconds = sum(run.seconds for run in runs.values())
        rows.append([*cells, f"{seconds:.1f}", details])
    print_table("rewards", columns, rows)
    total = sum(len(runs) for runs in by_task.values())
    if failed:
        console.print(f"[bold red]{failed} of {total} run(s) did not get the expected reward[/]")
    else:
        console.print(f"[bold green]all {total} run(s) got the expected reward[/]")
