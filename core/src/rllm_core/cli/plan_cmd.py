"""``rllm-core plan check``: validate and resolve a plan, then print it resolved."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from rllm_core.cli.output import EXIT_USAGE, console, err_console, fail, fail_plan, print_json
from rllm_core.errors import ModelError, PlanError
from rllm_core.plan import ResolvedPlan
from rllm_core.reference import toml_literal
from rllm_core.training.components import prepare_plan

SET_HELP = "Override a plan key: section.key=value (value parsed as TOML). Repeatable."


@click.group()
def plan() -> None:
    """Work with plan.toml files."""


@plan.command("check")
@click.argument("plan_path", metavar="PLAN", type=click.Path(path_type=Path))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help=SET_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the resolved plan as JSON.")
def check(plan_path: Path, overrides: tuple[str, ...], as_json: bool) -> None:
    """Validate PLAN, resolve every component and print the resolved plan.

    Keys a run fills in itself (a store's path inside the run folder, the renderer's tokenizer
    from the trainer's model) are filled the same way, with ``<run folder>`` standing for the
    folder a run would create."""
    try:
        resolved = prepare_plan(plan_path, overrides, run_dir=Path("<run folder>"))
    except PlanError as exc:
        fail_plan(exc, as_json=as_json)
    except ModelError as exc:
        fail(f"{plan_path}: [trainer].model: {exc}", EXIT_USAGE)
    if as_json:
        print_json({"ok": True, "notes": list(resolved.notes), **resolved.to_dict()})
        return
    for note in resolved.notes:
        err_console.print(f"[yellow]warning:[/] {escape(note)}")
    print_resolved(resolved)


def print_resolved(resolved: ResolvedPlan) -> None:
    console.print(f"[bold green]plan ok[/]: {resolved.path}")
    settings = Table(title="settings", title_justify="left")
    settings.add_column("Key", no_wrap=True)
    settings.add_column("Value")
    for section in ("run", "algorithm", "sampling", "rollout"):
        values = getattr(resolved.plan, section).model_dump(mode="json", exclude_none=True)
        for key, value in values.items():
            if key in ("loss", "advantage", "aux_losses"):
                continue
            settings.add_row(escape(f"[{section}].{key}"), escape(toml_literal(value)))
    console.print(settings)
    if not resolved.components:
        console.print("no components selected")
        return
    table = Table(title="components", title_justify="left")
    table.add_column("Where", no_wrap=True)
    table.add_column("Component", no_wrap=True)
    table.add_column("Provider", overflow="fold")
    table.add_column("Config", min_width=24, overflow="fold")
    for component in resolved:
        config = component.config.model_dump(mode="json")
        if component.coef is not None:
            config = {"coef": component.coef, **config}
        shown = "\n".join(f"{k} = {toml_literal(v)}" for k, v in config.items()) or "-"
        table.add_row(
            escape(component.where),
            f"{component.kind.value}:{component.name}",
            escape(component.provider),
            escape(shown),
        )
    console.print(table)
