"""The run and eval displays, rendered by rich into a terminal console held in memory.

Real rollout events and real metrics lines go in; the text rich writes comes out, with its
cursor and colour escapes stripped. Clocks are injected and auto-refresh is off, so every
frame is drawn by the call that changes it and the elapsed times are exact.
"""

from __future__ import annotations

import re
from io import StringIO

import pytest
from rich.console import Console
from rllm_core.algorithms import DatumReport
from rllm_core.cli import run_display
from rllm_core.evaluation import display as eval_display
from rllm_core.evaluation.scoring import summarize as eval_summarize
from rllm_core.evaluation.scoring import task_results
from rllm_core.rollout import InfraFailure, RolloutBatch, RolloutEvent
from rllm_core.run.metrics import step_metrics, summarize
from rllm_core.types import Datum, Episode, Step, Task, Termination, Trajectory

ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Screen:
    """A terminal console writing to memory; :meth:`since_last` returns what was written since
    the previous call, as text."""

    def __init__(self, *, terminal: bool = True) -> None:
        self.stream = StringIO()
        self.console = Console(file=self.stream, force_terminal=terminal, width=120)
        self.mark = 0

    def since_last(self) -> str:
        raw = self.stream.getvalue()
        new, self.mark = raw[self.mark :], len(raw)
        return ESCAPE.sub("", new)

    def text(self) -> str:
        return ESCAPE.sub("", self.stream.getvalue())


def event(kind: str, task_id: str, index: int, done: int, total: int, **fields) -> RolloutEvent:
    return RolloutEvent(
        kind=kind,
        task_id=task_id,
        index=index,
        attempt=0,
        session_id=f"s-{task_id}-{index}",
        step=3,
        done=done,
        total=total,
        **fields,
    )


def episode(task_id: str, index: int, reward: float, completion: int) -> Episode:
    step = Step(
        trace_id=f"t-{task_id}-{index}",
        prompt_token_ids=[1, 2, 3],
        completion_token_ids=list(range(completion)),
        logprobs=[-0.5] * completion,
    )
    return Episode(
        episode_id=f"e-{task_id}-{index}",
        task_id=task_id,
        group_id=f"3-{task_id}",
        session_id=f"s-{task_id}-{index}",
        trajectories=(Trajectory(lineage_id="main", steps=(step,), reward=reward),),
        reward=reward,
    )


def datum(tokens: int) -> Datum:
    return Datum(
        token_ids=list(range(tokens)),
        logprobs=[0.0] * tokens,
        advantages=[0.5] * tokens,
        action_mask=[True] * tokens,
        observation_mask=[False] * tokens,
    )


def metrics_line() -> dict:
    """Step 3: rewards 1.0, 0.5, 0.0 over 250 completion tokens in 2 s of rollout, 90 datum
    tokens trained in 0.5 s, one rollout failed after one retry."""
    episodes = [episode("a", 0, 1.0, 100), episode("a", 1, 0.5, 100), episode("b", 0, 0.0, 50)]
    report = DatumReport(groups=2, zero_variance_groups=1, episodes=3, datums=2)
    return step_metrics(
        step=3,
        episodes=episodes,
        infra_failures=1,
        retries=1,
        report=report.metrics(),
        datums=[datum(60), datum(30)],
        train={"loss": 0.25},
        rollout_s=2.0,
        train_s=0.5,
        step_s=2.5,
        weight_version=3,
    )


def run_summary(line: dict) -> dict:
    return summarize([line]) | {"status": "finished", "run_dir": "runs/demo", "wall_s": 9.0}


def test_the_live_panel_follows_the_rollouts_of_the_step_in_flight():
    screen, clock = Screen(), Clock()
    shown = run_display.LiveDisplay(screen.console, 10, clock=clock, auto_refresh=False)
    clock.now += 4
    shown.live.refresh()
    assert "step 0/10 starting, 4s" in screen.since_last()

    shown.step_started(3, 4)
    for index, task in enumerate("aabb"):
        shown.on_event(event("started", task, index % 2, 0, 4))
    shown.on_event(event("finished", "a", 0, 1, 4, reward=1.0, termination=Termination.DONE))
    shown.on_event(event("finished", "a", 1, 2, 4, reward=0.5, termination=Termination.DONE))
    clock.now += 7
    shown.on_event(event("retried", "b", 1, 2, 4, error="sandbox gone"))
    frame = screen.since_last()
    assert re.search(r"step 3/10 ━+╺━+ rollouts 2/4\n", frame)
    assert "reward 0.750  acc 0.500  infra retries 1  rollout 7s" in frame

    shown.on_event(event("finished", "b", 0, 3, 4, reward=0.0, termination=Termination.DONE))
    shown.on_event(event("failed", "b", 1, 4, 4, error="sandbox gone"))
    clock.now += 2
    shown.info("checkpoint: runs/demo/checkpoints/step-3")
    frame = screen.since_last()
    assert "checkpoint: runs/demo/checkpoints/step-3" in frame
    assert "rollouts 4/4" in frame
    assert "reward 0.500  acc 0.333  infra retries 1  infra failures 1  rollout 7s  train 2s" in (
        frame
    )

    shown.close()
    assert not shown.live.is_started


def test_the_live_panel_shows_the_last_step_warnings_and_ends_with_the_summary():
    screen, clock = Screen(), Clock()
    shown = run_display.LiveDisplay(screen.console, 10, clock=clock, auto_refresh=False)
    line = metrics_line()
    shown.step_started(3, 4)
    shown.warn("step 3: 2 cumulative-session resets")
    shown.warn("step 3: 1 of 2 groups had equal rewards (no learning signal)")
    shown.step_finished(line)
    frame = screen.since_last()
    assert "warning: step 3: 2 cumulative-session resets" in frame
    assert run_display.step_line(line, 10) in frame
    assert "step 3/10  reward 0.500 (min 0.00 max 1.00)  acc 0.333  loss 0.2500" in frame
    assert "last step 3: sampled 125 tok/s, trained 180 tok/s; rollout 2.0s / train 0.5s" in frame
    assert "warnings 2, latest: step 3: 1 of 2 groups had equal rewards" in frame

    shown.step_started(4, 4)
    frame = screen.since_last()
    assert "step 4/10" in frame and "rollouts 0/4" in frame
    assert "last step 3:" in frame and "warnings 2, latest:" in frame

    shown.finish(run_summary(line))
    shown.close()
    end = screen.since_last()
    assert not shown.live.is_started
    assert "run summary: runs/demo" in end
    assert re.search(r"tokens sampled\s*│\s*250", end)
    assert re.search(r"tokens trained\s*│\s*90", end)
    assert re.search(r"status\s*│\s*finished", end)


def feed_a_run(shown: run_display.QuietDisplay, steps: int) -> None:
    shown.info("built trainer: trainer:torch")
    for step in range(1, steps + 1):
        shown.step_started(step, 2)
        shown.on_event(event("finished", "a", 0, 1, 2, reward=1.0))
        shown.on_event(event("finished", "a", 1, 2, 2, reward=0.0))
        shown.step_finished(metrics_line() | {"step": step})
    shown.warn("step 2: 1 infrastructure retries, 1 rollouts excluded")
    shown.finish(run_summary(metrics_line()))
    shown.close()


def test_quiet_prints_only_warnings():
    screen = Screen()
    shown = run_display.make_display(screen.console, 2, quiet=True, plain=True)
    feed_a_run(shown, 2)
    assert screen.text() == "warning: step 2: 1 infrastructure retries, 1 rollouts excluded\n"


def test_a_step_line_shows_the_async_figures_when_the_line_has_them():
    line = metrics_line()
    assert " age " not in run_display.step_line(line, 10)
    line |= {
        "async/policy_age_mean": 0.5,
        "async/policy_age_max": 1.0,
        "async/dropped_stale": 2.0,
        "async/queue_groups": 4.0,
        "async/sampler_wait_s": 1.25,
        "async/trainer_wait_s": 0.0,
    }
    text = run_display.step_line(line, 10)
    assert text.endswith("  age 0.5 (max 1)  stale 2  queued 4  waits sampler 1.2s trainer 0.0s")


def test_plain_prints_one_line_per_step_then_the_summary():
    screen = Screen()
    shown = run_display.make_display(screen.console, 2, quiet=False, plain=True)
    assert type(shown) is run_display.PlainDisplay
    feed_a_run(shown, 2)
    lines = screen.text().splitlines()
    assert lines[0] == "built trainer: trainer:torch"
    assert [line.split("  ")[0] for line in lines[1:3]] == ["step 1/2", "step 2/2"]
    assert lines[3] == "warning: step 2: 1 infrastructure retries, 1 rollouts excluded"
    assert "run summary: runs/demo" in lines[4]
    assert sum(1 for line in lines if line.startswith("step ")) == 2


@pytest.mark.parametrize(
    ("terminal", "quiet", "plain", "kind"),
    [
        (True, False, False, run_display.LiveDisplay),
        (False, False, False, run_display.PlainDisplay),
        (True, False, True, run_display.PlainDisplay),
        (True, True, False, run_display.QuietDisplay),
        (False, True, False, run_display.QuietDisplay),
    ],
)
def test_make_display_picks_by_flags_and_terminal(terminal, quiet, plain, kind):
    screen = Screen(terminal=terminal)
    shown = run_display.make_display(screen.console, 3, quiet=quiet, plain=plain)
    shown.close()
    assert type(shown) is kind


def eval_events() -> list[RolloutEvent]:
    """Two tasks, two attempts each: a passes once, b fails once on infrastructure and
    scores 0.5 once."""
    return [
        event("started", "a", 0, 0, 4),
        event("finished", "a", 0, 1, 4, reward=1.0, termination=Termination.DONE),
        event("started", "a", 1, 1, 4),
        event("finished", "a", 1, 2, 4, reward=0.0, termination=Termination.DONE),
        event("started", "b", 0, 2, 4),
        event("retried", "b", 0, 2, 4, error="sandbox gone"),
        event("failed", "b", 0, 3, 4, error="sandbox gone"),
        event("finished", "b", 1, 4, 4, reward=0.5, termination=Termination.DONE),
    ]


def eval_summary() -> dict:
    tasks = [Task(task_id="a", instruction="x"), Task(task_id="b", instruction="y")]
    batch = RolloutBatch(
        groups=[[episode("a", 0, 1.0, 5), episode("a", 1, 0.0, 5)], [episode("b", 1, 0.5, 5)]],
        infra_failures=[
            InfraFailure(
                task_id="b", index=0, attempt=1, termination=Termination.SANDBOX_ERROR, error="gone"
            )
        ],
    )
    return eval_summarize(task_results(tasks, batch), attempts=2, wall_s=5.0)


def test_the_eval_bar_shows_live_accuracy():
    screen, clock = Screen(), Clock()
    bar = eval_display.BarDisplay(screen.console, 2, 2, clock=clock, auto_refresh=False)
    events = eval_events()
    for item in events[:4]:
        bar.on_event(item)
    clock.now += 65
    bar.on_event(events[4])
    frame = screen.since_last()
    assert re.search(r"eval .*━.* 2/4 acc 0\.500  reward 0\.500 0:01:05", frame)
    for item in events[5:]:
        bar.on_event(item)
    frame = screen.since_last()
    assert re.search(r"4/4 acc 0\.333  reward 0\.500  infra failures 1 0:01:05", frame)
    bar.close()
    summary = eval_summary()
    bar.finish(summary)
    assert eval_display.summary_line(summary) in screen.since_last()


def test_plain_eval_prints_one_line_per_settled_task():
    screen = Screen(terminal=False)
    shown = eval_display.make_display(screen.console, 2, 2, plain=False)
    assert type(shown) is eval_display.PlainDisplay
    for item in eval_events():
        shown.on_event(item)
    summary = eval_summary()
    shown.finish(summary)
    assert screen.text().splitlines() == [
        "task 1/2 a: pass  acc 0.500  reward 0.500",
        "task 2/2 b: fail  acc 0.333  reward 0.500  infra failures 1",
        eval_display.summary_line(summary),
    ]


@pytest.mark.parametrize(
    ("terminal", "plain", "kind"),
    [
        (True, False, eval_display.BarDisplay),
        (True, True, eval_display.PlainDisplay),
        (False, False, eval_display.PlainDisplay),
    ],
)
def test_eval_make_display_picks_the_bar_only_on_a_terminal(terminal, plain, kind):
    shown = eval_display.make_display(Screen(terminal=terminal).console, 2, 2, plain=plain)
    shown.close()
    assert type(shown) is kind
