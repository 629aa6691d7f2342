"""``rllm-core dataset``: write chat JSONL for ``rllm-core sft`` from an evaluation's attempts
or from another dataset (see :mod:`rllm_core.sft.chat_rows`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from rllm_core.cli.output import EXIT_USAGE, console, err_console, fail, print_json

OUT = click.option(
    "-o",
    "--out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The chat JSONL file to write (replaced when it exists).",
)
AS_JSON = click.option(
    "--json", "as_json", is_flag=True, help="Print what was written as one JSON object."
)


@click.group()
def dataset() -> None:
    """Chat JSONL for `rllm-core sft`: from an evaluation, or from another dataset."""


def _finish(out: Path, written: dict[str, Any], line: str, warnings: list[str], as_json: bool):
    for warning in warnings:
        err_console.print(f"warning: {warning}", markup=False)
    if as_json:
        print_json({"out": str(out), **written, "warnings": warnings})
    else:
        console.print(line, markup=False)


@dataset.command("from-eval")
@click.argument("eval_folder", type=click.Path(path_type=Path))
@OUT
@click.option(
    "--min-reward",
    type=float,
    metavar="R",
    help="Keep only the attempts with reward >= R (1.0: those that passed). Default: all.",
)
@AS_JSON
def from_eval(eval_folder: Path, out: Path, min_reward: float | None, as_json: bool) -> None:
    """Write the scored attempts of EVAL_FOLDER (an `rllm-core eval` folder, or a run folder)
    as chat JSONL rows, one per conversation: the messages the gateway stored with each model
    call, an assistant's thinking as `reasoning_content`, and the row's `episode_id`,
    `task_id`, `reward` and `lineage_id`. An attempt whose agent rewrote its history gives a
    row per chain. The trace store is read as `rllm-core traces show` reads it. Exit 2 when
    EVAL_FOLDER is not an evaluation or run folder, or its trace store cannot be read."""
    from rllm_core.inspection import InspectionError
    from rllm_core.sft.chat_rows import EvalRowsReport, eval_rows, write_rows
    from rllm_core.sft.data import DataError

    report = EvalRowsReport()
    try:
        write_rows(eval_rows(eval_folder, min_reward=min_reward, report=report), out)
    except (InspectionError, DataError) as exc:
        fail(str(exc), EXIT_USAGE)
    below = f"; {report.below} below --min-reward {min_reward:g}" if report.below else ""
    line = (
        f"wrote {report.rows} row(s) from {report.kept} of {report.attempts} attempt(s)"
        f"{below} to {out}"
    )
    _finish(out, report.to_dict(), line, report.warnings(), as_json)


@dataset.command("import")
@click.argument("source", metavar="IN", type=click.Path(path_type=Path))
@OUT
@click.option(
    "--to-think-tags",
    is_flag=True,
    help="The reverse: move reasoning_content into a <think> block before the content.",
)
@click.option(
    "--messages-field",
    default="messages",
    show_default=True,
    help="The field of IN that holds the messages (written as messages).",
)
@click.option(
    "--tools-field",
    default="tools",
    show_default=True,
    help="The field of IN that holds the tools (written as tools).",
)
@AS_JSON
def import_(
    source: Path,
    out: Path,
    to_think_tags: bool,
    messages_field: str,
    tools_field: str,
    as_json: bool,
) -> None:
    """Read the chat JSONL file IN and write it for `rllm-core sft`: an assistant's
    `<think>...</think>` block at the start of its content becomes a separate
    `reasoning_content` field (with --to-think-tags, the reverse). Every other field is kept.
    A row that is not JSON, that SFT would refuse, or whose think block is malformed (never
    closed, not at the start, twice, or besides a reasoning_content) stops the command with its
    file and line, exit 2, and nothing written."""
    from rllm_core.sft.chat_rows import ImportReport, import_rows, write_rows
    from rllm_core.sft.data import DataError

    report = ImportReport()
    rows = import_rows(
        source,
        messages_field=messages_field,
        tools_field=tools_field,
        to_think_tags=to_think_tags,
        report=report,
    )
    try:
        write_rows(rows, out)
    except DataError as exc:
        fail(str(exc), EXIT_USAGE)
    moved = "into think blocks" if to_think_tags else "into reasoning_content"
    line = (
        f"wrote {report.rows} row(s) to {out}; {report.messages} message(s) had their"
        f" thinking moved {moved}"
    )
    _finish(out, report.to_dict(), line, [], as_json)
