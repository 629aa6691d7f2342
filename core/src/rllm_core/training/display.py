"""What a run shows while it runs: a rich live panel, one plain line per step, or nothing.

Every display takes the same calls from the loop: ``step_started``, ``on_event`` (each
:class:`~rllm_core.rollout.RolloutEvent`), ``step_finished`` (the metrics line), ``warn``,
``info`` and ``finish`` (the summary). :func:`make_display` picks one: ``quiet`` prints only
messages and warnings, ``plain`` (or stdout not being a terminal) one line per step for logs,
otherwise the live panel.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

__all__ = ["LiveDisplay", "PlainDisplay", "QuietDisplay", "make_display", "step_line"]

SUMMARY_ROWS = (
    ("steps", "steps", "{:.0f}"),
    ("first reward (mean of first 5 steps)", "reward_first", "{:.3f}"),
    ("last reward (mean of last 5 steps)", "reward_last", "{:.3f}"),
    ("last accuracy", "accuracy_last", "{:.3f}"),
    ("episodes scored", "episodes", "{:.0f}"),
    ("infrastructure failures", "infra_failures", "{:.0f}"),
    ("tokens sampled", "tokens_sampled", "{:.0f}"),
    ("tokens trained", "tokens_trained", "{:.0f}"),
    ("rollout time (s)", "rollout_s", "{:.1f}"),
    ("train time (s)", "train_s", "{:.1f}"),
    ("wall time (s)", "wall_s", "{:.1f}"),
)


def step_line(line: Mapping[str, Any], total_steps: int) -> str:
    """One step as one line of text, for logs."""
    loss = line.get("train/loss")
    loss_text = f"{loss:.4f}" if loss is not None else "-"
    return (
        f"step {line['step']}/{total_steps}  reward {line['reward/mean']:.3f}"
        f" (min {line['reward/min']:.2f} max {line['reward/max']:.2f})"
        f"  acc {line['accuracy']:.3f}  loss {loss_text}  datums {line['datums']:.0f}"
        f"  sampled {line['tokens/sampled_per_s']:.0f} tok/s"
        f"  trained {line['tokens/trained_per_s']:.0f} tok/s"
        f"  rollout {line['time/rollout_s']:.1f}s train {line['time/train_s']:.1f}s"
    )


def summary_table(summary: Mapping[str, Any]) -> Table:
    table = Table(title=f"run summary: {summary.get('run_dir', '')}", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    for label, key, fmt in SUMMARY_ROWS:
        if summary.get(key) is not None:
            table.add_row(label, fmt.format(summary[key]))
    table.add_row("status", str(summary.get("status", "")))
    return table


class QuietDisplay:
    """Messages and warnings only (``--quiet``)."""

    def __init__(self, console: Console, total_steps: int) -> None:
        self.console = console
        self.total_steps = total_steps

    def info(self, message: str) -> None:
        self.console.print(message, markup=False, highlight=False, soft_wrap=True)

    def warn(self, message: str) -> None:
        self.console.print(f"warning: {message}", markup=False, highlight=False, soft_wrap=True)

    def step_started(self, step: int, rollouts: int) -> None:
        pass

    def on_event(self, event: Any) -> None:
        pass

    def step_finished(self, line: Mapping[str, Any]) -> None:
        pass

    def finish(self, summary: Mapping[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


class PlainDisplay(QuietDisplay):
    """One line per step and the summary table: for CI logs and pipes (``--plain``)."""

    def step_finished(self, line: Mapping[str, Any]) -> None:
        self.info(step_line(line, self.total_steps))

    def finish(self, summary: Mapping[str, Any]) -> None:
        self.console.print(summary_table(summary))


class LiveDisplay(PlainDisplay):
    """A live panel: the step, rollouts done / total, running reward and accuracy of the step
    in flight, the last step's throughput and time split, and recent warnings; finished steps
    scroll above it as plain lines."""

    def __init__(self, console: Console, total_steps: int) -> None:
        super().__init__(console, total_steps)
        self.step = 0
        self.done = 0
        self.total = 0
        self.rewards: list[float] = []
        self.retries = 0
        self.started_at = time.monotonic()
        self.last: Mapping[str, Any] | None = None
        self.warnings: list[str] = []
        self.live = Live(self._render(), console=console, auto_refresh=True, transient=True)
        self.live.start()

    def _render(self) -> Group:
        head = Text(f"step {self.step}/{self.total_steps}  ", style="bold")
        head.append(f"rollouts {self.done}/{self.total}")
        if self.rewards:
            mean = sum(self.rewards) / len(self.rewards)
            acc = sum(1 for r in self.rewards if r >= 1.0) / len(self.rewards)
            head.append(f"  reward {mean:.3f}  acc {acc:.3f}")
        if self.retries:
            head.append(f"  infra retries {self.retries}", style="yellow")
        head.append(f"  {time.monotonic() - self.started_at:.0f}s")
        parts: list[Any] = [head]
        if self.last is not None:
            last = self.last
            parts.append(
                Text(
                    f"last step: sampled {last['tokens/sampled_per_s']:.0f} tok/s,"
                    f" trained {last['tokens/trained_per_s']:.0f} tok/s,"
                    f" rollout {last['time/rollout_s']:.1f}s / train {last['time/train_s']:.1f}s"
                )
            )
        parts.extend(Text(f"warning: {w}", style="yellow") for w in self.warnings[-3:])
        return Group(*parts)

    def _refresh(self) -> None:
        self.live.update(self._render())

    def info(self, message: str) -> None:
        self.live.console.print(message, markup=False, highlight=False, soft_wrap=True)

    def warn(self, message: str) -> None:
        self.warnings.append(message)
        self._refresh()

    def step_started(self, step: int, rollouts: int) -> None:
        self.step, self.done, self.total = step, 0, rollouts
        self.rewards, self.retries = [], 0
        self.warnings = []
        self._refresh()

    def on_event(self, event: Any) -> None:
        self.done = event.done
        self.total = event.total
        if event.kind == "finished" and event.reward is not None:
            self.rewards.append(float(event.reward))
        elif event.kind == "retried":
            self.retries += 1
        self._refresh()

    def step_finished(self, line: Mapping[str, Any]) -> None:
        self.last = line
        self.info(step_line(line, self.total_steps))
        self._refresh()

    def finish(self, summary: Mapping[str, Any]) -> None:
        self.close()
        self.console.print(summary_table(summary))

    def close(self) -> None:
        self.live.stop()


def make_display(console: Console, total_steps: int, *, quiet: bool, plain: bool) -> QuietDisplay:
    """The display for these flags and this console (plain when it is not a terminal)."""
    if quiet:
        return QuietDisplay(console, total_steps)
    if plain or not console.is_terminal:
        return PlainDisplay(console, total_steps)
    return LiveDisplay(console, total_steps)
