"""`rllm-core run` with every shipped logger: a 2-step quickstart on SmolLM2 with ``[[loggers]]``
jsonl, tensorboard, wandb (offline) and mlflow writes two step records to each, read back with
each library's own reader (tensorboard's ``EventAccumulator``, ``wandb leet inspect``, mlflow's
``MlflowClient``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "examples" / "quickstart" / "plan.toml"
TASKS = [
    {"id": f"easy-{a}", "question": f"What is {a} + 0?", "answer": str(a)} for a in (2, 5, 3, 7)
]
CHECKED = ("reward/mean", "train/loss", "weight_version")

pytestmark = pytest.mark.filterwarnings("ignore:The ``noload`` loader strategy is deprecated")

pytest.importorskip("rllm_logger_tensorboard")
pytest.importorskip("rllm_logger_wandb")
pytest.importorskip("rllm_logger_mlflow")


def clean_env(home: Path) -> dict[str, str]:
    """The environment without the developer's wandb and mlflow settings; wandb stays offline
    and out of the home folder."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("WANDB_", "MLFLOW_", "RLLM_CORE_DISABLE", "RLLM_CORE_STRICT"))
    }
    env |= {
        "COLUMNS": "200",
        "WANDB_SILENT": "true",
        "WANDB_ERROR_REPORTING": "false",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_CONFIG_DIR": str(home / "config"),
        "WANDB_CACHE_DIR": str(home / "cache"),
        "WANDB_DATA_DIR": str(home / "data"),
    }
    return env


def wandb_history(folder: Path, env: dict[str, str]) -> dict[int, dict]:
    (log,) = sorted(folder.glob("wandb/offline-run-*/run-*.wandb"))
    result = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(log)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    rows: dict[int, dict] = {}
    for line in result.stdout.splitlines():
        record = json.loads(line) if line.strip() else {}
        if record.get("type") == "history":
            item = record["history"]["item"]
            rows[int(record["history"]["step"]["num"])] = {
                k: v for k, v in item.items() if not k.startswith("_")
            }
    return rows


def test_a_quickstart_writes_two_step_records_to_every_logger(tiny_smol_model_dir, tmp_path):
    # The tiny Llama over SmolLM2's tokenizer: what the loggers receive does not depend on what
    # the model answers.
    tasks = tmp_path / "easy.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    held_out = tmp_path / "held-out.jsonl"
    held_out.write_text(json.dumps({"id": "h-1", "question": "What is 4 + 0?", "answer": "4"}))
    mlflow_dir = tmp_path / "mlflow-out"
    plan = tmp_path / "plan.toml"
    plan.write_text(
        PLAN.read_text(encoding="utf-8")
        + '\n[[loggers]]\nname = "jsonl"\n'
        + '\n[[loggers]]\nname = "tensorboard"\n'
        + '\n[[loggers]]\nname = "wandb"\nmode = "offline"\n'
        + f'\n[[loggers]]\nname = "mlflow"\npath = "{mlflow_dir}"\nexperiment = "quickstart"\n'
    )
    settings = {
        "run.steps": "2",
        "run.save_every": "1",
        "algorithm.batch_size": "2",
        "algorithm.group_size": "2",
        "sampling.max_tokens": "4",
        "trainer.model": json.dumps(str(tiny_smol_model_dir)),
        "tasks.path": json.dumps(str(tasks)),
        "tasks.eval_path": json.dumps(str(held_out)),
    }
    env = clean_env(tmp_path / "wandb-home")
    result = subprocess.run(
        [sys.executable, "-m", "rllm_core.cli", "run", str(plan), "--plain"]
        + [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "warning: logger" not in result.stdout + result.stderr
    run_dir = tmp_path / result.stdout.splitlines()[0].removeprefix("run folder: ")
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]

    lines = [json.loads(line) for line in (run_dir / "logs" / "jsonl").read_text().splitlines()]
    assert [line for line in lines if "event" not in line] == metrics
    assert [line["event"] for line in lines if "event" in line] == [
        "checkpoint",
        "checkpoint",
        "summary",
    ]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    board = EventAccumulator(str(run_dir / "logs" / "tensorboard"), size_guidance={"scalars": 0})
    board.Reload()
    for key in CHECKED:
        scalars = board.Scalars(key)
        assert [s.step for s in scalars] == [1, 2], key
        assert [s.value for s in scalars] == pytest.approx([m[key] for m in metrics], rel=1e-6)

    history = wandb_history(run_dir / "logs" / "wandb", env)
    assert not (tmp_path / "wandb").exists()
    assert sorted(step for step, row in history.items() if "reward/mean" in row) == [1, 2]
    for m in metrics:
        for key in CHECKED:
            assert history[m["step"]][key] == pytest.approx(m[key]), key

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{mlflow_dir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("quickstart")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    for key in CHECKED:
        points = sorted(client.get_metric_history(run.info.run_id, key), key=lambda p: p.step)
        assert [p.step for p in points] == [1, 2], key
        assert [p.value for p in points] == pytest.approx([m[key] for m in metrics])
