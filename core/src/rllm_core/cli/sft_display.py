"""What ``rllm-core sft`` prints: messages, warnings and one line per step (``--quiet``:
warnings only)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rich.console import Console

__all__ = ["SftDisplay", "sft_step_line"]


def sft_step_line(line: Mapping[str, Any], total_steps: int) -> str:
    """One SFT step as one line of text."""
    text = (
        f"step {line['step']}/{total_steps}  epoch {line['epoch']:.0f}"
        f"  nll {line['train/nll']:.4f}  tokens {line['train/tokens']:.0f}"
        f"  sequences {line['train/sequences']:.0f}"
    )
    if "train/learning_rate" in line:
        text += f"  lr {line['train/learning_rate']:.2e}"
    if "eval/nll" in line:
        text += f"  eval nll {line['eval/nll']:.4f}"
    return text + f"  {line['time/step_s']:.2f}s"


class SftDisplay:
    def __init__(self, console: Console, err: Console, total_steps: int, *, quiet: bool) -> None:
        self.console = console
        self.err = err
        self.total_steps = total_steps
        self.quiet = quiet

    def info(self, message: str) -> None:
        if not self.quiet:
            self.console.print(message, markup=False, soft_wrap=True)

    def warn(self, message: str) -> None:
        self.err.print(f"warning: {message}", markup=False, soft_wrap=True)

    def step_finished(self, line: Mapping[str, Any]) -> None:
        self.info(sft_step_line(line, self.total_steps))

    def finish(self, summary: Mapping[str, Any]) -> None:
        if self.quiet:
            return
        # Imported here: the CLI package imports the training modules.
        from rllm_core.cli.output import Column, print_table

        rows = []
        for label, key, shape in (
            ("steps", "last_step", "{:.0f}"),
            ("first nll (mean of first 5 steps)", "nll_first", "{:.4f}"),
            ("last nll (mean of last 5 steps)", "nll_last", "{:.4f}"),
            ("eval nll", "eval_nll", "{:.4f}"),
            ("tokens trained", "tokens_trained", "{:.0f}"),
            ("wall time (s)", "wall_s", "{:.1f}"),
        ):
            value = summary.get(key)
            if value is not None:
                rows.append((label, shape.format(value)))
        columns = [Column("what"), Column("value", justify="right")]
        print_table("summary", columns, rows, show_header=False, target=self.console)
