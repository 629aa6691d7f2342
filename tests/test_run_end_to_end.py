"""`rllm-core run` end to end on SmolLM2: 2 steps, 2 tasks x 2 rollouts, 4 new tokens (the
``quickstart_two_steps`` run of tests/conftest.py); the same asynchronously for 3 steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from reference.cli_process import overrides, run_cli, run_folder
from reference.quickstart import PLAN, TASKS, write_tasks
from reference.run_cuts import checkpoint_of


def trainable_weights(checkpoint: Path) -> dict[str, list[float]]:
    from safetensors.torch import load_file

    tensors = {}
    for file in sorted((checkpoint / "trainer").glob("*.safetensors")):
        tensors.update({k: v.flatten().tolist() for k, v in load_file(file).items()})
    return tensors


def test_quickstart_plan_trains_on_exactly_the_sampled_tokens(
    smollm2_model_dir, quickstart_two_steps
):
    cwd, result = quickstart_two_steps
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = run_folder(result, cwd, "quickstart")

    for name in ("plan.toml", "plan.resolved.json", "summary.json", "reward.png", "loss.png"):
        assert (run_dir / name).is_file(), name
    resolved = json.loads((run_dir / "plan.resolved.json").read_text())
    configs = {c["where"]: c["config"] for c in resolved["components"]}
    assert configs["[trace_store]"]["path"] == str(Path("runs") / run_dir.name / "traces")
    assert configs["[renderer]"]["tokenizer"] == str(smollm2_model_dir)
    assert configs["[trainer]"]["logprob_temperature"] == 1.0

    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for line in metrics:
        assert line["episodes"] == 4.0
        assert line["infra_failures"] == 0.0
        assert 0.0 <= line["reward/min"] <= line["reward/mean"] <= line["reward/max"] <= 1.0
        assert line["weight_version"] == float(line["step"])
        assert line["tokens/sampled"] <= 4 * 4
        assert "train/loss" in line and "train/grad_norm" in line
    episodes = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) == 8
    assert {e["task_id"] for e in episodes} <= {t["id"] for t in TASKS}

    assert (checkpoint_of(run_dir / "checkpoints", 1) / "loop.json").is_file()
    assert (checkpoint_of(run_dir / "checkpoints", 2) / "loop.json").is_file()
    before = trainable_weights(checkpoint_of(run_dir / "checkpoints", 1))
    after = trainable_weights(checkpoint_of(run_dir / "checkpoints", 2))
    assert before.keys() == after.keys() and before
    assert any(before[k] != after[k] for k in before)

    # eval_every = 5 of 2 steps: the held-out split is evaluated after the last step only, and
    # that step's checkpoint is the best by eval/pass@1.
    assert not any(key.startswith("eval/") for key in metrics[0])
    assert (metrics[1]["eval/tasks_scored"], metrics[1]["eval/episodes"]) == (1.0, 1.0)
    assert metrics[1]["eval/pass@1"] in (0.0, 1.0)
    evals = [json.loads(line) for line in (run_dir / "evals.jsonl").read_text().splitlines()]
    assert [(e["step"], [r["task_id"] for r in e["results"]]) for e in evals] == [(2, ["h-1"])]
    assert (run_dir / "eval.png").is_file()
    best = json.loads((run_dir / "checkpoints" / "best" / "best.json").read_text())
    assert (best["step"], best["metric"]) == (2, "eval/pass@1")
    assert best["value"] == metrics[1]["eval/pass@1"]
    assert trainable_weights(run_dir / "checkpoints" / "best") == after
    assert json.loads((run_dir / "summary.json").read_text())["best"] == best

    from rllm_trace_store_deltachain.store import DeltaChainTraceStore

    store = DeltaChainTraceStore(run_dir / "traces")
    try:
        datums = [json.loads(line) for line in (run_dir / "datums.jsonl").read_text().splitlines()]
        assert len(datums) == sum(int(m["datums"]) for m in metrics)
        assert not [d for d in datums if ".eval-" in d["session_id"]]
        for datum in datums:
            traces = store.session(datum["session_id"])
            assert len(traces) == 1
            trace = traces[0]
            sampled = trace.record.completion_token_ids
            assert datum["token_ids"] == trace.prompt_token_ids + sampled
            assert datum["action_mask"] == [False] * len(trace.prompt_token_ids) + [True] * len(
                sampled
            )
            assert datum["logprobs"][len(trace.prompt_token_ids) :] == pytest.approx(
                trace.record.logprobs, abs=0
            )
    finally:
        store.close()


def test_async_quickstart_trains_each_batch_within_the_age_bound(smollm2_model_dir, tmp_path):
    tasks, held_out = write_tasks(tmp_path)
    plan = tmp_path / "plan.toml"
    plan.write_text(
        PLAN.read_text().replace('path = "../tasks/arithmetic.jsonl"', f'path = "{tasks}"')
        + '\n[sample_buffer]\nname = "file"\n'
    )
    result = run_cli(
        "run",
        str(plan),
        "--plain",
        *overrides(
            'run.pipeline="async"',
            "run.steps=3",
            "algorithm.max_policy_age=1",
            "algorithm.batch_size=2",
            "algorithm.group_size=2",
            "sampling.max_tokens=4",
            f'tasks.eval_path="{held_out}"',
        ),
        cwd=tmp_path,
        timeout=300,
        columns=200,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = run_folder(result, tmp_path, "quickstart")
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert [m["weight_version"] for m in metrics] == [1.0, 2.0, 3.0]
    for line in metrics:
        assert line["async/dropped_stale"] == 0.0 and line["episodes"] == 4.0
        assert 0.0 <= line["async/policy_age_mean"] <= line["async/policy_age_max"] <= 1.0
        # At most the next batch (lead 1) waits, and nothing once the last step is trained.
        assert line["async/queue_groups"] in (0.0, 1.0, 2.0)
    assert metrics[-1]["async/queue_groups"] == 0.0
    episodes = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    for episode in episodes:
        trained_at = metrics[episode["step"] - 1]["weight_version"] - 1
        assert 0 <= trained_at - episode["weight_version"] <= 1, episode
    assert (run_dir / "sample_buffer" / "samples.log").is_file()
    queued = [json.loads(line) for line in (run_dir / "queue.jsonl").read_text().splitlines()]
    assert [row["step"] for row in queued] == [1, 2, 3]
    assert "age " in result.stdout
