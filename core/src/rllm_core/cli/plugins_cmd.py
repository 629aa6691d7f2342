"""``rllm-core plugins``: what is installed, its version, status and components."""

from __future__ import annotations

import sys

import click
from rich.text import Text

from rllm_core.cli.output import (
    EXIT_FAILURE,
    Cell,
    Column,
    console,
    is_plain,
    print_heading,
    print_json,
    print_table,
)
from rllm_core.plugins.manager import PluginRecord, PluginStatus, get_plugin_manager
from rllm_core.plugins.specs import Kind

_STATUS_STYLE = {
    PluginStatus.ACTIVE: "green",
    PluginStatus.DISABLED: "dim",
    PluginStatus.ERROR: "bold red",
    PluginStatus.CONFLICT: "bold yellow",
}


def _provides(record: PluginRecord, kind: Kind | None) -> list[str]:
    if kind is None:
        return list(record.components)
    return [c for c in record.components if c.startswith(f"{kind.value}:")]


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print the records as JSON.")
@click.option(
    "--kind",
    type=click.Choice([k.value for k in Kind]),
    help="Only plugins providing components of this kind.",
)
@click.option("-v", "--verbose", is_flag=True, help="Show module paths and tracebacks.")
@click.option("--check", is_flag=True, help="Exit 1 when any plugin is in error or conflict.")
def plugins(as_json: bool, kind: str | None, verbose: bool, check: bool) -> None:
    """List installed plugins: version, status and the components they provide."""
    manager = get_plugin_manager()
    records = manager.plugins()
    wanted = Kind(kind) if kind else None
    if wanted is not None:
        records = [r for r in records if _provides(r, wanted)]
    if as_json:
        rows = []
        for record in records:
            row = record.to_dict(verbose=verbose)
            row["provides"] = _provides(record, wanted)
            rows.append(row)
        print_json(rows)
    else:
        _print_table(records, wanted, verbose)
    if check and any(r.status in (PluginStatus.ERROR, PluginStatus.CONFLICT) for r in records):
        sys.exit(EXIT_FAILURE)


def _print_table(records: list[PluginRecord], kind: Kind | None, verbose: bool) -> None:
    if not records:
        console.print(
            "No rllm-core plugins are installed."
            " Install one with `pip install rllm-<kind>-<name>`.",
            markup=False,
        )
        return
    plain = is_plain()
    # Piped: a version field and the components as kind:name, for grep and cut. On a terminal
    # the version goes under the name and the components are grouped by kind, which keeps the
    # longest names whole at 80 columns.
    columns = [Column("Plugin"), Column("Status"), Column("Provides")]
    if plain:
        columns.insert(1, Column("Version"))
    if verbose:
        columns.append(Column("Module", fold=True))
    rows = []
    for record in records:
        provides: list[str | Text] = list(_provides(record, kind))
        if not plain:
            provides = _grouped(provides)
        if record.status is PluginStatus.ERROR:
            provides = [Text(record.error or "", style="red", overflow="fold")]
        elif record.status is PluginStatus.CONFLICT:
            provides += [Text(c, style="yellow") for c in record.conflicts]
        name: Cell = record.distribution
        if not plain:
            name = Text(record.distribution)
            name.append(f" {record.version}", style="dim")
        row: list[Cell] = [name, Text(record.status.value, style=_STATUS_STYLE[record.status])]
        if plain:
            row.insert(1, record.version)
        row.append(provides)
        if verbose:
            row.append(record.module)
        rows.append(row)
    print_table("rllm-core plugins", columns, rows)
    if verbose:
        for record in records:
            if record.traceback:
                print_heading(f"{record.distribution}: traceback")
                console.print(record.traceback, markup=False)


def _grouped(components: list[str | Text]) -> list[str | Text]:
    """``kind:name`` entries as one ``kind: name, name`` line per kind, in first-seen order."""
    names: dict[str, list[str]] = {}
    for component in components:
        kind, _, name = str(component).partition(":")
        names.setdefault(kind, []).append(name)
    return [f"{kind}: {', '.join(found)}" for kind, found in names.items()]
