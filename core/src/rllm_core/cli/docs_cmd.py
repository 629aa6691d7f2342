"""``rllm-core docs``: regenerate or check the reference pages generated from the code."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from rllm_core.cli.output import EXIT_FAILURE, console
from rllm_core.plugins.manager import get_plugin_manager
from rllm_core.reference import HOOKS_PAGE, PLAN_PAGE, hooks_markdown, plan_reference_markdown


@click.group()
def docs() -> None:
    """Reference pages generated from hookspecs and schemas."""


@docs.command("write")
@click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Repository root that holds docs/.",
)
@click.option("--check", is_flag=True, help="Do not write; exit 1 if a page is out of date.")
def write(root: Path, check: bool) -> None:
    """Write docs/plugins/hooks.md and docs/plan-reference.md."""
    pages = {
        HOOKS_PAGE: hooks_markdown(),
        PLAN_PAGE: plan_reference_markdown(get_plugin_manager()),
    }
    stale = []
    for relative, text in pages.items():
        target = root / relative
        current = target.read_text(encoding="utf-8") if target.exists() else None
        if current == text:
            continue
        stale.append(relative)
        if not check:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
            console.print(f"wrote {target}")
    if check and stale:
        console.print("out of date: " + ", ".join(map(str, stale)) + "; run `rllm-core docs write`")
        sys.exit(EXIT_FAILURE)
