"""Console output shared by commands: one place decides colours, streams, tables and error shape.

Tables go through :func:`print_table`, which writes one of two forms:

- on a terminal, a rich table whose columns are sized so that no word is broken: a column is
  at least as wide as its longest word (a cell marked foldable, such as a path or an error
  message, may fold when it is longer than its column). A table that cannot fit that way at
  the console's width loses its rules, and if it still does not fit, is printed as one block
  of ``Header  value`` lines per row;
- when stdout is not a terminal (piped, redirected, captured), plain text: a ``# title`` line,
  a header line (key/value tables have none), then one line per row with its fields separated
  by tabs. A field's several values are joined with ``; ``; a newline or tab inside a field is
  written as ``\\n`` or ``\\t``. No box drawing, no colour, no wrapping, so ``grep``, ``cut`` and
  ``awk -F'\\t'`` work on it.

``RLLM_CORE_OUTPUT=plain`` or ``rich`` picks the form whatever stdout is; otherwise rich's own
settings decide what a terminal is (``TTY_COMPATIBLE``, ``FORCE_COLOR``). The width is the
terminal's, or ``COLUMNS``; ``NO_COLOR`` turns colour off. Commands that print a table also
take ``--json``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

import click
from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from rllm_core.errors import PlanError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

OUTPUT_ENV = "RLLM_CORE_OUTPUT"
OUTPUT_MODES = ("auto", "rich", "plain")

console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)

Cell = str | Text | Sequence[str | Text] | None
"""A table cell: text (``str`` is never read as rich markup), or several values (one per line
on a terminal, joined with ``; `` when plain)."""

_FOLD_MIN = 10
"""The narrowest a foldable column is squeezed to before the table loses its rules."""


@dataclass(frozen=True)
class Column:
    """One column of :func:`print_table`.

    ``fold``: its cells may be broken inside a word when longer than the column (paths, ids,
    free text); otherwise the column is kept as wide as its longest word, or with ``nowrap``
    as its longest line (``512 MB``). ``style`` colours the whole column on a terminal, where
    it is at least ``min_width`` cells wide."""

    header: str = ""
    justify: Literal["left", "right"] = "left"
    fold: bool = False
    nowrap: bool = False
    style: str | None = None
    min_width: int = 0


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def output_mode(target: Console | None = None) -> Literal["rich", "plain"]:
    """``plain`` or ``rich`` for output written to ``target`` (default: stdout's console)."""
    wanted = os.environ.get(OUTPUT_ENV, "auto").strip().lower() or "auto"
    if wanted not in OUTPUT_MODES:
        fail(
            f"the environment variable {OUTPUT_ENV}={wanted!r} is not one of"
            f" {', '.join(OUTPUT_MODES)}; set one of those or unset it",
            EXIT_USAGE,
        )
    if wanted == "auto":
        return "rich" if (target or console).is_terminal else "plain"
    return "plain" if wanted == "plain" else "rich"


def is_plain(target: Console | None = None) -> bool:
    """Whether tables and headings written to ``target`` come out as plain text."""
    return output_mode(target) == "plain"


def print_table(
    title: str | None,
    columns: Sequence[Column | str],
    rows: Iterable[Sequence[Cell]],
    *,
    show_header: bool = True,
    boxed: bool = True,
    target: Console | None = None,
) -> None:
    """Print a table to ``target`` (default: stdout) in the form the module docstring
    describes. ``boxed=False`` draws a key/value grid without lines on a terminal."""
    out = target or console
    cols = [c if isinstance(c, Column) else Column(c) for c in columns]
    body = [list(row) for row in rows]
    for row in body:
        if len(row) != len(cols):
            raise ValueError(f"a row of {len(row)} cells in a table of {len(cols)} columns")
    if is_plain(out):
        _print_plain(out, title, cols, body, show_header=show_header)
        return
    cells = [[_text(cell) for cell in row] for row in body]
    # Ruled if it fits, else without rules (two spaces between columns), else stacked.
    for ruled in (True, False) if boxed else (False,):
        table = _fitted_table(out, title, cols, cells, show_header=show_header, boxed=ruled)
        if table is not None:
            out.print(table, soft_wrap=False)
            return
    if show_header:
        _print_stacked(out, title, cols, cells)
    else:
        loose = _table(title, cols, cells, [None] * len(cols), show_header=False)
        out.print(loose, soft_wrap=False)


def print_heading(text: str, *, style: str = "rule.line", target: Console | None = None) -> None:
    """A heading between blocks of output: a rule on a terminal, ``# text`` when plain."""
    out = target or console
    if is_plain(out):
        _write_lines(out, [f"# {_flat(text)}"])
    else:
        out.print(Rule(Text(text), align="left", style=style))


# ---------------------------------------------------------------- plain


def _flat(value: str) -> str:
    return value.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")


def _plain_cell(cell: Cell) -> str:
    if cell is None:
        return ""
    if isinstance(cell, Text):
        return _flat(cell.plain)
    if isinstance(cell, str):
        return _flat(cell)
    return "; ".join(_flat(v.plain if isinstance(v, Text) else str(v)) for v in cell)


def _print_plain(
    out: Console,
    title: str | None,
    columns: list[Column],
    rows: list[list[Cell]],
    *,
    show_header: bool,
) -> None:
    lines = []
    if title:
        lines.append(f"# {_flat(title)}")
    if show_header:
        lines.append("\t".join(_flat(c.header) for c in columns))
    lines.extend("\t".join(_plain_cell(cell) for cell in row) for row in rows)
    _write_lines(out, lines)


def _write_lines(out: Console, lines: list[str]) -> None:
    # Straight to the stream: rich would expand the tabs into spaces.
    out.file.write("".join(f"{line}\n" for line in lines))
    out.file.flush()


# ---------------------------------------------------------------- terminal


def _text(cell: Cell) -> Text:
    if cell is None:
        return Text("")
    if isinstance(cell, Text):
        return cell
    if isinstance(cell, str):
        return Text(cell)
    return Text("\n").join(v if isinstance(v, Text) else Text(str(v)) for v in cell)


def _longest_word(text: Text) -> int:
    return max((cell_len(word) for word in text.plain.split()), default=0)


def _longest_line(text: Text) -> int:
    return max((cell_len(line) for line in text.plain.split("\n")), default=0)


def _bounds(column: Column, cells: list[Text]) -> tuple[int, int]:
    """The narrowest this column may be without breaking a word it must keep whole, and the
    width that shows every cell on its own lines."""
    header = Text(column.header)
    widest = max([_longest_line(header), *(_longest_line(c) for c in cells)])
    least = max(_longest_word(header), column.min_width)
    for cell in cells:
        if column.nowrap:
            least = max(least, _longest_line(cell))
        elif column.fold or cell.overflow == "fold":
            least = max(least, min(_longest_line(cell), _FOLD_MIN))
        else:
            least = max(least, _longest_word(cell))
    return max(least, 1), max(widest, least, 1)


def _new_table(title: str | None, *, show_header: bool, boxed: bool) -> Table:
    if boxed:
        return Table(title=title, title_justify="left", show_header=show_header)
    return Table(
        title=title,
        title_justify="left",
        show_header=show_header,
        box=None,
        padding=(0, 2),
        pad_edge=False,
        collapse_padding=True,
    )


def _overhead(out: Console, columns: list[Column], *, show_header: bool, boxed: bool) -> int:
    """Columns' padding and rules: what the table adds to its cells' widths."""
    probe = _new_table(None, show_header=show_header, boxed=boxed)
    for _ in columns:
        probe.add_column(width=1)
    return Measurement.get(out, out.options, probe).maximum - len(columns)


def _widths(bounds: list[tuple[int, int]], room: int) -> list[int] | None:
    """Column widths within ``room`` that keep each column at least its least width, sharing
    what is left in proportion to what each column lacks; None when the least widths alone
    exceed ``room``."""
    least = [lo for lo, _ in bounds]
    wants = [hi - lo for lo, hi in bounds]
    spare = room - sum(least)
    if spare < 0:
        return None
    if sum(wants) <= spare:
        return [hi for _, hi in bounds]
    given = [spare * want // sum(wants) for want in wants]
    left = spare - sum(given)
    for i in sorted(range(len(wants)), key=lambda i: wants[i] - given[i], reverse=True)[:left]:
        given[i] += 1
    return [lo + g for lo, g in zip(least, given, strict=True)]


def _fitted_table(
    out: Console,
    title: str | None,
    columns: list[Column],
    rows: list[list[Text]],
    *,
    show_header: bool,
    boxed: bool,
) -> Table | None:
    """The table with each column's width set so that no kept-whole word breaks, or None when
    the console is too narrow for that."""
    bounds = [_bounds(col, [row[i] for row in rows]) for i, col in enumerate(columns)]
    room = out.width - _overhead(out, columns, show_header=show_header, boxed=boxed)
    widths = _widths(bounds, room)
    if widths is None:
        return None
    return _table(title, columns, rows, widths, show_header=show_header, boxed=boxed)


def _table(
    title: str | None,
    columns: list[Column],
    rows: list[list[Text]],
    widths: Sequence[int | None],
    *,
    show_header: bool,
    boxed: bool = False,
) -> Table:
    table = _new_table(title, show_header=show_header, boxed=boxed)
    for column, width in zip(columns, widths, strict=True):
        table.add_column(
            column.header,
            justify=column.justify,
            style=column.style,
            width=width,
            overflow="fold",
        )
    for row in rows:
        table.add_row(*row)
    return table


def _print_stacked(
    out: Console, title: str | None, columns: list[Column], rows: list[list[Text]]
) -> None:
    """Each row as its own block of ``Header  value`` lines: what a table too wide for the
    console becomes."""
    if title:
        out.print(Text(title, style="table.title"), soft_wrap=False)
    for index, row in enumerate(rows):
        if index:
            out.print()
        grid = _new_table(None, show_header=False, boxed=False)
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column(overflow="fold")
        for column, cell in zip(columns, row, strict=True):
            grid.add_row(Text(column.header or "-"), cell)
        out.print(grid, soft_wrap=False)


# ---------------------------------------------------------------- errors


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
