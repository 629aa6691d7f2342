"""``rllm-core runs``: summarize one run folder, list the run folders of a directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from rich.text import Text

from rllm_core.cli.output import EXIT_USAGE, Column, console, fail, print_json, print_table

STATUS_STYLE = {
    "finished": "green",
    "interrupted": "yellow",
    "failed": "bold red",
    "running-or-crashed": "cyan",
}


def number(value: float | None, digits: int = 3) -> str:
    """``value`` rounded to ``digits`` places, or ``-`` when there is none."""
    return "-" if value is None else f"{value:.{digits}f}"


def duration(seconds: float | None) -> str:
    """``1h 02m 03s``, ``4m 05s`` or ``6.2s``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def _component(entry: dict[str, Any] | None, *details: str) -> str:
    if entry is None:
        return "-"
    parts = [str(entry["name"])]
    parts += [f"{key} {entry[key]}" for key in details if entry.get(key) is not None]
    return " · ".join(parts)


def report_rows(report: dict[str, Any]) -> list[tuple[str, Text | list[str]]]:
    """The label/value lines ``runs show`` prints for ``report`` (see
    :func:`rllm_core.inspection.runs.run_report`)."""
    status = report["status"]
    planned = report["steps_planned"]
    wall = duration(report["wall_s"])
    if report["wall_source"] == "metrics":
        wall += " (sum of step times; no summary.json)"
    reward, accuracy = report["reward"], report["accuracy"]
    window = reward["window"]
    best_reward = number(reward["best"])
    if reward["best_step"] is not None:
        best_reward += f" (step {reward['best_step']})"
    best_accuracy = number(accuracy["best"])
    if accuracy["best_step"] is not None:
        best_accuracy += f" (step {accuracy['best_step']})"
    components = report["components"]
    loss = _component(components["loss"])
    for aux in components["aux_losses"]:
        loss += f" + {aux['coef']} x {aux['name']}"
    checkpoints = ", ".join(str(s) for s in report["checkpoints"]) or "none"
    plots = [p for p in report["plots"].values() if p]
    rows = [
        ("run", Text(report["name"], style="bold")),
        ("folder", report["run_dir"]),
        ("status", Text(status, style=STATUS_STYLE.get(status, ""))),
        ("steps", f"{report['steps_done']} / {planned if planned is not None else '?'}"),
        ("wall time", wall),
        ("started", f"{report['started']} · last write {report['last_activity']}"),
        (
            "reward",
            f"first {window} steps {number(reward['first'])} · last {window} steps"
            f" {number(reward['last'])} · best {best_reward}",
        ),
        ("accuracy", f"last step {number(accuracy['last'])} · best {best_accuracy}"),
        (
            "episodes",
            f"{report['episodes']:,} scored · {report['infra_failures']:,} infra failures",
        ),
        (
            "tokens",
            f"{report['tokens']['sampled']:,} sampled · {report['tokens']['trained']:,} trained",
        ),
        ("checkpoints", f"step {checkpoints}" if report["checkpoints"] else checkpoints),
        ("trainer", _component(components["trainer"], "model", "base_model")),
        ("loss", loss),
        ("advantage", _component(components["advantage"])),
        ("renderer", _component(components["renderer"])),
        ("harness", _component(components["harness"])),
        ("tasks", _component(components["tasks"], "path")),
        ("sandbox", _component(components["sandbox"])),
        ("trace store", _component(components["trace_store"], "path")),
        ("plots", plots or "none yet"),
    ]
    sft = report.get("sft")
    if sft is not None:
        drop = {"reward", "accuracy", "episodes", "loss", "advantage", "harness", "tasks"}
        drop |= {"sandbox", "trace store"}
        rows = [row for row in rows if row[0] not in drop]
        examples = f"{sft['examples']} trained on" if sft["examples"] is not None else "?"
        if sft["eval_examples"]:
            examples += f" · {sft['eval_examples']} held out"
        rows[5:5] = [
            (
                "nll",
                f"first {sft['window']} steps {number(sft['nll_first'])} · last"
                f" {sft['window']} steps {number(sft['nll_last'])} · eval"
                f" {number(sft['eval_nll'])}",
            ),
            ("examples", examples),
        ]
    return [(label, Text(value) if isinstance(value, str) else value) for label, value in rows]


@click.group()
def runs() -> None:
    """Run folders: summarize one, list them."""


@runs.command("show")
@click.argument("path", type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
def show(path: Path, as_json: bool) -> None:
    """Summarize the run folder PATH: status, steps, rewards, tokens, checkpoints, components.

    A folder without summary.json (its run is still going, or died before writing one) is
    summarized from metrics.jsonl and shown as running-or-crashed. Exit 2 when PATH is not a
    run folder.
    """
    from rllm_core.inspection import InspectionError
    from rllm_core.inspection.runs import run_report

    try:
        report = run_report(path)
    except InspectionError as exc:
        fail(str(exc), EXIT_USAGE)
    if as_json:
        print_json(report)
        return
    print_table(
        None,
        [Column(style="bold"), Column(fold=True)],
        report_rows(report),
        show_header=False,
        boxed=False,
    )


@runs.command("list")
@click.argument("directory", type=click.Path(path_type=Path), default="runs", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
def list_command(directory: Path, as_json: bool) -> None:
    """List the run folders in DIRECTORY (default: runs), newest first.

    Exit 2 when DIRECTORY is not a directory.
    """
    from rllm_core.inspection import InspectionError
    from rllm_core.inspection.runs import SUMMARY_WINDOW, list_runs

    try:
        records = list_runs(directory)
    except InspectionError as exc:
        fail(str(exc), EXIT_USAGE)
    if as_json:
        print_json(records)
        return
    if not records:
        console.print(f"No run folders in {directory}; start one with `rllm-core run PLAN`.")
        return
    rows = []
    for record in records:
        planned = record["steps_planned"]
        rows.append(
            [
                record["name"],
                Text(record["status"], style=STATUS_STYLE.get(record["status"], "")),
                f"{record['steps_done']}/{planned if planned is not None else '?'}",
                number(record["reward_last"]),
                record["started"] or "-",
            ]
        )
    columns = [
        Column("Run", fold=True),
        Column("Status"),
        Column("Steps", justify="right"),
        Column(f"Reward (last {SUMMARY_WINDOW})", justify="right"),
        Column("Started"),
    ]
    print_table(f"runs in {directory}", columns, rows)
