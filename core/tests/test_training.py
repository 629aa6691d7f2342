"""Run folder, data order, loop state and metrics lines of rllm_core.training."""

from __future__ import annotations

import asyncio
import io
import json
import random
from pathlib import Path

import pytest
from reference.metrics_lines import empty_step_metrics
from reference.run_cuts import point_latest_at
from reference.run_fakes import TOY, CrashingSource, FakeTrainer
from rich.console import Console
from rllm_core.cli.run_display import QuietDisplay
from rllm_core.errors import CutDigestError
from rllm_core.plan import ResolvedPlan
from rllm_core.plan.load import parse_plan
from rllm_core.plugins import PluginManager
from rllm_core.rollout import SessionKey
from rllm_core.run.checkpoints import (
    RunCheckpoints,
    checkpoint_folder,
    checkpoint_steps,
    run_folder_of,
)
from rllm_core.run.components import Components
from rllm_core.run.folder import RunFolder, folder_name
from rllm_core.run.metrics import reward_stats, summarize
from rllm_core.run.state import DataOrder, LoopState, capture_rngs, restore_rngs
from rllm_core.training.loop import TrainingLoop


def test_folder_name_is_safe_and_unique(tmp_path):
    assert folder_name("fast run/1", 0.0).startswith("fast-run-1-")
    a = RunFolder.create(tmp_path, "x", when=0.0)
    b = RunFolder.create(tmp_path, "x", when=0.0)
    assert b.path.name == a.path.name + "-2"


def test_truncate_after_drops_later_steps_and_torn_lines(tmp_path):
    folder = RunFolder.create(tmp_path, "r")
    folder.append(folder.metrics, [{"step": 1}, {"step": 2}, {"step": 3}])
    with folder.metrics.open("a") as out:
        out.write('{"step": 4')
    folder.truncate_after(2)
    assert RunFolder.read_jsonl(folder.metrics) == [{"step": 1}, {"step": 2}]


def test_data_order_never_repeats_a_task_within_a_batch_and_reshuffles():
    order = DataOrder(size=5, seed=3)
    first = order.take(2) + order.take(2)
    assert len(set(first)) == 4
    third = order.take(2)
    assert order.epoch == 1 and order.cursor == 2
    assert sorted(order.order) == [0, 1, 2, 3, 4]
    assert third == order.order[:2]
    again = DataOrder(size=5, seed=3)
    assert again.take(2) + again.take(2) == first


def test_loop_state_round_trips_data_and_rngs(tmp_path):
    random.seed(11)
    state = LoopState(step=4, data=DataOrder(size=3, seed=1), rngs=capture_rngs())
    state.data.take(2)
    expected = random.random()

    class Trainer:
        weight_version = 3

        def save_state(self, path):
            Path(path).mkdir(parents=True)
            (Path(path) / "weights").write_text("w3")

        def load_state(self, path):
            self.loaded = (Path(path) / "weights").read_text()

    trainer = Trainer()
    checkpoints = RunCheckpoints(tmp_path / "checkpoints")
    path = checkpoints.save(trainer, state, trigger="scheduled")
    assert path.name == "0000000004-000001" and (path / "trainer" / "weights").is_file()
    latest = RunCheckpoints(tmp_path / "checkpoints").latest()
    assert latest is not None and (latest.step, latest.path) == (4, path)
    restored = checkpoints.load(latest, trainer)
    assert trainer.loaded == "w3"
    assert restored.step == 4 and restored.data.to_dict() == state.data.to_dict()
    restore_rngs(restored.rngs)
    assert random.random() == expected
    (path / "trainer" / "weights").write_text("w4")
    with pytest.raises(CutDigestError):
        checkpoints.load(latest, trainer)


def test_a_run_folder_names_its_latest_checkpoint_and_a_checkpoint_its_run(tmp_path):
    class Trainer:
        weight_version = 1

        def save_state(self, path):
            Path(path).mkdir(parents=True)

    run = tmp_path / "runs" / "r"
    (run / "checkpoints").mkdir(parents=True)
    (run / "plan.resolved.json").write_text("{}")
    checkpoints = RunCheckpoints(run / "checkpoints")
    for step in (1, 2):
        saved = checkpoints.save(
            Trainer(), LoopState(step=step, data=DataOrder(size=2, seed=0)), trigger="scheduled"
        )
    assert checkpoint_folder(run) == saved and saved.name == "0000000002-000001"
    assert checkpoint_folder(saved) == saved
    assert run_folder_of(saved) == run.resolve() and run_folder_of(tmp_path) is None
    assert checkpoint_steps(run / "checkpoints") == [1, 2]


def test_a_run_written_before_cuts_still_resumes_from_its_step_folders(tmp_path):
    state = LoopState(step=2, data=DataOrder(size=3, seed=1))
    for step in (1, 2):
        folder = tmp_path / "checkpoints" / f"step-{step}"
        (folder / "trainer").mkdir(parents=True)
        (folder / "loop.json").write_text(json.dumps(state.to_dict() | {"step": step}))
    (tmp_path / "checkpoints" / "step-3.partial" / "trainer").mkdir(parents=True)

    class Trainer:
        def load_state(self, path):
            self.loaded = path

    checkpoints = RunCheckpoints(tmp_path / "checkpoints")
    latest = checkpoints.latest()
    assert latest is not None and latest.path.name == "step-2" and latest.ref is None
    trainer = Trainer()
    assert checkpoints.load(latest, trainer).step == 2
    assert trainer.loaded == str(latest.path / "trainer")
    assert checkpoint_steps(tmp_path / "checkpoints") == [1, 2]


def test_reward_stats_and_summary():
    stats = reward_stats([0.0, 0.5, 1.0, 1.0])
    assert stats == {
        "reward/mean": 0.625,
        "reward/std": (((0.625**2) + 0.125**2 + 2 * 0.375**2) / 4) ** 0.5,
        "reward/min": 0.0,
        "reward/max": 1.0,
        "accuracy": 0.5,
    }
    row = {
        "reward/mean": 0.5,
        "accuracy": 0.25,
        "episodes": 4.0,
        "infra_failures": 1.0,
        "tokens/sampled": 10.0,
        "tokens/trained": 30.0,
        "time/rollout_s": 2.0,
        "time/train_s": 1.0,
    }
    summary = summarize([row | {"reward/mean": 0.0}, row])
    assert summary["reward_first"] == 0.25 and summary["episodes"] == 8.0


def test_sampler_utilization_is_busy_time_over_rollout_time_of_the_clocked_steps():
    common = dict(train_s=1.0, step_s=5.0, weight_version=1)
    unclocked = empty_step_metrics(step=1, rollout_s=4.0, **common)
    assert "sampler_utilization" not in unclocked and "time/sampler_busy_s" not in unclocked
    first = empty_step_metrics(step=2, rollout_s=4.0, sampler_busy_s=3.0, **common)
    second = empty_step_metrics(step=3, rollout_s=6.0, sampler_busy_s=3.0, **common)
    assert first["sampler_utilization"] == 0.75 and second["sampler_utilization"] == 0.5
    assert first["time/sampler_busy_s"] == 3.0
    # 6 busy seconds over the 10 rollout seconds of the clocked steps; step 1 is left out.
    assert summarize([unclocked, first, second])["sampler_utilization"] == 0.6
    assert summarize([unclocked])["sampler_utilization"] is None


def test_resume_forgets_the_interrupted_steps_sessions_of_a_run_whose_name_is_sanitised(tmp_path):
    plugins = PluginManager()
    plan = parse_plan(
        {
            "run": {"steps": 2, "save_every": 1, "seed": 3},
            "algorithm": {"batch_size": 1, "group_size": 2},
            "sampling": {"max_tokens": 4},
        },
        path="plan.toml",
    )
    store = plugins.get("trace_store", "memory").build({})
    folder = RunFolder.create(tmp_path / "runs", "r")

    def loop(trainer: FakeTrainer, *, resume: bool) -> TrainingLoop:
        components = Components(
            trainer=trainer,
            renderer=TOY,
            harness=plugins.get("harness", "single-turn").build({"max_retries": 0}),
            tasks=CrashingSource(),
            trace_store=store,
            loss=object(),  # type: ignore[arg-type]
            advantage=plugins.get("advantage_estimator", "grpo").build({}),
        )
        return TrainingLoop(
            resolved=ResolvedPlan(path="plan.toml", plan=plan),
            components=components,
            folder=folder,
            display=QuietDisplay(Console(file=io.StringIO()), 2),
            resume=resume,
            run_id="my run/1",
        )

    assert asyncio.run(loop(FakeTrainer(), resume=False).run()).status == "finished"
    steps = sorted({SessionKey.parse(s, run="my run/1").step for s in store.sessions()})
    assert steps == [1, 2] and all(s.startswith("my_run_1-s") for s in store.sessions())
    # Step 2 was interrupted before its checkpoint: the resumed run reruns it.
    point_latest_at(folder.checkpoints, 1)
    loop(FakeTrainer(), resume=True)._initial_state()
    assert {SessionKey.parse(s, run="my run/1").step for s in store.sessions()} == {1}
