"""`rllm-core eval` end to end on SmolLM2: a checkpoint of the shared quickstart run and the
base model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from reference.cli_process import run_folder
from reference.run_cuts import checkpoint_of

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "examples" / "quickstart" / "plan.toml"
TASKS = [
    {"id": f"easy-{a}-{b}", "question": f"What is {a} + {b}?", "answer": str(a + b)}
    for a, b in ((2, 0), (5, 0), (3, 0), (7, 0))
]
EVAL_TASKS = [
    {"id": f"held-{a}-{b}", "question": f"What is {a} + {b}?", "answer": str(a + b)}
    for a, b in ((4, 0), (6, 0), (1, 0))
]
SMALL = ("--set", "sampling.max_tokens=3", "--set", "rollout.max_concurrency=8")


def run_cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rllm_core.cli", *args],
        cwd=cwd,
        env=dict(os.environ, COLUMNS="200"),
        capture_output=True,
        text=True,
        timeout=300,
    )


def eval_folder(result: subprocess.CompletedProcess[str], cwd: Path) -> Path:
    assert result.returncode == 0, result.stderr[-3000:]
    first = result.stdout.splitlines()[0]
    assert first.startswith("eval folder: runs/quickstart-eval-")
    return cwd / first.removeprefix("eval folder: ")


def check_results(folder: Path, task_ids: list[str], attempts: int) -> dict:
    lines = [json.loads(x) for x in (folder / "results.jsonl").read_text().splitlines()]
    assert [line["task_id"] for line in lines] == task_ids
    for line in lines:
        assert len(line["rewards"]) == attempts
        assert len(line["terminations"]) == attempts
        assert line["infra_failures"] == []
        assert line["passed"] == any(r >= 1 for r in line["rewards"])
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["tasks"] == len(task_ids)
    assert summary["attempts"] == attempts
    assert summary["infra_failures"] == 0
    passed = sum(line["passed"] for line in lines)
    assert summary[f"pass@{attempts}"] == passed / len(task_ids)
    rewards = [r for line in lines for r in line["rewards"]]
    assert abs(summary["mean_reward"] - sum(rewards) / len(rewards)) < 1e-12
    return summary


def test_eval_on_a_checkpoint_and_on_the_base_model(quickstart_two_steps, tmp_path):
    # The checkpoint is step 1 of the suite's shared quickstart run (tests/conftest.py), trained
    # by the same plan; `rllm-core run --json` itself is tested in test_run_output.py.
    run_cwd, trained = quickstart_two_steps
    assert trained.returncode == 0, trained.stderr[-3000:]
    checkpoint = checkpoint_of(run_folder(trained, run_cwd, "quickstart") / "checkpoints", 1)
    assert (checkpoint / "trainer").is_dir()
    tasks = tmp_path / "easy.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    held_out = tmp_path / "held-out.jsonl"
    held_out.write_text("".join(json.dumps(t) + "\n" for t in EVAL_TASKS))
    paths = ("--set", f'tasks.path="{tasks}"', "--set", f'tasks.eval_path="{held_out}"')

    ids = [t["id"] for t in EVAL_TASKS]
    on_checkpoint = run_cli(
        tmp_path,
        "eval",
        str(PLAN),
        "--plain",
        "--checkpoint",
        str(checkpoint),
        "--attempts",
        "2",
        "--limit",
        "3",
        *SMALL,
        *paths,
    )
    folder = eval_folder(on_checkpoint, tmp_path)
    summary = check_results(folder, ids, 2)
    assert summary["checkpoint"] == str(checkpoint)
    assert "pass@2" in summary and "pass@1" in summary
    assert "pass@2" in on_checkpoint.stdout

    base = run_cli(
        tmp_path, "eval", str(PLAN), "--json", "--limit", "2", "--temperature", "0", *SMALL, *paths
    )
    assert base.returncode == 0, base.stderr[-3000:]
    report = json.loads(base.stdout)
    base_folder = tmp_path / report["run_folder"]
    summary = check_results(base_folder, ids[:2], 1)
    assert report == summary | {
        "run_folder": report["run_folder"],
        "summary": str(Path(report["run_folder"]) / "summary.json"),
    }
    assert report["run_folder"].startswith("runs/quickstart-eval-")
    assert "pass@1" not in base.stderr  # no summary line: the object is the summary
    assert summary["checkpoint"] is None
    resolved = json.loads((base_folder / "plan.resolved.json").read_text())
    assert resolved["plan"]["sampling"]["temperature"] == 0.0

    # the attempts, as episodes.jsonl lists them, become chat JSONL for SFT
    episodes = [json.loads(x) for x in (base_folder / "episodes.jsonl").read_text().splitlines()]
    assert [e["task_id"] for e in episodes] == ids[:2]
    exported = run_cli(
        tmp_path, "dataset", "from-eval", report["run_folder"], "-o", "sft.jsonl", "--json"
    )
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert json.loads(exported.stdout)["rows"] == 2
    rows = [json.loads(x) for x in (tmp_path / "sft.jsonl").read_text().splitlines()]
    assert [(r["episode_id"], r["reward"]) for r in rows] == [
        (e["episode_id"], e["reward"]) for e in episodes
    ]
    for row, task in zip(rows, EVAL_TASKS, strict=False):
        assert task["question"] in row["messages"][-2]["content"]
        assert row["messages"][-1]["role"] == "assistant"


def test_eval_with_a_missing_checkpoint_exits_2_naming_it(tmp_path):
    missing = tmp_path / "runs" / "nowhere" / "checkpoints" / "step-3"
    result = run_cli(tmp_path, "eval", str(PLAN), "--checkpoint", str(missing))
    assert result.returncode == 2
    assert str(missing) in " ".join(result.stderr.split())
    assert not (tmp_path / "runs").exists()
