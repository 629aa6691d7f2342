"""Evaluation progress: a rich progress bar with live accuracy, or one plain line per task.

Both take :class:`~rllm_core.rollout.RolloutEvent` through ``on_event`` and keep a
:class:`Tally`. :func:`make_display` picks the bar on a terminal and plain lines when stdout
is not one or ``plain`` is set.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rllm_core.evaluation.scoring import PASS_REWARD
from rllm_core.rollout import RolloutEvent

__all__ = ["BarDisplay", "PlainDisplay", "Tally", "make_display", "summary_line"]


class Tally:
    """Running counts over finished rollouts: scored attempts, passing attempts, reward sum,
    infrastructure failures, and the attempts settled (scored or failed) per task."""

    def __init__(self, attempts: int) -> None:
        self.attempts = attempts
        self.scored = 0
        self.passes = 0
        self.reward_sum = 0.0
        self.failed = 0
        self.settled: Counter[str] = Counter()
        self.task_passed: dict[str, bool] = {}

    def add(self, event: RolloutEvent) -> bool:
        """Count ``event``; True when it settles its task's last attempt."""
        if event.kind == "finished" and event.reward is not None:
            self.scored += 1
            self.reward_sum += event.reward
            passed = event.reward >= PASS_REWARD
            self.passes += passed
            self.task_passed[event.task_id] = self.task_passed.get(event.task_id, False) or passed
        elif event.kind == "failed":
            self.failed += 1
        else:
            return False
        self.settled[event.task_id] += 1
        return self.settled[event.task_id] == self.attempts

    @property
    def accuracy(self) -> float | None:
        """Passing attempts over scored attempts so far (the running pass@1)."""
        return self.passes / self.scored if self.scored else None

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.scored if self.scored else None

    def text(self) -> str:
        accuracy, reward = self.accuracy, self.mean_reward
        parts = [
            f"acc {accuracy:.3f}" if accuracy is not None else "acc -",
            f"reward {reward:.3f}" if reward is not None else "reward -",
        ]
        if self.failed:
            parts.append(f"infra failures {self.failed}")
        return "  ".join(parts)


def summary_line(summary: Mapping[str, Any]) -> str:
    """The summary as one line of text."""
    k = summary["attempts"]

    def rate(key: str) -> str:
        value = summary.get(key)
        return f"{value:.3f}" if value is not None else "-"

    return (
        f"{summary['tasks']} tasks x {k} attempts: pass@{k} {rate(f'pass@{k}')}"
        f"  pass@1 {rate('pass@1')}  mean reward {rate('mean_reward')}"
        f"  infra failures {summary['infra_failures']}  wall {summary['wall_s']:.1f}s"
    )


class PlainDisplay:
    """One line per settled task, for logs."""

    def __init__(self, console: Console, tasks: int, attempts: int) -> None:
        self.console = console
        self.tasks = tasks
        self.tally = Tally(attempts)
        self.done_tasks = 0

    def info(self, message: str) -> None:
        self.console.print(message, markup=False, highlight=False, soft_wrap=True)

    def on_event(self, event: RolloutEvent) -> None:
        if not self.tally.add(event):
            return
        self.done_tasks += 1
        verdict = "pass" if self.tally.task_passed.get(event.task_id) else "fail"
        self.info(
            f"task {self.done_tasks}/{self.tasks} {event.task_id}: {verdict}  {self.tally.text()}"
        )

    def finish(self, summary: Mapping[str, Any]) -> None:
        self.info(summary_line(summary))

    def close(self) -> None:
        pass


class BarDisplay(PlainDisplay):
    """A progress bar over attempts (finished or failed), with the running accuracy, mean
    reward and infrastructure failures (:meth:`Tally.text`) and the elapsed time.

    ``clock`` gives the elapsed time (monotonic seconds). With ``auto_refresh`` the bar is
    redrawn a few times per second from a background thread; without it, after every event.
    """

    def __init__(
        self,
        console: Console,
        tasks: int,
        attempts: int,
        *,
        clock: Callable[[], float] | None = None,
        auto_refresh: bool = True,
    ) -> None:
        super().__init__(console, tasks, attempts)
        self.auto_refresh = auto_refresh
        self.progress = Progress(
            TextColumn("eval"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}", markup=False),
            TimeElapsedColumn(),
            console=console,
            auto_refresh=auto_refresh,
            get_time=clock,
            transient=False,
        )
        self.bar = self.progress.add_task("eval", total=tasks * attempts, stats=self.tally.text())
        self.progress.start()

    def on_event(self, event: RolloutEvent) -> None:
        self.tally.add(event)
        self.progress.update(self.bar, completed=event.done, stats=self.tally.text())
        if not self.auto_refresh:
            self.progress.refresh()

    def close(self) -> None:
        self.progress.stop()


def make_display(console: Console, tasks: int, attempts: int, *, plain: bool) -> PlainDisplay:
    """The bar on a terminal; plain lines with ``plain`` or when the console is not one."""
    if plain or not console.is_terminal:
        return PlainDisplay(console, tasks, attempts)
    return BarDisplay(console, tasks, attempts)
