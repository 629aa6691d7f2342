"""``rllm-core plan check``: validate and resolve a plan, then print it resolved."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import click
from pydantic import BaseModel
from rich.markup import escape
from rich.text import Text

from rllm_core.cli.output import (
    EXIT_USAGE,
    Cell,
    Column,
    console,
    err_console,
    fail,
    fail_plan,
    is_plain,
    print_json,
    print_table,
)
from rllm_core.cli.preflight import missing_components
from rllm_core.errors import ModelError, PlanError, PlanIssue
from rllm_core.plan import ResolvedPlan
from rllm_core.plan.findings import Findings, find_problems
from rllm_core.plan.schema import ComponentRef, Plan
from rllm_core.reference import toml_literal
from rllm_core.run.components import prepare_plan

SET_HELP = "Override a plan key: section.key=value (value parsed as TOML). Repeatable."


@click.group()
def plan() -> None:
    """Work with plan.toml files."""


@plan.command("check")
@click.argument("plan_path", metavar="PLAN", type=click.Path(path_type=Path))
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help=SET_HELP)
@click.option(
    "--json", "as_json", is_flag=True, help="Print the resolved plan and the findings as JSON."
)
@click.option("--strict", is_flag=True, help="Treat every warning as an error (exit 2).")
def check(plan_path: Path, overrides: tuple[str, ...], as_json: bool, strict: bool) -> None:
    """Validate PLAN, resolve every component, look for what a run would hit and print the
    resolved plan.

    Beyond the plan itself, it checks that every file and folder the plan names exists with
    the shape its component expects (data files, task folders, tokenizer and model folders),
    that every model resolves as a run resolves it, and that the credentials of remote
    backends are set. A model not pulled yet, a missing credential and the plan's notes are
    warnings (`warning: ...` on stderr; the pull command or the variable to set is named);
    --strict makes them errors. Errors exit 2, all listed together. Nothing is downloaded.

    Keys a run fills in itself (a store's path inside the run folder, the renderer's tokenizer
    from the trainer's model) are filled the same way, with ``<run folder>`` standing for the
    folder a run would create."""
    try:
        resolved = prepare_plan(
            plan_path, overrides, run_dir=Path("<run folder>"), require_models=False
        )
    except PlanError as exc:
        _fail_findings(Findings(errors=tuple(exc.issues)), as_json=as_json)
    except ModelError as exc:
        fail(f"{plan_path}: [trainer].model: {exc}", EXIT_USAGE)
    findings = find_problems(resolved)
    if not resolved.plan.is_sft and not missing_components(resolved, training=False):
        # A plan an evaluation can use but a run cannot: say what `run` would refuse.
        gaps = missing_components(resolved, training=True)
        for issue in gaps:
            issue.message += "; `rllm-core run` refuses the plan (`rllm-core eval` works)"
        findings = Findings(errors=findings.errors, warnings=(*findings.warnings, *gaps))
    if strict:
        findings = findings.strict()
    if findings.errors:
        _fail_findings(findings, as_json=as_json)
    if as_json:
        print_json(
            {
                "ok": True,
                "notes": list(resolved.notes),
                "errors": [],
                "warnings": [_finding(issue) for issue in findings.warnings],
                **resolved.to_dict(),
            }
        )
        return
    for issue in findings.warnings:
        err_console.print(f"[yellow]warning:[/] {escape(str(issue))}")
    print_resolved(resolved)


def _finding(issue: PlanIssue) -> dict[str, object]:
    return {"file": issue.path, **issue.to_dict()}


def _fail_findings(findings: Findings, *, as_json: bool) -> NoReturn:
    """Print the warnings, then every error as a plan error, and exit 2."""
    if as_json:
        print_json(
            {
                "ok": False,
                "issues": [issue.to_dict() for issue in findings.errors],
                "errors": [_finding(issue) for issue in findings.errors],
                "warnings": [_finding(issue) for issue in findings.warnings],
            }
        )
        sys.exit(EXIT_USAGE)
    for issue in findings.warnings:
        err_console.print(f"[yellow]warning:[/] {escape(str(issue))}")
    fail_plan(PlanError(list(findings.errors)))


def print_resolved(resolved: ResolvedPlan) -> None:
    console.print(f"[bold green]plan ok[/]: {escape(str(resolved.path))}")
    columns = [Column("Key"), Column("Value", fold=True)]
    print_table("settings", columns, settings_rows(resolved.plan))
    if not resolved.components:
        console.print("no components selected")
        return
    # Piped, the provider is a field of its own; on a terminal it goes under the component,
    # which keeps the table within 80 columns.
    plain = is_plain()
    rows: list[list[Cell]] = []
    for component in resolved:
        config = component.config.model_dump(mode="json")
        if component.coef is not None:
            config = {"coef": component.coef, **config}
        name = f"{component.kind.value}:{component.name}"
        shown = list(_config_lines(config)) or "-"
        if plain:
            rows.append([component.where, name, component.provider, shown])
        else:
            rows.append([component.where, [name, Text(component.provider, style="dim")], shown])
    columns = [Column("Where"), Column("Component"), Column("Config", fold=True, min_width=24)]
    if plain:
        columns.insert(2, Column("Provider"))
    print_table("components", columns, rows)


def _config_lines(config: dict[str, Any], prefix: str = "") -> Iterator[str]:
    """``key = value`` per setting, a nested table's keys dotted (``lora.rank = 16``)."""
    for key, value in config.items():
        if isinstance(value, dict) and value:
            yield from _config_lines(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key} = {'{}' if value == {} else toml_literal(value)}"


def settings_rows(plan: Plan) -> list[tuple[str, str]]:
    """``([section].key, value)`` for every plain setting of ``plan``: each section that is
    not a component (``[sft]`` only in an SFT plan), nested tables as ``[section.table]``;
    the keys that select components are left to the components table."""
    rows: list[tuple[str, str]] = []
    for name in type(plan).model_fields:
        section = getattr(plan, name)
        if name == "sft" and not plan.is_sft:
            continue
        if isinstance(section, BaseModel) and not isinstance(section, ComponentRef):
            rows += _section_rows(name, section)
    return rows


def _section_rows(where: str, section: BaseModel) -> list[tuple[str, str]]:
    rows: list[tuple[str, str]] = []
    tables: list[tuple[str, BaseModel]] = []
    for key, info in type(section).model_fields.items():
        value = getattr(section, key)
        if value is None or ("ComponentRef" in str(info.annotation) and not isinstance(value, str)):
            continue  # a component: the components table shows it
        if isinstance(value, BaseModel):
            tables.append((f"{where}.{key}", value))
            continue
        if (
            isinstance(value, dict)
            and value
            and all(isinstance(item, BaseModel) for item in value.values())
        ):
            tables += [(f"{where}.{key}.{name}", item) for name, item in value.items()]
            continue
        if isinstance(value, list) and value and all(isinstance(item, BaseModel) for item in value):
            tables += [(f"{where}.{key}[{index}]", item) for index, item in enumerate(value)]
            continue
        dumped = section.model_dump(mode="json", include={key}, by_alias=False)[key]
        rows.append((f"[{where}].{info.alias or key}", toml_literal(dumped)))
    for name, table in tables:
        rows += _section_rows(name, table)
    return rows
