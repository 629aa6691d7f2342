"""What watches a run: ``[[loggers]]`` and lifecycle hooks, in their documented order, and
what a crashed run leaves behind. The loop runs for real over the gateway, a scripted sampler,
the toy renderer and the single-turn harness; only the trainer is a fake."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict
from reference.hook_recorder import Recorder
from reference.run_fakes import SAMPLING_KINDS, TOY, CrashingSource, FakeTrainer, spec_components
from rich.console import Console
from rllm_core import ComponentSpec, hookimpl
from rllm_core.cli.run_display import QuietDisplay
from rllm_core.plan import ResolvedPlan
from rllm_core.plan.load import parse_plan
from rllm_core.plan.resolve import resolve_plan
from rllm_core.plugins import PluginManager
from rllm_core.plugins.specs import Kind
from rllm_core.rollout import TooManyFailedRollouts
from rllm_core.run.checkpoints import checkpoint_steps
from rllm_core.run.components import Components, build_components, prepare_plan
from rllm_core.run.folder import RunFolder
from rllm_core.training.loop import TrainingLoop
from rllm_core.types import RunStatus

PLUGINS = PluginManager()
PLAN_PATH = "/plans/plan.toml"


class RecordingLogger:
    """A logger that writes what it receives into ``calls``."""

    def __init__(self, calls: list[tuple], fail_on: str | None = None) -> None:
        self.calls = calls
        self.fail_on = fail_on
        self.closed = 0

    def log_metrics(self, step: int, metrics: Any) -> None:
        if self.fail_on == "log_metrics":
            raise ValueError("disk full")
        self.calls.append(("log_metrics", step, dict(metrics)))

    def log_event(self, name: str, fields: Any) -> None:
        self.calls.append(("log_event", name, dict(fields)))

    def close(self) -> None:
        self.closed += 1
        self.calls.append(("close",))


def resolved_plan(**sections: Any) -> ResolvedPlan:
    data: dict[str, Any] = {
        "run": {"name": "watched", "steps": 2, "save_every": 1, "seed": 3},
        "algorithm": {"batch_size": 1, "group_size": 2, "loss": "reinforce"},
        "sampling": {"max_tokens": 4},
        "rollout": {"max_infra_retries": 0},
    }
    for name, values in sections.items():
        data[name] = data.get(name, {}) | values if isinstance(values, dict) else values
    return resolve_plan(parse_plan(data, path=PLAN_PATH), manager=PLUGINS, path=PLAN_PATH)


def make_loop(
    tmp_path: Path,
    *,
    trainer: FakeTrainer | None = None,
    source: CrashingSource | None = None,
    loggers: list[tuple[str, Any]] | None = None,
    plugins: PluginManager,
    resolved: ResolvedPlan | None = None,
    folder: RunFolder | None = None,
) -> tuple[TrainingLoop, io.StringIO]:
    resolved = resolved or resolved_plan()
    output = io.StringIO()
    components = Components(
        trainer=trainer or FakeTrainer(loss=0.25),
        renderer=TOY,
        harness=PLUGINS.get("harness", "single-turn").build({"max_retries": 0}),
        tasks=source or CrashingSource(),
        trace_store=PLUGINS.get("trace_store", "memory").build({}),
        loss=resolved.get("[algorithm].loss").build(),
        advantage=PLUGINS.get("advantage_estimator", "grpo").build({}),
        loggers=loggers or [],
    )
    loop = TrainingLoop(
        resolved=resolved,
        components=components,
        folder=folder or RunFolder.create(tmp_path / "runs", "r"),
        display=QuietDisplay(Console(file=output, width=300), 2),
        plugins=plugins,
    )
    return loop, output


def shape(calls: list[tuple]) -> list[tuple]:
    """``calls`` without payloads: what was called, for which step or event."""
    out = []
    for call in calls:
        if call[0] in ("log_metrics", "step_start", "step_end", "log_event", "run_end"):
            out.append((call[0], call[1]))
        else:
            out.append((call[0],))
    return out


@pytest.fixture
def watched(tmp_path, plugin_manager, register_plugin):
    """``watch(label="rec", **make_loop_args)``: a loop with one ``RecordingLogger`` under
    ``label``; it and a registered hook ``Recorder`` append to the same calls list. Returns the
    loop, the calls and the logger."""
    calls: list[tuple] = []
    register_plugin(Recorder(calls), name="recorder")

    def watch(label: str = "rec", **make_loop_args: Any):
        logger = RecordingLogger(calls)
        loop, _ = make_loop(
            tmp_path, loggers=[(label, logger)], plugins=plugin_manager, **make_loop_args
        )
        return loop, calls, logger

    return watch


def checkpointed_step(step: int) -> list[tuple]:
    """The shape of the calls of a step that finished and saved a checkpoint."""
    return [
        ("step_start", step),
        ("log_metrics", step),
        ("step_end", step),
        ("log_event", "checkpoint"),
    ]


# ------------------------------------------------------------------ hooks and loggers in order


def test_a_two_step_run_fires_hooks_and_loggers_in_the_documented_order(watched):
    loop, calls, _ = watched("[loggers[0]] rec")
    result = asyncio.run(loop.run())

    assert (result.status, result.step) == ("finished", 2)
    assert shape(calls) == [
        ("run_start",),
        *checkpointed_step(1),
        *checkpointed_step(2),
        ("log_event", "summary"),
        ("close",),
        ("run_end", RunStatus.COMPLETED),
    ]
    run = calls[0][1]
    assert run.run_id == loop.folder.path.name and run.name == "watched"
    assert run.output_dir == str(loop.folder.path)
    assert run.plan["run"]["steps"] == 2 and run.started_at > 0

    rows = RunFolder.read_jsonl(loop.folder.metrics)
    ends = [c for c in calls if c[0] == "step_end"]
    assert [c[2] for c in ends] == rows, "step_end receives the metrics.jsonl line"
    logged = [c for c in calls if c[0] == "log_metrics"]
    assert [c[2] for c in logged] == [{k: v for k, v in r.items() if k != "step"} for r in rows]
    assert logged[0][2]["train/loss"] == 0.25

    events = [c[1:] for c in calls if c[0] == "log_event"]
    cuts = loop.folder.checkpoints / "objects" / "cuts"
    assert events[0] == ("checkpoint", {"step": 1, "path": str(cuts / "0000000001-000001")})
    assert events[1] == ("checkpoint", {"step": 2, "path": str(cuts / "0000000002-000001")})
    assert events[2] == ("summary", json.loads(loop.folder.summary.read_text()))
    assert calls[-1] == ("run_end", RunStatus.COMPLETED, None)


def test_a_run_that_fails_on_rollouts_ends_with_failed_and_its_reason(watched):
    loop, calls, _ = watched(source=CrashingSource(good=2))
    result = asyncio.run(loop.run())

    assert (result.status, result.exit_code, result.step) == ("failed", 1, 1)
    assert shape(calls) == [
        ("run_start",),
        *checkpointed_step(1),
        ("step_start", 2),
        ("log_event", "failure"),
        ("log_event", "summary"),
        ("close",),
        ("run_end", RunStatus.FAILED),
    ]
    failure = next(c[2] for c in calls if c[1] == "failure")
    assert failure["step"] == 2 and failure["reason"] == result.reason
    assert failure["failure"]["kind"] == "verifier_error" and failure["failure"]["failed"] == 2
    error = calls[-1][2]
    assert isinstance(error, TooManyFailedRollouts) and str(error) == result.reason


# ------------------------------------------------------------------ a crash


def test_a_crash_mid_run_writes_a_failed_summary_closes_loggers_and_ends_the_run(watched):
    loop, calls, logger = watched(trainer=FakeTrainer(loss=0.25, crash_on=2))
    with pytest.raises(RuntimeError, match="the trainer fell over") as caught:
        asyncio.run(loop.run())

    summary = json.loads(loop.folder.summary.read_text())
    assert summary["status"] == "failed"
    assert summary["last_step"] == 1 and summary["steps"] == 1
    assert summary["error"] == {"type": "RuntimeError", "message": "the trainer fell over"}
    assert summary["reason"] == "RuntimeError: the trainer fell over"
    assert checkpoint_steps(loop.folder.checkpoints) == [1]
    assert logger.closed == 1
    assert shape(calls)[-5:] == [
        ("step_start", 2),
        ("log_event", "failure"),
        ("log_event", "summary"),
        ("close",),
        ("run_end", RunStatus.FAILED),
    ]
    assert calls[-1][2] is caught.value
    failure = next(c[2] for c in calls if c[1] == "failure")
    assert failure == {
        "step": 2,
        "reason": "RuntimeError: the trainer fell over",
        "error": {"type": "RuntimeError", "message": "the trainer fell over"},
    }


def test_a_run_that_cannot_start_fires_no_hook_and_closes_its_loggers(watched):
    loop, calls, _ = watched(resolved=resolved_plan(algorithm={"batch_size": 5}))
    with pytest.raises(Exception, match="batch_size 5 is larger than the 2 train tasks"):
        asyncio.run(loop.run())
    assert calls == [("close",)]
    assert not loop.folder.summary.exists()


# ------------------------------------------------------------------ observers that fail


class FailingObserver:
    @hookimpl
    def rllm_step_end(self, run, step, metrics):
        raise RuntimeError("observer failed")


def test_a_raising_logger_or_hook_is_reported_once_and_the_run_goes_on(
    tmp_path, plugin_manager, register_plugin
):
    plugin_manager.strict = False
    register_plugin(FailingObserver(), name="failing", distribution="rllm-bad-observer")
    calls: list[tuple] = []
    bad = RecordingLogger([], fail_on="log_metrics")
    good = RecordingLogger(calls)
    loop, output = make_loop(
        tmp_path,
        loggers=[("[loggers[0]] bad", bad), ("[loggers[1]] good", good)],
        plugins=plugin_manager,
    )
    result = asyncio.run(loop.run())

    assert (result.status, result.step) == ("finished", 2)
    warnings = [line for line in output.getvalue().splitlines() if line.startswith("warning:")]
    assert [w for w in warnings if "[loggers[0]] bad" in w] == [
        "warning: logger [loggers[0]] bad: log_metrics raised ValueError: disk full; it is"
        " skipped for the rest of the run"
    ]
    assert [w for w in warnings if "rllm-bad-observer" in w] == [
        "warning: plugin rllm-bad-observer 0+test: rllm_step_end raised RuntimeError: observer"
        " failed; the run goes on (reported once)"
    ]
    assert bad.calls == [("close",)], "skipped after its error, closed at the end"
    assert [c[1] for c in calls if c[0] == "log_metrics"] == [1, 2]
    assert good.closed == 1


# ------------------------------------------------------------------ the jsonl logger


def test_a_two_step_run_with_the_jsonl_logger_writes_its_records_and_events(
    tmp_path, plugin_manager
):
    folder = RunFolder.create(tmp_path / "runs", "r")
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text(
        '[run]\nname = "watched"\nsteps = 2\nsave_every = 1\nseed = 3\n'
        '[algorithm]\nbatch_size = 1\ngroup_size = 2\nloss = "reinforce"\n'
        "[sampling]\nmax_tokens = 4\n[rollout]\nmax_infra_retries = 0\n"
        '[[loggers]]\nname = "jsonl"\n'
    )
    resolved = prepare_plan(plan_file, (), run_dir=folder.path, manager=PLUGINS)
    (entry,) = resolved.of_kind(Kind.LOGGER)
    path = folder.path / "logs" / "jsonl"
    assert entry.config.path == path
    loop, _ = make_loop(
        tmp_path,
        loggers=[(f"{entry.where} {entry.name}", entry.build())],
        plugins=plugin_manager,
        resolved=resolved,
        folder=folder,
    )
    assert asyncio.run(loop.run()).status == "finished"

    lines = [json.loads(line) for line in path.read_text().splitlines()]
    records = [line for line in lines if "step" in line and "event" not in line]
    assert records == RunFolder.read_jsonl(folder.metrics)
    events = [line for line in lines if "event" in line]
    assert [e["event"] for e in events] == ["checkpoint", "checkpoint", "summary"]
    assert events[-1]["status"] == "finished" and events[-1]["last_step"] == 2


class PathConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: Path


class MaybePathConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: Path | None = None


class PathLoggers:
    @hookimpl
    def rllm_loggers(self):
        yield ComponentSpec(
            kind="logger",
            name="needs-path",
            factory=lambda c: c,
            config=PathConfig,
            summary="x",
            traits={"run_keys": ("path",)},
        )
        yield ComponentSpec(
            kind="logger",
            name="may-path",
            factory=lambda c: c,
            config=MaybePathConfig,
            summary="x",
            traits={"run_keys": ("path",)},
        )


def test_a_required_logger_path_defaults_inside_the_run_folder(
    tmp_path, plugin_manager, register_plugin
):
    register_plugin(PathLoggers(), name="path-loggers")
    plan_file = tmp_path / "plan.toml"
    plan_file.write_text(
        '[[loggers]]\nname = "needs-path"\n[[loggers]]\nname = "needs-path"\n'
        f'[[loggers]]\nname = "needs-path"\npath = "{tmp_path / "mine.jsonl"}"\n'
        '[[loggers]]\nname = "may-path"\n'
    )
    run_dir = tmp_path / "runs" / "r-1"
    resolved = prepare_plan(plan_file, (), run_dir=run_dir, manager=plugin_manager)
    assert [c.config.path for c in resolved.of_kind(Kind.LOGGER)] == [
        run_dir / "logs" / "needs-path-0",
        run_dir / "logs" / "needs-path-1",
        tmp_path / "mine.jsonl",
        None,
    ], "an optional path keeps the logger's own default"
    single = tmp_path / "single.toml"
    single.write_text('[[loggers]]\nname = "needs-path"\n')
    (only,) = prepare_plan(single, (), run_dir=run_dir, manager=plugin_manager).of_kind(Kind.LOGGER)
    assert only.config.path == run_dir / "logs" / "needs-path"


def test_built_loggers_are_exposed_with_the_plan_entry_they_come_from():
    kinds = SAMPLING_KINDS | {"[loggers[0]]": Kind.LOGGER, "[loggers[1]]": Kind.LOGGER}
    found = spec_components(kinds, {"[loggers[0]]": "jsonl", "[loggers[1]]": "tensorboard"})
    resolved = ResolvedPlan(path=PLAN_PATH, plan=parse_plan({}, path=PLAN_PATH), components=found)
    built = build_components(resolved, training=False)
    assert built.loggers == [
        ("[loggers[0]] jsonl", "logger:jsonl"),
        ("[loggers[1]] tensorboard", "logger:tensorboard"),
    ]


def test_a_resume_accepts_logger_paths_spelled_from_another_folder_spelling(tmp_path):
    from rllm_core.run.start import comparable_plan as _comparable

    def data(folder: str) -> dict:
        return {
            "plan": {
                "run": {"steps": 2},
                "loggers": [
                    {"name": "jsonl", "path": f"{folder}/logs/jsonl"},
                    {"name": "jsonl", "path": "/elsewhere/mine.jsonl"},
                ],
            }
        }

    started, resumed = data("runs/r-1"), data(str(tmp_path / "runs" / "r-1"))
    assert _comparable(started, "r-1") == _comparable(resumed, "r-1")
    assert _comparable(started, "r-1")["loggers"][1]["path"] == "/elsewhere/mine.jsonl"
    assert _comparable(data("runs/other"), "r-1") != _comparable(resumed, "r-1")
