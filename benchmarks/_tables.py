"""Text tables for the benchmark scripts' reports (imported by the scripts beside it)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence


def right_aligned(
    headers: Sequence[str], rows: Sequence[Sequence[str]], *, left: int = 0
) -> Iterator[str]:
    """The lines of a table: the headers, a rule, then the rows, every column right-aligned to
    its widest cell (the first ``left`` columns left-aligned) and columns two spaces apart."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    yield line(headers)
    yield "  ".join("-" * w for w in widths)
    for row in rows:
        yield line(row)
