"""What a run shows while it runs: a rich live panel, one plain line per step, or warnings only.

Every display takes the same calls from the loop: ``step_started``, ``on_event`` (each
:class:`~rllm_core.rollout.RolloutEvent`), ``step_finished`` (the metrics line), ``warn``,
``info`` and ``finish`` (the summary), then ``close`` (safe to repeat). :func:`make_display`
picks one: ``quiet`` prints only warnings, ``plain`` (or a console that is not a terminal, as
when stdout is piped to a CI log) one line per step, messages, warnings and the summary table,
otherwise the live panel with the same lines scrolling above it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from rllm_core.rollout import RolloutEvent
from rllm_core.run.metrics import reward_stats

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
    k3 = line.get("offpolicy/k3")
    k3_text = f"{k3:.2e}" if k3 is not None else "-"
    text = (
        f"step {line['step']}/{total_steps}  reward {line['reward/mean']:.3f}"
        f" (min {line['reward/min']:.2f} max {line['reward/max']:.2f})"
        f"  acc {line['accuracy']:.3f}  loss {loss_text}  k3 {k3_text}"
        f"  datums {line['datums']:.0f}"
        f"  sampled {line['tokens/sampled_per_s']:.0f} tok/s"
        f"  trained {line['tokens/trained_per_s']:.0f} tok/s"
        f"  rollout {line['time/rollout_s']:.1f}s train {line['time/train_s']:.1f}s"
    )
    if "async/policy_age_max" in line:
        text += (
            f"  age {line['async/policy_age_mean']:.1f} (max {line['async/policy_age_max']:.0f})"
            f"  stale {line['async/dropped_stale']:.0f}  queued {line['async/queue_groups']:.0f}"
            f"  waits sampler {line['async/sampler_wait_s']:.1f}s"
            f" trainer {line['async/trainer_wait_s']:.1f}s"
        )
    return text


def summary_rows(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The run summary's ``(label, value)`` rows, as the summary table shows them."""
    rows = [
        (label, fmt.format(summary[key]))
        for label, key, fmt in SUMMARY_ROWS
        if summary.get(key) is not None
    ]
    return [*rows, ("status", str(summary.get("status", "")))]


def print_summary(console: Console, summary: Mapping[str, Any]) -> None:
    """The run summary as the CLI prints tables: ruled on a terminal, ``label<TAB>value``
    lines when piped."""
    # Imported here: the CLI package imports the training modules.
    from rllm_core.cli.output import Column, print_table

    columns = [Column("what"), Column("value", justify="right")]
    title = f"run summary: {summary.get('run_dir', '')}"
    print_table(title, columns, summary_rows(summary), show_header=False, target=console)


class QuietDisplay:
    """Warnings only (``--quiet``): the command itself prints the run folder and errors."""

    def __init__(self, console: Console, total_steps: int) -> None:
        self.console = console
        self.total_steps = total_steps

    def _print(self, message: str, style: str | None = None) -> None:
        self.console.print(message, style=style, markup=False, highlight=False, soft_wrap=True)

    def info(self, message: str) -> None:
        """Dropped: quiet output is warnings only."""

    def warn(self, message: str) -> None:
        self._print(f"warning: {message}", style="yellow")

    def step_started(self, step: int, rollouts: int) -> None:
        pass

    def on_event(self, event: RolloutEvent) -> None:
        pass

    def step_finished(self, line: Mapping[str, Any]) -> None:
        pass

    def finish(self, summary: Mapping[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


class PlainDisplay(QuietDisplay):
    """Messages, warnings, one line per step and the summary table: for CI logs and pipes
    (``--plain``)."""

    def info(self, message: str) -> None:
        self._print(message)

    def step_finished(self, line: Mapping[str, Any]) -> None:
        self.info(step_line(line, self.total_steps))

    def finish(self, summary: Mapping[str, Any]) -> None:
        print_summary(self.console, summary)


class LiveDisplay(PlainDisplay):
    """A live panel under the scrolling output.

    The panel shows the step in flight (``step k/N``; with the async pipeline the rollout
    batch in flight, which step ``k`` will train, a bar of rollouts done / total, the
    running mean reward and accuracy over the step's scored rollouts, infrastructure retries
    and failures, seconds spent in rollout and then in training), the last finished step's
    throughput (completion tokens per rollout second, datum tokens per train second) and time
    split, and the warning count with the latest one. Messages, warnings and finished step
    lines print above it and stay in the scrollback; the panel itself is removed on
    :meth:`close`, and :meth:`finish` prints the summary table.

    ``clock`` gives the elapsed times (monotonic seconds). With ``auto_refresh`` the panel is
    redrawn a few times per second from a background thread; without it, after every call.
    """

    def __init__(
        self,
        console: Console,
        total_steps: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        auto_refresh: bool = True,
    ) -> None:
        super().__init__(console, total_steps)
        self.clock = clock
        self.auto_refresh = auto_refresh
        self.step = 0
        self.done = 0
        self.total = 0
        self.rewards: list[float] = []
        self.retries = 0
        self.failures = 0
        self.step_start = clock()
        self.rollout_end: float | None = None
        self.last: Mapping[str, Any] | None = None
        self.warnings: list[str] = []
        self.live = Live(
            console=console,
            get_renderable=self.render,
            auto_refresh=auto_refresh,
            transient=True,
        )
        self.live.start(refresh=True)

    def render(self) -> Group:
        """The panel as it stands now."""
        now = self.clock()
        head = Table.grid(padding=(0, 1))
        if self.step == 0:
            head.add_row(
                Text(f"step 0/{self.total_steps}", style="bold"),
                Text(f"starting, {now - self.step_start:.0f}s"),
            )
        else:
            head.add_row(
                Text(f"step {self.step}/{self.total_steps}", style="bold"),
                ProgressBar(total=max(self.total, 1), completed=self.done, width=30),
                Text(f"rollouts {self.done}/{self.total}"),
            )
            rewards = list(self.rewards)
            if rewards:
                running = reward_stats(rewards)
                stats = Text(f"reward {running['reward/mean']:.3f}  acc {running['accuracy']:.3f}")
            else:
                stats = Text("reward -  acc -")
            if self.retries:
                stats.append(f"  infra retries {self.retries}", style="yellow")
            if self.failures:
                stats.append(f"  infra failures {self.failures}", style="yellow")
            if self.rollout_end is None:
                stats.append(f"  rollout {now - self.step_start:.0f}s")
            else:
                stats.append(
                    f"  rollout {self.rollout_end - self.step_start:.0f}s"
                    f"  train {now - self.rollout_end:.0f}s"
                )
        parts: list[Any] = [head] if self.step == 0 else [head, stats]
        if self.last is not None:
            last = self.last
            parts.append(
                Text(
                    f"last step {last['step']}: sampled {last['tokens/sampled_per_s']:.0f} tok/s,"
                    f" trained {last['tokens/trained_per_s']:.0f} tok/s;"
                    f" rollout {last['time/rollout_s']:.1f}s / train {last['time/train_s']:.1f}s"
                )
            )
        if self.warnings:
            parts.append(
                Text(
                    f"warnings {len(self.warnings)}, latest: {self.warnings[-1]}",
                    style="yellow",
                    overflow="ellipsis",
                    no_wrap=True,
                )
            )
        return Group(*parts)

    def _changed(self) -> None:
        if not self.auto_refresh:
            self.live.refresh()

    def info(self, message: str) -> None:
        super().info(message)
        self._changed()

    def warn(self, message: str) -> None:
        self.warnings.append(message)
        super().warn(message)
        self._changed()

    def step_started(self, step: int, rollouts: int) -> None:
        self.step, self.done, self.total = step, 0, rollouts
        self.rewards, self.retries, self.failures = [], 0, 0
        self.step_start, self.rollout_end = self.clock(), None
        self._changed()

    def on_event(self, event: RolloutEvent) -> None:
        self.done, self.total = event.done, event.total
        if event.kind == "finished" and event.reward is not None:
            self.rewards.append(float(event.reward))
        elif event.kind == "retried":
            self.retries += 1
        elif event.kind == "failed":
            self.failures += 1
        if self.total and self.done >= self.total and self.rollout_end is None:
            self.rollout_end = self.clock()
        self._changed()

    def step_finished(self, line: Mapping[str, Any]) -> None:
        self.last = line
        super().step_finished(line)

    def finish(self, summary: Mapping[str, Any]) -> None:
        self.close()
        super().finish(summary)

    def close(self) -> None:
        self.live.stop()


def make_display(console: Console, total_steps: int, *, quiet: bool, plain: bool) -> QuietDisplay:
    """The display for these flags and this console: quiet wins over plain, and a console that
    is not a terminal gets the plain display even without ``plain``."""
    if quiet:
        return QuietDisplay(console, total_steps)
    if plain or not console.is_terminal:
        return PlainDisplay(console, total_steps)
    return LiveDisplay(console, total_steps)
