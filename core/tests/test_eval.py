"""pass@k aggregation and the results folder of ``rllm-core eval``."""

from __future__ import annotations

import json

import pytest
from rllm_core.evaluation import EvalFolder, checkpoint_state_dir, summarize, task_results
from rllm_core.evaluation.display import Tally, summary_line
from rllm_core.evaluation.runner import CheckpointNotFound
from rllm_core.inspection.episodes import read_episodes
from rllm_core.rollout import InfraFailure, RolloutBatch, RolloutEvent
from rllm_core.types import Episode, Task, Termination


def episode(task_id: str, index: int, reward: float, termination=Termination.DONE) -> Episode:
    return Episode(
        episode_id=f"e-{task_id}-{index}",
        task_id=task_id,
        group_id=f"0-{task_id}",
        session_id=f"e-{task_id}-{index}",
        trajectories=[],
        reward=reward,
        termination=termination,
        metadata={"index": index},
    )


def task(task_id: str) -> Task:
    return Task(task_id=task_id, instruction=f"solve {task_id}")


def batch() -> tuple[list[Task], RolloutBatch]:
    """Four tasks x 3 attempts: a passes 2/3, b 0/3 (rewards 0.5), c 1/2 with one attempt
    lost to the sandbox, d every attempt lost."""
    tasks = [task(name) for name in "abcd"]
    groups = [
        [episode("a", 1, 1.0), episode("a", 0, 0.0), episode("a", 2, 1.0)],
        [episode("b", i, 0.5, Termination.MAX_TURNS) for i in range(3)],
        [episode("c", 0, 0.0), episode("c", 2, 1.0)],
        [],
    ]
    failures = [
        InfraFailure("c", 1, 2, Termination.SANDBOX_ERROR, "gone"),
        *(InfraFailure("d", i, 2, Termination.VERIFIER_ERROR, "crash") for i in (2, 0, 1)),
    ]
    return tasks, RolloutBatch(groups=groups, infra_failures=failures)


def test_task_results_order_attempts_by_index_and_keep_failures_apart():
    tasks, rollouts = batch()
    results = task_results(tasks, rollouts)
    assert [r.task_id for r in results] == ["a", "b", "c", "d"]
    assert results[0].rewards == [0.0, 1.0, 1.0]
    assert results[1].terminations == ["max_turns"] * 3
    assert results[2].rewards == [0.0, 1.0]
    assert results[2].infra_failures == [
        {"index": 1, "termination": "sandbox_error", "error": "gone"}
    ]
    assert [f["index"] for f in results[3].infra_failures] == [0, 1, 2]
    assert [r.passed for r in results] == [True, False, True, False]


def test_summary_pass_at_k_pass_at_1_and_mean_reward_by_hand():
    tasks, rollouts = batch()
    summary = summarize(task_results(tasks, rollouts), attempts=3, wall_s=2.5)
    # scored tasks a, b, c: pass@3 = 2/3; pass@1 = (2/3 + 0 + 1/2) / 3 = 7/18;
    # mean reward over 8 scored attempts = (2 + 1.5 + 1) / 8 = 4.5 / 8.
    assert summary == {
        "tasks": 4,
        "tasks_scored": 3,
        "tasks_unscored": 1,
        "attempts": 3,
        "pass@3": pytest.approx(2 / 3),
        "pass@1": pytest.approx(7 / 18),
        "mean_reward": pytest.approx(0.5625),
        "episodes": 8,
        "infra_failures": 4,
        "wall_s": 2.5,
    }


def test_summary_of_nothing_scored_has_no_rates():
    summary = summarize(task_results([task("x")], RolloutBatch(groups=[[]])), attempts=2, wall_s=0)
    assert summary["pass@2"] is None and summary["pass@1"] is None
    assert summary["mean_reward"] is None and summary["tasks_unscored"] == 1


def test_results_folder_files(tmp_path):
    tasks, rollouts = batch()
    results = task_results(tasks, rollouts)
    folder = EvalFolder.create(tmp_path / "runs", "quick start", when=0)
    assert folder.path.parent == tmp_path / "runs"
    assert folder.path.name.startswith("quick-start-eval-")
    summary = summarize(results, attempts=3, wall_s=1.0)
    folder.write_results(results, summary, [e for group in rollouts.groups for e in group])
    lines = [json.loads(x) for x in folder.results.read_text().splitlines()]
    assert lines[0] == {
        "task_id": "a",
        "rewards": [0.0, 1.0, 1.0],
        "terminations": ["done", "done", "done"],
        "passed": True,
        "pass@1": pytest.approx(2 / 3),
        "infra_failures": [],
    }
    assert lines[3]["rewards"] == [] and lines[3]["pass@1"] is None
    # one record per scored attempt, as a run folder's episodes.jsonl (what `traces show` reads)
    episodes = read_episodes(folder)
    assert [(e["episode_id"], e["reward"], e["step"]) for e in episodes[:3]] == [
        ("e-a-1", 1.0, 0),
        ("e-a-0", 0.0, 0),
        ("e-a-2", 1.0, 0),
    ]
    assert len(episodes) == 8 and episodes[3]["termination"] == "max_turns"
    assert episodes[0]["session_id"] == "e-a-1" and episodes[0]["trajectories"] == []
    assert json.loads(folder.summary.read_text())["pass@3"] == pytest.approx(2 / 3)
    assert "pass@3 0.667  pass@1 0.389  mean reward 0.562" in summary_line(summary)


def event(kind: str, task_id: str, reward: float | None = None) -> RolloutEvent:
    return RolloutEvent(kind, task_id, 0, 0, "s", 0, 0, 4, reward=reward)


def test_tally_counts_live_accuracy_and_settled_tasks():
    tally = Tally(attempts=2)
    assert tally.accuracy is None and tally.text() == "acc -  reward -"
    assert tally.add(event("started", "a")) is False
    assert tally.add(event("finished", "a", 1.0)) is False
    assert tally.add(event("retried", "a")) is False
    assert tally.add(event("failed", "a")) is True
    assert tally.add(event("finished", "b", 0.5)) is False
    assert tally.accuracy == 0.5 and tally.mean_reward == 0.75
    assert tally.task_passed == {"a": True, "b": False}
    assert tally.text() == "acc 0.500  reward 0.750  infra failures 1"


def test_checkpoint_state_dir(tmp_path):
    with pytest.raises(CheckpointNotFound, match="step-9"):
        checkpoint_state_dir(tmp_path / "step-9")
    (tmp_path / "step-1").mkdir()
    with pytest.raises(CheckpointNotFound, match="no trainer/"):
        checkpoint_state_dir(tmp_path / "step-1")
    (tmp_path / "step-1" / "trainer").mkdir()
    assert checkpoint_state_dir(tmp_path / "step-1") == tmp_path / "step-1" / "trainer"
