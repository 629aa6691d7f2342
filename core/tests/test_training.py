"""Run folder, data order, loop state and metrics lines of rllm_core.training."""

from __future__ import annotations

import asyncio
import io
import random
import shutil

from reference.metrics_lines import empty_step_metrics
from reference.run_fakes import TOY, CrashingSource, FakeTrainer
from rich.console import Console
from rllm_core.cli.run_display import QuietDisplay
from rllm_core.plan import ResolvedPlan
from rllm_core.plan.load import parse_plan
from rllm_core.plugins import PluginManager
from rllm_core.rollout import SessionKey
from rllm_core.run.checkpoints import latest_checkpoint, load_checkpoint, save_checkpoint
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
        saved = loaded = ""

        def save_state(self, path):
            self.saved = path

        def load_state(self, path):
            self.loaded = path

    trainer = Trainer()
    path = save_checkpoint(tmp_path / "checkpoints", trainer, state)
    assert path.name == "step-4" and trainer.saved.endswith("step-4.partial/trainer")
    assert latest_checkpoint(tmp_path / "checkpoints") == path
    restored = load_checkpoint(path, trainer)
    assert trainer.loaded == str(path / "trainer")
    assert restored.step == 4 and restored.data.to_dict() == state.data.to_dict()
    restore_rngs(restored.rngs)
    assert random.random() == expected


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
    shutil.rmtree(folder.checkpoints / "step-2")
    loop(FakeTrainer(), resume=True)._initial_state()
    assert {SessionKey.parse(s, run="my run/1").step for s in store.sessions()} == {1}
