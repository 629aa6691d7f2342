"""``rllm-core`` run as a real subprocess of the test's interpreter, the way a shell runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 60, columns: int = 100
) -> subprocess.CompletedProcess[str]:
    """``python -m rllm_core.cli *args`` in ``cwd`` with a terminal ``columns`` wide; its output
    captured as text, its exit status left to the caller."""
    return subprocess.run(
        [sys.executable, "-m", "rllm_core.cli", *args],
        cwd=cwd,
        env=dict(os.environ, COLUMNS=str(columns)),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def overrides(*assignments: str) -> list[str]:
    """``--set`` before each ``key=value`` assignment, as ``rllm-core run`` takes them."""
    return [arg for assignment in assignments for arg in ("--set", assignment)]


def plan_check(plan: Path, cwd: Path) -> dict[str, Any]:
    """What ``rllm-core plan check --json plan`` prints when run in ``cwd``; it must pass."""
    done = run_cli("plan", "check", "--json", str(plan), cwd=cwd, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


def run_folder(done: subprocess.CompletedProcess[str], cwd: Path, prefix: str) -> Path:
    """The folder a finished ``rllm-core run`` started in ``cwd`` names on its first line,
    which must be ``run folder: runs/<prefix>-...``."""
    first = done.stdout.splitlines()[0]
    assert first.startswith(f"run folder: runs/{prefix}-"), first
    return cwd / first.removeprefix("run folder: ")


def vllm_group_overrides(
    model: Path, sampler_url: str, cwd: Path, tasks: Path, *assignments: str
) -> list[str]:
    """:func:`overrides` for a run that trains one group of two episodes a step on ``model``,
    sampling from the vLLM server at ``sampler_url`` with weights exported under
    ``cwd/weights``, on the tasks at ``tasks``, saving nothing; then ``assignments``."""
    return overrides(
        "run.save_every=0",
        "algorithm.batch_size=1",
        "algorithm.group_size=2",
        f'trainer.model="{model}"',
        'sampler.name="vllm"',
        f'sampler.urls=["{sampler_url}"]',
        f'sampler.weights_dir="{cwd / "weights"}"',
        f'tasks.path="{tasks}"',
        *assignments,
    )
