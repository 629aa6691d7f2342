"""`rllm-core run` repeats itself bit for bit: two identical runs write the same metrics and
weights, and a run stopped by a signal and resumed trains exactly like an uninterrupted one.

SmolLM2, 2 tasks x 2 rollouts per step, 4 new tokens, a checkpoint after every step. The tasks
(``x + 0``) are easy enough that rewards differ within a group, so every step trains.

Conditions these comparisons rely on (``docs/running.md``, Reproducibility): every run is a
process started here, on this machine, with the same Python environment (library versions)
and torch's default thread count for this machine; ``[run].deterministic`` is the plan's
default (true). The runs start without ``MKL_CBWR`` in their environment, so the run itself
must set MKL's reproducible mode; ``numerics.json`` shows the mode MKL reports.

The resume comparison is also a soak (marker ``slow``): ``RLLM_SOAK_REPEATS`` times, once unless
set (``RLLM_SOAK_REPEATS=20 make test PYTEST_ARGS="-m slow"`` for the full soak).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from reference.run_cuts import checkpoint_of, cut_path, cut_steps
from rllm_core.numerics import REPRODUCIBLE_ENVIRONMENT

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "examples" / "quickstart" / "plan.toml"
TASKS = [
    {"id": f"easy-{a}", "question": f"What is {a} + 0?", "answer": str(a)} for a in (2, 5, 3, 7)
]
STEPS = 3
SOAK_REPEATS = int(os.environ.get("RLLM_SOAK_REPEATS", "1"))
UNTIMED = (
    "time/",
    "tokens/sampled_per_s",
    "tokens/trained_per_s",
    "sampler_utilization",
    "system/",
)
"""Metric keys that measure speed or the process's memory, not what was sampled or trained."""


def write_tasks(folder: Path) -> Path:
    """The train tasks in ``folder``, with a one-task held-out set beside them."""
    tasks = folder / "easy.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    held_out = {"id": "held-out-1", "question": "What is 4 + 0?", "answer": "4"}
    (folder / "held-out.jsonl").write_text(json.dumps(held_out) + "\n")
    return tasks


def overrides(tasks: Path, *, save_every: int = 1, steps: int = STEPS) -> list[str]:
    settings = {
        "run.steps": str(steps),
        "run.seed": "7",
        "run.save_every": str(save_every),
        "algorithm.batch_size": "2",
        "algorithm.group_size": "2",
        "sampling.max_tokens": "4",
        "tasks.path": json.dumps(str(tasks)),
        "tasks.eval_path": json.dumps(str(tasks.with_name("held-out.jsonl"))),
    }
    return [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]


def start(cwd: Path, *args: str) -> subprocess.Popen[str]:
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, "-m", "rllm_core.cli", "run", str(PLAN), "--plain", *args],
        cwd=cwd,
        env={k: v for k, v in os.environ.items() if k not in REPRODUCIBLE_ENVIRONMENT}
        | {"COLUMNS": "200"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


def run_folder(cwd: Path, proc: subprocess.Popen[str]) -> Path:
    """The run folder from the first line the run prints."""
    assert proc.stdout is not None
    first = proc.stdout.readline().strip()
    assert first.startswith("run folder: "), first
    return cwd / first.removeprefix("run folder: ")


def wait_for(path: Path, proc: subprocess.Popen[str], *, timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            _, err = proc.communicate()
            raise AssertionError(f"the run ended ({proc.returncode}) before {path}: {err[-3000:]}")
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout}s"
        time.sleep(0.05)


def metrics(run_dir: Path) -> list[dict[str, float]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [
        {k: v for k, v in json.loads(line).items() if not k.startswith(UNTIMED)} for line in lines
    ]


def trainable_weights(checkpoint: Path) -> dict[str, bytes]:
    from safetensors.torch import load_file

    tensors = {}
    for file in sorted((checkpoint / "trainer").glob("*.safetensors")):
        for key, value in load_file(file).items():
            tensors[f"{file.name}:{key}"] = value.contiguous().view(-1).numpy().tobytes()
    return tensors


def loop_state(checkpoint: Path) -> dict:
    return json.loads((checkpoint / "loop.json").read_text())


def test_two_identical_one_step_runs_write_identical_metrics_and_weights(
    smollm2_model_dir, tmp_path
):
    tasks = write_tasks(tmp_path)
    folders = []
    for name in ("first", "second"):
        proc = start(tmp_path / name, *overrides(tasks, steps=1))
        folders.append(run_folder(tmp_path / name, proc))
        code, _, err = finish(proc)
        assert code == 0, err[-3000:]
    first, second = folders

    numerics = json.loads((first / "numerics.json").read_text())
    assert numerics["environment"]["MKL_CBWR"] == "AUTO,STRICT"
    import torch

    with_mkl = torch.backends.mkl.is_available()
    assert numerics["components"]["[trainer]"]["mkl_cbwr"] == ("AUTO,STRICT" if with_mkl else None)
    assert numerics["components"]["[trainer]"]["deterministic_algorithms"] is True
    assert json.loads((second / "numerics.json").read_text()) == numerics

    expected = metrics(first)
    assert [m["step"] for m in expected] == [1] and expected[0]["trained"] == 1.0
    assert metrics(second) == expected
    weights = trainable_weights(checkpoint_of(first / "checkpoints", 1))
    assert weights
    assert trainable_weights(checkpoint_of(second / "checkpoints", 1)) == weights


@pytest.fixture(scope="module")
def uninterrupted(smollm2_model_dir, tmp_path_factory) -> tuple[Path, Path]:
    """The tasks file and the run folder of one uninterrupted run, which every soak attempt's
    resumed run must equal: the runs are deterministic, so one serves them all."""
    cwd = tmp_path_factory.mktemp("whole")
    tasks = write_tasks(cwd)
    whole = start(cwd, *overrides(tasks))
    whole_dir = run_folder(cwd, whole)
    code, _, err = finish(whole)
    assert code == 0, err[-3000:]
    return tasks, whole_dir


@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(SOAK_REPEATS))
def test_sigint_then_resume_equals_an_uninterrupted_run(uninterrupted, tmp_path, attempt):
    tasks, whole_dir = uninterrupted
    args = overrides(tasks)

    cut_cwd = tmp_path / "cut"
    cut = start(cut_cwd, *args)
    cut_dir = run_folder(cut_cwd, cut)
    wait_for(cut_path(cut_dir / "checkpoints", 1) / "manifest.json", cut)
    cut.send_signal(signal.SIGINT)
    code, _, err = finish(cut)
    assert code == 130, err[-3000:]
    assert f"--resume {cut_dir.relative_to(cut_cwd)}" in err
    stopped = cut_steps(cut_dir / "checkpoints")
    assert stopped and stopped[-1] < STEPS, stopped
    assert len(metrics(cut_dir)) >= stopped[-1]

    resumed = start(cut_cwd, "--resume", str(cut_dir.relative_to(cut_cwd)), *args)
    code, out, err = finish(resumed)
    assert code == 0, err[-3000:]
    resumed_from = cut_path(cut_dir.relative_to(cut_cwd) / "checkpoints", stopped[-1])
    assert f"resumed from {resumed_from} (step {stopped[-1]})" in out

    expected = metrics(whole_dir)
    assert [m["step"] for m in expected] == [1, 2, 3]
    assert all(m["trained"] == 1.0 for m in expected)
    assert metrics(cut_dir) == expected

    whole_state = loop_state(checkpoint_of(whole_dir / "checkpoints", STEPS))
    assert loop_state(checkpoint_of(cut_dir / "checkpoints", STEPS)) == whole_state
    assert whole_state["step"] == STEPS
    assert (whole_state["data"]["epoch"], whole_state["data"]["cursor"]) == (1, 2)

    expected_weights = trainable_weights(checkpoint_of(whole_dir / "checkpoints", STEPS))
    assert expected_weights
    assert trainable_weights(checkpoint_of(cut_dir / "checkpoints", STEPS)) == expected_weights


def test_sigterm_exits_143_with_a_checkpoint_of_the_last_finished_step(smollm2_model_dir, tmp_path):
    tasks = write_tasks(tmp_path)
    proc = start(tmp_path, *overrides(tasks, save_every=0))
    run_dir = run_folder(tmp_path, proc)
    deadline = time.monotonic() + 240
    while not (run_dir / "metrics.jsonl").is_file() or not metrics(run_dir):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "step 1 did not finish within 240s"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    code, _, err = finish(proc)
    assert code == 143, err[-3000:]
    assert "resume with: rllm-core run" in err

    done = len(metrics(run_dir))
    assert 1 <= done < STEPS
    assert cut_steps(run_dir / "checkpoints") == [done]
    state = loop_state(checkpoint_of(run_dir / "checkpoints", done))
    assert state["step"] == done
    assert state["data"]["cursor"] == 2 * done
    assert trainable_weights(checkpoint_of(run_dir / "checkpoints", done))
