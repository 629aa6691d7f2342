"""The GPU scale-out benchmark answers --help and, on this machine without a GPU, --dry-run:
it prints every run's command, and its plans pass plan check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu" / "scale_out.py"


def _script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120
    )


def test_scale_out_answers_help() -> None:
    done = _script("--help")
    assert done.returncode == 0, done.stderr
    for option in ("--json", "--dry-run", "--vllm-url", "--steps", "--output-dir"):
        assert option in done.stdout


def test_scale_out_dry_run_prints_the_commands_and_checks_the_plans(tmp_path: Path) -> None:
    done = _script("--dry-run", "--output-dir", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    runs = [line for line in lines if " -m rllm_core run " in line]
    assert len(runs) == 3
    assert "sampler.serve={model = " in runs[0]
    assert "max_lora_rank = 16}" in runs[0]
    assert f'sampler.weights_dir="{tmp_path}/weights"' in runs[0]
    assert 'trainer.parallel={world_size = 2, strategy = "fsdp"}' in runs[2]
    assert all(f'run.output_dir="{tmp_path}/runs"' in run for run in runs)
    assert lines[-1] == "plans ok: vllm, torch sampler, fsdp"
    assert not (tmp_path / "runs").exists()


def test_scale_out_dry_run_with_a_server_url_starts_none() -> None:
    done = _script("--dry-run", "--vllm-url", "http://10.0.0.5:8000")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "sampler.serve" not in done.stdout
    assert 'sampler.urls=["http://10.0.0.5:8000"]' in done.stdout
