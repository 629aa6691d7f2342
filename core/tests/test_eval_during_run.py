"""Evaluation during an RL run: ``plan check`` refuses the evaluation keys a run could not
honour (each issue naming the key and what to set), the metric names an evaluation writes, and
the best checkpoint kept besides the latest."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from rllm_core.errors import PlanError
from rllm_core.evaluation.during_run import eval_run_id, is_eval_step
from rllm_core.evaluation.scoring import TaskResult, summarize
from rllm_core.plan.eval_check import eval_metric, rankable_metrics, summary_keys
from rllm_core.plan.load import parse_plan
from rllm_core.plan.resolve import resolve_plan
from rllm_core.plugins import PluginManager
from rllm_core.rollout.sessions import SessionKey
from rllm_core.run.best import BestCheckpoint
from rllm_core.run.checkpoints import checkpoint_steps
from rllm_core.run.cuts import claim_incarnation, write_cut
from rllm_core.run.state import DataOrder, LoopState
from rllm_core.storage.folder_objects import FolderObjectStore


def resolve(tmp_path: Path, run: dict[str, Any], tasks: dict[str, Any] | None = None, **more):
    (tmp_path / "train.jsonl").write_text('{"id": "t", "question": "1+1?", "answer": "2"}\n')
    (tmp_path / "eval.jsonl").write_text('{"id": "e", "question": "2+2?", "answer": "4"}\n')
    data = {
        "run": run,
        "algorithm": {"loss": "ppo-clip", "advantage": "grpo"},
        "trainer": {"name": "torch", "model": "smollm2-135m-instruct"},
        "harness": {"name": "single-turn"},
        "tasks": tasks
        if tasks is not None
        else {"name": "jsonl", "path": "train.jsonl", "eval_path": "eval.jsonl"},
        **more,
    }
    return resolve_plan(parse_plan(data), manager=PluginManager(), path=str(tmp_path / "p.toml"))


def refusals(tmp_path: Path, *args: Any, **kwargs: Any) -> list[Any]:
    with pytest.raises(PlanError) as caught:
        resolve(tmp_path, *args, **kwargs)
    return caught.value.issues


def test_an_evaluating_plan_with_an_eval_split_passes(tmp_path):
    resolved = resolve(tmp_path, {"eval_every": 5, "eval_attempts": 4, "keep_best": "eval/pass@4"})
    assert resolved.plan.run.keep_best == "eval/pass@4"


def test_eval_every_without_an_eval_split_names_tasks_eval_path(tmp_path):
    (issue,) = refusals(tmp_path, {"eval_every": 5}, tasks={"name": "jsonl", "path": "train.jsonl"})
    assert issue.location == "[tasks].eval_path"
    assert "[tasks] (jsonl) has none" in issue.message
    assert issue.hint.startswith("set [tasks].eval_path")


def test_keep_best_and_attempts_without_eval_every_are_refused(tmp_path):
    issues = refusals(tmp_path, {"keep_best": "eval/pass@1", "eval_attempts": 3})
    assert sorted(i.location for i in issues) == ["[run].eval_attempts", "[run].keep_best"]
    assert all("eval_every = 0 runs none" in i.message for i in issues)


def test_keep_best_naming_an_unwritten_metric_lists_the_valid_ones(tmp_path):
    (issue,) = refusals(tmp_path, {"eval_every": 2, "keep_best": "eval/pass@8"})
    assert issue.location == "[run].keep_best" and issue.value == "eval/pass@8"
    assert issue.hint == "set keep_best to one of 'eval/pass@1', 'eval/mean_reward'"


def test_eval_every_with_an_object_store_is_refused(tmp_path):
    issues = refusals(
        tmp_path,
        {"eval_every": 2, "pipeline": "async"},
        object_store={"name": "file", "root": str(tmp_path / "store")},
    )
    (issue,) = [i for i in issues if i.location == "[run].eval_every"]
    assert "the trainer role has no gateway to evaluate through" in issue.message


def test_the_metrics_are_the_scoring_summary_under_eval_and_time():
    results = [TaskResult("a", rewards=[1.0, 0.0]), TaskResult("b", rewards=[0.0, 0.0])]
    summary = summarize(results, attempts=2, wall_s=1.5)
    metrics = {eval_metric(k): summary[k] for k in summary_keys(2)}
    assert metrics == {
        "eval/pass@1": 0.25,
        "eval/pass@2": 0.5,
        "eval/mean_reward": 0.25,
        "eval/tasks_scored": 2,
        "eval/episodes": 4,
        "eval/infra_failures": 0,
        "time/eval_s": 1.5,
    }
    assert set(rankable_metrics(2)) <= set(metrics)


def test_the_quickstart_evaluates_at_steps_5_10_and_13():
    assert [s for s in range(1, 14) if is_eval_step(s, every=5, last=13)] == [5, 10, 13]
    assert not any(is_eval_step(s, every=0, last=13) for s in range(1, 14))


def test_evaluation_sessions_are_never_parsed_as_the_runs_own():
    session = SessionKey(eval_run_id("quickstart-1"), 5, "h-1", 0, 0).encode()
    assert SessionKey.parse(session, run="quickstart-1") is None
    assert SessionKey.parse(session, run=eval_run_id("quickstart-1")).step == 5


class _Trainer:
    weight_version = 3

    def __init__(self, weights: bytes) -> None:
        self.weights = weights

    def save_state(self, path: str) -> None:
        os.makedirs(path)
        Path(path, "weights.bin").write_bytes(self.weights)


def _cut(root: Path, step: int, weights: bytes) -> Path:
    store = FolderObjectStore(root)
    state = LoopState(step=step, data=DataOrder(size=4, seed=0))
    ref = write_cut(
        store,
        "",
        _Trainer(weights),
        state,
        trigger="scheduled",
        incarnation=claim_incarnation(store, ""),
        workdir=root / "staging",
    )
    return root / "objects" / "cuts" / ref.name


def test_the_best_checkpoint_is_replaced_only_by_a_better_one_and_outlives_its_cut(tmp_path):
    root = tmp_path / "checkpoints"
    best = BestCheckpoint(root, "eval/pass@1")
    assert best.improves(0.0) and not best.improves(None) and not best.improves(float("nan"))
    first = _cut(root, 5, b"five")
    best.keep(step=5, value=0.5, cut=first)
    assert not best.improves(0.5) and best.improves(0.75)
    second = _cut(root, 10, b"ten")
    best.keep(step=10, value=0.75, cut=second)
    record = json.loads((root / "best" / "best.json").read_text())
    assert record == {
        "step": 10,
        "metric": "eval/pass@1",
        "value": 0.75,
        "cut": "objects/cuts/" + second.name,
    }
    assert (root / "best" / "trainer" / "weights.bin").read_bytes() == b"ten"
    assert json.loads((root / "best" / "loop.json").read_text())["step"] == 10
    # Pruning the cut leaves the best one whole, and the best folder is not taken for a cut.
    for path in sorted(second.rglob("*"), reverse=True):
        path.unlink() if path.is_file() else path.rmdir()
    second.rmdir()
    assert (root / "best" / "trainer" / "weights.bin").read_bytes() == b"ten"
    assert checkpoint_steps(root) == [5]
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("best")) == ["best"]
    # A resumed run reads the record back; another metric starts afresh.
    assert not BestCheckpoint(root, "eval/pass@1").improves(0.5)
    assert BestCheckpoint(root, "eval/mean_reward").improves(0.0)
