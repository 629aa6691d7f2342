"""Console output shared by commands: one place decides colours, streams and error shape."""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.markup import escape

from rllm_core.errors import PlanError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def fail_plan(exc: PlanError, *, as_json: bool = False) -> NoReturn:
    """Report every plan issue and exit 2."""
    if as_json:
        print_json({"ok": False, "issues": [issue.to_dict() for issue in exc.issues]})
    else:
        count = len(exc.issues)
        err_console.print(f"[bold red]plan error[/] ({count} problem{'s' if count != 1 else ''}):")
        for issue in exc.issues:
            err_console.print(f"  {issue}", markup=False)
    sys.exit(EXIT_USAGE)


def fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    err_console.print(f"[bold red]error:[/] {escape(message)}")
    sys.exit(code)
