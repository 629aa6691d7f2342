"""`rllm-core run` in two processes on the CPU (gloo): the quickstart on SmolLM2 with
`[trainer].parallel = { world_size = 2 }` launched by `rllm-core run` itself through
torch.distributed.run, against the same run in one process; Ctrl-C reaching rank 0, which
checkpoints with the other rank's help; rank 0 failing before its backend exists while the other
rank waits for it. That the whole quickstart learns in two processes is measured by
`benchmarks/quickstart.py --world-size 2` (docs/benchmarks.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from reference.cli_process import overrides, run_cli, run_folder
from reference.quickstart import PLAN, write_tasks
from reference.run_cuts import checkpoint_of


def _settings(tmp_path: Path, *extra: str) -> list[str]:
    tasks, held_out = write_tasks(tmp_path)
    return overrides(
        "run.save_every=1",
        "algorithm.batch_size=2",
        "algorithm.group_size=2",
        "sampling.max_tokens=4",
        f'tasks.path="{tasks}"',
        f'tasks.eval_path="{held_out}"',
        *extra,
    )


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _weights(checkpoint: Path, out: Path) -> dict:
    from rllm_trainer_backend_torch.sharded import consolidate
    from safetensors.torch import load_file

    trainer = checkpoint / "trainer"
    if (trainer / "sharded").is_dir():
        trainer = consolidate(trainer, out)
    tensors = {}
    for file in sorted(trainer.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def test_two_ranks_train_as_one_and_rank0_alone_writes_the_run(quickstart_two_steps, tmp_path):
    # The single-process run is the same quickstart run (seed, settings) in one process.
    one, single = quickstart_two_steps
    two = tmp_path / "two"
    two.mkdir()
    assert single.returncode == 0, single.stderr[-3000:]
    started = time.monotonic()
    pair = run_cli(
        "run",
        str(PLAN),
        "--json",
        *_settings(two, "run.steps=2", "trainer.parallel={world_size = 2}"),
        cwd=two,
        timeout=300,
    )
    assert pair.returncode == 0, pair.stderr[-3000:]
    assert time.monotonic() - started < 180

    # One run folder, printed once: rank 1 printed nothing of the run and wrote no folder.
    # With --json (passed on to both ranks) stdout is rank 0's summary object alone.
    report = json.loads(pair.stdout)
    assert pair.stderr.count("run folder: ") == 1
    assert len(list((two / "runs").iterdir())) == 1
    run_one, run_two = run_folder(single, one, "quickstart"), two / report["run_folder"]
    assert report["summary"] == str(Path(report["run_folder"]) / "summary.json")
    assert report["steps"] == 2
    assert (checkpoint_of(run_two / "checkpoints", 2) / "trainer" / "sharded").is_dir()
    assert json.loads((run_two / "summary.json").read_text())["status"] == "finished"

    # The same samples, the same losses and metrics, the same weights.
    rows_one, rows_two = _metrics(run_one), _metrics(run_two)
    assert [r["step"] for r in rows_two] == [1, 2]
    for a, b in zip(rows_one, rows_two, strict=True):
        assert a["reward/mean"] == b["reward/mean"]
        assert a["datums"] == b["datums"]
        assert a["tokens/trained"] == b["tokens/trained"]
        assert b["train/loss"] == pytest.approx(a["train/loss"], abs=1e-5)
        assert b["train/grad_norm"] == pytest.approx(a["train/grad_norm"], rel=1e-4, abs=1e-6)
    before = _weights(checkpoint_of(run_two / "checkpoints", 1), tmp_path / "c1")
    after = _weights(checkpoint_of(run_two / "checkpoints", 2), tmp_path / "c2")
    alone = _weights(checkpoint_of(run_one / "checkpoints", 2), tmp_path / "c3")
    assert after.keys() == before.keys() == alone.keys() and alone
    assert any(not after[k].equal(before[k]) for k in alone), "training changed no weight"
    worst = max(float((after[k] - alone[k]).abs().max()) for k in alone)
    assert worst < 1e-5, worst


def test_ctrl_c_reaches_rank0_which_checkpoints_and_exits_130(smollm2_model_dir, tmp_path):
    command = [sys.executable, "-m", "rllm_core", "run", str(PLAN), "--plain"]
    command += _settings(tmp_path, "run.steps=50", "trainer.parallel={world_size = 2}")
    run = subprocess.Popen(
        command,
        cwd=tmp_path,
        env=dict(os.environ, COLUMNS="200"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert run.stdout is not None
    seen = []
    for line in run.stdout:
        seen.append(line)
        if line.startswith("step 2/50"):
            break
    else:
        pytest.fail("".join(seen) + run.stderr.read()[-3000:])
    # What a terminal's Ctrl-C does: SIGINT to the whole foreground process group.
    os.killpg(run.pid, signal.SIGINT)
    _, err = run.communicate(timeout=180)
    assert run.returncode == 130, err[-3000:]
    assert "resume with: rllm-core run" in err
    run_dir = tmp_path / seen[0].removeprefix("run folder: ").strip()
    summary = json.loads((run_dir / "summary.json").read_text())
    last = summary["last_step"]
    assert last >= 2
    assert (checkpoint_of(run_dir / "checkpoints", last) / "trainer" / "state.json").is_file()
    assert (checkpoint_of(run_dir / "checkpoints", last) / "loop.json").is_file()


def test_rank0_failing_before_its_backend_ends_every_rank_at_once(smollm2_model_dir, tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", "-m", "rllm_core", "run", str(PLAN)]
    command += _settings(tmp_path, "trainer.parallel={world_size = 2}")
    command += ["--resume", str(tmp_path / "no-such-run")]
    started = time.monotonic()
    done = subprocess.run(
        command, cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False
    )
    assert time.monotonic() - started < 60
    assert done.returncode != 0
    assert "no-such-run" in done.stderr
    assert not (tmp_path / "runs").exists()
