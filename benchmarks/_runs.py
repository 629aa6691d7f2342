"""Running ``rllm-core`` commands as their own processes (the quickstart's runs, any stage with
its peak memory) and reading their run folders (imported by the benchmark scripts beside it)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart" / "plan.toml"
RLLM = ROOT / ".venv" / "bin" / "rllm-core"


def quickstart_command(runs: Path, steps: int, *settings: str) -> list[str]:
    """``rllm-core run`` of the quickstart into ``runs`` for ``steps`` steps, with each of
    ``settings`` (``key=value``) as a ``--set``."""
    command = [str(RLLM), "run", str(QUICKSTART), "--plain"]
    command += ["--set", f"run.output_dir={runs}", "--set", f"run.steps={steps}"]
    for setting in settings:
        command += ["--set", setting]
    return command


def figures_of(run_dir: Path, wall_s: float) -> dict[str, Any]:
    """A finished run's figures: first/last-5 reward, wall, rollout seconds and tokens, and the
    sums of the ``groups/*`` counts its lines have."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = [float(r["reward/mean"]) for r in rows]
    rollout = [float(r["time/rollout_s"]) for r in rows]
    tokens = [float(r["tokens/sampled"]) for r in rows]
    steady_s = sum(rollout[1:])
    return {
        "run_dir": str(run_dir),
        "steps": len(rows),
        "wall_s": wall_s,
        "first5_reward": sum(rewards[:5]) / len(rewards[:5]),
        "last5_reward": sum(rewards[-5:]) / len(rewards[-5:]),
        "rewards": rewards,
        "rollout_s_per_step": sum(rollout) / len(rollout),
        "rollout_s_by_step": rollout,
        "train_s_per_step": sum(float(r["time/train_s"]) for r in rows) / len(rows),
        "tokens_sampled": sum(tokens),
        "sampled_tokens_per_s": sum(tokens) / sum(rollout) if sum(rollout) else None,
        "steady_sampled_tokens_per_s": sum(tokens[1:]) / steady_s if steady_s else None,
        "groups": {
            key: sum(float(r.get(key, 0.0)) for r in rows)
            for key in ("groups", "zero_variance_groups", "groups/sampled", "groups/filtered")
        },
    }


def run_quickstart(command: list[str], runs: Path) -> dict[str, Any]:
    """Run ``command`` from the repository root; the figures of the one run folder it wrote
    under ``runs``."""
    started = time.monotonic()
    result = subprocess.run(
        command,
        cwd=ROOT,
        env=dict(os.environ, COLUMNS="200"),
        capture_output=True,
        text=True,
    )
    wall_s = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(
            f"{' '.join(command)} exited {result.returncode}:\n{result.stderr[-4000:]}"
        )
    found = sorted(runs.glob("quickstart-*"))
    if len(found) != 1:
        raise SystemExit(f"expected one run folder under {runs}, found {found}")
    return figures_of(found[0], wall_s)


def stage(command: list[str]) -> dict[str, Any]:
    """Run ``command`` from the repository root; its JSON summary (stdout), wall seconds and
    peak RSS in GB (its own or a waited-for child's, whichever was larger)."""
    started = time.monotonic()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(
            command, cwd=ROOT, env=dict(os.environ, COLUMNS="200"), stdout=out, stderr=err
        )
        # os.wait4 rather than Popen.wait: it also gives the child's resource usage.
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        wall_s = time.monotonic() - started
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if process.returncode != 0:
        raise SystemExit(f"{shlex.join(command)} exited {process.returncode}:\n{stderr[-4000:]}")
    return {
        "summary": json.loads(stdout) if stdout.strip() else {},
        "wall_s": wall_s,
        "peak_rss_gb": usage.ru_maxrss / 2**20,
    }
