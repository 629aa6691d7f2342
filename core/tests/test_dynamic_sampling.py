"""Dynamic sampling (``[algorithm].filter_groups = "zero-variance"``): groups whose rewards are
all equal never reach the trainer, and a step rolls out more tasks until it has ``batch_size``
groups that carry a signal, in both pipelines."""

from __future__ import annotations

import asyncio
import io
from collections import Counter
from typing import Any

import pytest
from reference.run_fakes import TOY, FakeTrainer
from rich.console import Console
from rllm_core.cli.run_display import PlainDisplay
from rllm_core.plan import ResolvedPlan
from rllm_core.plan.load import PlanError, parse_plan
from rllm_core.plugins import PluginManager
from rllm_core.rollout import RolloutBatch
from rllm_core.rollout.dynamic import informative, sample_informative
from rllm_core.run.components import Components
from rllm_core.run.folder import RunFolder
from rllm_core.storage.memory_buffer import MemorySampleBuffer
from rllm_core.training.loop import TrainingLoop
from rllm_core.types import Episode, Grade, HarnessOutcome, Task, Termination

PLUGINS = PluginManager()
PLAN_PATH = "/plans/filter.toml"


def episode(task: str, reward: float, *, infra: bool = False) -> Episode:
    termination = Termination.SANDBOX_ERROR if infra else Termination.DONE
    return Episode(
        episode_id=f"{task}-{reward}",
        task_id=task,
        group_id=task,
        session_id=f"{task}-{reward}",
        trajectories=(),
        reward=reward,
        termination=termination,
    )


def test_a_group_is_informative_when_two_scored_rewards_differ():
    assert informative([episode("a", 0.0), episode("a", 1.0)])
    assert not informative([episode("a", 1.0), episode("a", 1.0)])
    assert not informative([episode("a", 1.0)])
    assert not informative([])
    assert not informative([episode("a", 0.0), episode("a", 1.0, infra=True)])


class Rollouts:
    """``run`` for :func:`sample_informative`: each task's group has the rewards ``table``
    gives its id (a task not in it: one success and one failure)."""

    def __init__(self, table: dict[str, list[float]]) -> None:
        self.table = table
        self.rounds: list[list[str]] = []

    async def __call__(self, tasks: list[Task]) -> RolloutBatch:
        self.rounds.append([t.task_id for t in tasks])
        groups = [
            [episode(t.task_id, r) for r in self.table.get(t.task_id, [0.0, 1.0])] for t in tasks
        ]
        return RolloutBatch(groups=groups, retries=1, wall_s=0.5, episodes_done=2 * len(tasks))


def tasks(*names: str) -> list[Task]:
    return [Task(task_id=name, instruction=name) for name in names]


class Supply:
    """``take`` for :func:`sample_informative`: tasks ``n0``, ``n1``, ... in order."""

    def __init__(self) -> None:
        self.next = 0

    def __call__(self, k: int) -> list[Task]:
        out = tasks(*(f"n{self.next + i}" for i in range(k)))
        self.next += k
        return out


def sample(table, first, *, batch_size, rounds=3, mode="zero-variance", check=None):
    run, take = Rollouts(table), Supply()
    result = asyncio.run(
        sample_informative(
            run,
            tasks(*first),
            take,
            batch_size=batch_size,
            filter_groups=mode,
            max_sample_batches=rounds,
            **({"check": check} if check else {}),
        )
    )
    return result, run.rounds


def test_without_filtering_one_round_keeps_every_group():
    flat = {"a": [1.0, 1.0], "b": [0.0, 0.0]}
    result, rounds = sample(flat, ["a", "b", "c"], batch_size=3, mode="none")
    assert rounds == [["a", "b", "c"]]
    assert [g[0].task_id for g in result.batch.groups] == ["a", "b", "c"]
    assert result.metrics() == {
        "groups/sampled": 3.0,
        "groups/filtered": 0.0,
        "groups/surplus": 0.0,
        "groups/short": 0.0,
        "groups/sample_batches": 1.0,
    }


def test_flat_groups_are_left_out_and_the_batch_refilled_in_proportion():
    flat = {"a": [1.0, 1.0], "b": [0.0, 0.0], "c": [0.0, 0.0], "n1": [1.0, 1.0]}
    seen = []
    result, rounds = sample(
        flat,
        ["a", "b", "c", "d"],
        batch_size=4,
        check=lambda batch, round_tasks: seen.append([t.task_id for t in round_tasks]),
    )
    # One informative group of four: the three missing at a rate of 1/4 would be 12 tasks,
    # capped at batch_size; of those n1 is flat, so a third round is not needed.
    assert rounds == [["a", "b", "c", "d"], ["n0", "n1", "n2", "n3"]]
    assert seen == rounds
    trained = [g[0].task_id for g in result.batch.groups if informative(g)]
    assert trained == ["d", "n0", "n2", "n3"]
    assert sorted(g[0].task_id for g in result.batch.groups if not informative(g)) == [
        "a",
        "b",
        "c",
        "n1",
    ]
    assert [t.task_id for t in result.tasks] == ["a", "b", "c", "d", "n0", "n1", "n2", "n3"]
    assert len(result.episodes) == 16
    assert (result.batch.retries, result.batch.wall_s, result.batch.episodes_done) == (2, 1.0, 16)
    assert result.metrics() == {
        "groups/sampled": 8.0,
        "groups/filtered": 4.0,
        "groups/surplus": 0.0,
        "groups/short": 0.0,
        "groups/sample_batches": 2.0,
    }


def test_informative_groups_beyond_the_batch_are_surplus():
    result, rounds = sample({"a": [1.0, 1.0]}, ["a", "b", "c"], batch_size=3)
    # Two of three informative: one missing at a rate of 2/3 asks for two.
    assert rounds == [["a", "b", "c"], ["n0", "n1"]]
    assert [g[0].task_id for g in result.batch.groups if informative(g)] == ["b", "c", "n0"]
    assert (result.surplus, result.short) == (1, 0)
    result, rounds = sample({"a": [1.0, 1.0], "b": [1.0, 1.0]}, ["a", "b", "c"], batch_size=3)
    # One of three informative: two missing at a rate of 1/3 is six, capped at three.
    assert rounds[1] == ["n0", "n1", "n2"]
    assert [g[0].task_id for g in result.batch.groups if informative(g)] == ["c", "n0", "n1"]
    assert (result.surplus, result.short) == (1, 0)


def test_a_step_that_runs_out_of_rounds_trains_what_it_has():
    class Flat(dict):
        def get(self, key, default=None):
            return [1.0, 1.0]

    every_task_flat = Flat()
    result, rounds = sample(every_task_flat, ["a", "b"], batch_size=2, rounds=3)
    assert len(rounds) == 3 and all(len(r) == 2 for r in rounds)
    assert not [g for g in result.batch.groups if informative(g)]
    assert (result.filtered, result.short, result.rounds) == (6, 2, 3)


def test_a_task_the_step_already_rolled_out_is_not_rolled_out_again():
    run = Rollouts({"a": [1.0, 1.0], "b": [1.0, 1.0]})
    result = asyncio.run(
        sample_informative(
            run,
            tasks("a", "b"),
            lambda k: tasks("b", "c", "a")[:k],
            batch_size=2,
            filter_groups="zero-variance",
            max_sample_batches=5,
        )
    )
    # The second round keeps only c; the third finds nothing new and ends the sampling.
    assert run.rounds == [["a", "b"], ["c"]]
    assert (result.rounds, result.short) == (2, 1)


def test_a_check_that_raises_ends_the_step():
    def check(batch, round_tasks):
        if round_tasks[0].task_id == "n0":
            raise RuntimeError("too many failed rollouts")

    with pytest.raises(RuntimeError, match="too many"):
        sample({"a": [1.0, 1.0]}, ["a", "b"], batch_size=2, check=check)


def test_plan_check_refuses_filtering_groups_of_one():
    with pytest.raises(PlanError, match=r"filter_groups.*group_size >= 2"):
        parse_plan(
            {"algorithm": {"group_size": 1, "filter_groups": "zero-variance"}}, path=PLAN_PATH
        )
    with pytest.raises(PlanError, match="filter_groups"):
        parse_plan({"algorithm": {"filter_groups": "all"}}, path=PLAN_PATH)
    with pytest.raises(PlanError, match="max_sample_batches"):
        parse_plan({"algorithm": {"max_sample_batches": 0}}, path=PLAN_PATH)


# ---------------------------------------------------------------- through the training loop

STEPS, BATCH, GROUP = 3, 2, 2


class HalfFlatSource:
    """Eight tasks: ``t0``..``t3`` always score 0 (their groups carry no signal), ``t4``..``t7``
    alternate 0 and 1 per task, so each of their groups of two has one of each."""

    def __init__(self) -> None:
        self.graded: Counter[str] = Counter()

    def tasks(self, split: str = "train") -> list[Task]:
        return [Task(task_id=f"t{i}", instruction=f"What is {i} + 2?") for i in range(8)]

    async def grade(self, task: Task, outcome: HarnessOutcome, sandbox: Any) -> Grade:
        self.graded[task.task_id] += 1
        if int(task.task_id[1:]) < 4:
            return Grade(reward=0.0)
        return Grade(reward=float(self.graded[task.task_id] % 2))


def run_loop(tmp_path, pipeline: str, mode: str) -> tuple[FakeTrainer, list[dict[str, Any]], str]:
    plan = parse_plan(
        {
            "run": {"steps": STEPS, "seed": 3, "pipeline": pipeline},
            "algorithm": {
                "batch_size": BATCH,
                "group_size": GROUP,
                "filter_groups": mode,
                "max_sample_batches": 8,
                # The fake's sampler reports version 0 throughout: no group may go stale.
                "max_policy_age": STEPS if pipeline == "async" else 0,
            },
            "sampling": {"max_tokens": 4},
            "rollout": {"max_infra_retries": 0},
        },
        path=PLAN_PATH,
    )
    trainer = FakeTrainer()
    components = Components(
        trainer=trainer,
        renderer=TOY,
        harness=PLUGINS.get("harness", "single-turn").build({"max_retries": 0}),
        tasks=HalfFlatSource(),
        trace_store=PLUGINS.get("trace_store", "memory").build({}),
        loss=object(),
        advantage=PLUGINS.get("advantage_estimator", "grpo").build({}),
        sample_buffer=MemorySampleBuffer(),
    )
    folder = RunFolder.create(tmp_path, "r")
    shown = io.StringIO()
    loop = TrainingLoop(
        resolved=ResolvedPlan(path=PLAN_PATH, plan=plan),
        components=components,
        folder=folder,
        display=PlainDisplay(Console(file=shown, width=200), STEPS),
    )
    result = asyncio.run(loop.run())
    assert (result.status, result.step) == ("finished", STEPS)
    return trainer, RunFolder.read_jsonl(folder.metrics), shown.getvalue()


def trained_tasks(trainer: FakeTrainer) -> list[set[str]]:
    """Per update, the tasks of the groups it trained on."""
    return [
        {d.metadata["task_id"] for d in datums}
        for name, (datums, _) in ((n, a) for n, a in trainer.calls if n == "forward_backward")
    ]


@pytest.mark.parametrize("pipeline", ["sync", "async"])
def test_filtered_groups_never_reach_the_trainer_and_every_step_is_refilled(tmp_path, pipeline):
    trainer, lines, shown = run_loop(tmp_path, pipeline, "zero-variance")
    updates = trained_tasks(trainer)
    assert len(updates) == STEPS
    for tasks_trained in updates:
        assert len(tasks_trained) == BATCH
        assert all(int(task[1:]) >= 4 for task in tasks_trained), tasks_trained
    assert all(line["groups/short"] == 0 for line in lines)
    assert sum(line["groups/filtered"] for line in lines) > 0
    for line in lines:
        assert line["groups/sampled"] == line["groups/filtered"] + BATCH + line["groups/surplus"]
        assert line["datums"] == BATCH * GROUP
    sampled = sum(line["groups/sampled"] for line in lines)
    filtered = sum(line["groups/filtered"] for line in lines)
    assert f"dynamic sampling: {sampled:.0f} groups rolled out, {filtered:.0f} with equal" in shown
    assert "no learning signal" not in shown


def test_without_filtering_flat_groups_are_trained_on_as_before(tmp_path):
    trainer, lines, shown = run_loop(tmp_path, "sync", "none")
    trained = set().union(*trained_tasks(trainer))
    assert any(int(task[1:]) < 4 for task in trained)
    assert all(line["groups/sample_batches"] == 1 for line in lines)
    # One line at the end, not one per step.
    flat = sum(line["zero_variance_groups"] for line in lines)
    assert flat > 0
    assert shown.count("no learning signal") == 1
    assert f"{flat:.0f} of {BATCH * STEPS} groups had equal rewards" in shown
