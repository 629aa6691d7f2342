"""Text tables for the benchmark scripts' reports (imported by the scripts beside it)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence


def right_aligned(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> Iterator[str]:
    """The lines of a table: the headers, a rule, then the rows, every column right-aligned to
    its widest cell and columns two spaces apart."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    yield "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True))
    yield "  ".join("-" * w for w in widths)
    for row in rows:
        yield "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True))
