"""``rllm-core plugins``: what is installed, its version, status and components."""

from __future__ import annotations

import sys

import click
from rich.markup import escape
from rich.table import Table

from rllm_core.cli.output import EXIT_FAILURE, console, print_json
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
            "No rllm-core plugins are installed. Install one with `pip install rllm-<kind>-<name>`."
        )
        return
    table = Table(title="rllm-core plugins", title_justify="left")
    table.add_column("Plugin", no_wrap=True)
    table.add_column("Version", no_wrap=True)
    table.add_column("Status", no_wrap=True)
    table.add_column("Provides", overflow="fold")
    if verbose:
        table.add_column("Module")
    for record in records:
        style = _STATUS_STYLE[record.status]
        provides = "\n".join(_provides(record, kind))
        if record.status is PluginStatus.ERROR:
            provides = f"[red]{escape(record.error or '')}[/]"
        elif record.status is PluginStatus.CONFLICT:
            provides += "\n" + "\n".join(f"[yellow]{escape(c)}[/]" for c in record.conflicts)
        row = [
            escape(record.distribution),
            escape(record.version),
            f"[{style}]{record.status.value}[/]",
            provides,
        ]
        if verbose:
            row.append(escape(record.module))
        table.add_row(*row)
    console.print(table)
    if verbose:
        for record in records:
            if record.traceback:
                console.rule(f"{record.distribution}: traceback")
                console.print(record.traceback, markup=False)
