"""``rllm-core docs``: regenerate or check the documentation pages generated from the code."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from rllm_core.cli.output import EXIT_FAILURE, EXIT_USAGE, console, fail
from rllm_core.plugins.manager import get_plugin_manager
from rllm_core.reference import MKDOCS_CONFIG, DocsSourceError, site_pages, stale_pages


@click.group()
def docs() -> None:
    """Documentation pages generated from hookspecs, schemas, ports and plugin READMEs."""


@docs.command("write")
@click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Repository root: it holds mkdocs.yml, docs/ and plugins/.",
)
@click.option("--check", is_flag=True, help="Do not write; exit 1 if a page is out of date.")
def write(root: Path, check: bool) -> None:
    """Write the generated pages of the documentation site: docs/plugins/hooks.md,
    docs/plan-reference.md, docs/plugins/aliases.md, docs/reference/ (API and plugin pages)
    and the nav of mkdocs.yml. Preview the site with `mkdocs serve`."""
    if not (root / MKDOCS_CONFIG).is_file():
        fail(
            f"{root.resolve()} has no {MKDOCS_CONFIG}: run from the repository root or pass --root",
            EXIT_USAGE,
        )
    try:
        pages = site_pages(root, get_plugin_manager())
    except DocsSourceError as exc:
        fail(str(exc), EXIT_USAGE)
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
    for relative in stale_pages(root, pages):
        stale.append(relative)
        if not check:
            (root / relative).unlink()
            console.print(f"removed {root / relative}")
    if check and stale:
        console.print("out of date: " + ", ".join(map(str, stale)) + "; run `rllm-core docs write`")
        sys.exit(EXIT_FAILURE)
