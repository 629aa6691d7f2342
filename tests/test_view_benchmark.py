"""The `rllm-core view` episode benchmark answers --help, its dry run writes nothing, and a
short real run times every request it names."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "view_episode.py"


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_help_and_dry_run_start_nothing(tmp_path):
    shown = run("--help")
    for option in ("--json", "--turns", "--repeat", "--dry-run", "--output-dir"):
        assert option in shown.stdout
    dry = run("--dry-run", "--output-dir", tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "one episode of 50 turns" in dry.stdout and "GET /api/episode" in dry.stdout
    assert list(tmp_path.iterdir()) == []


def test_a_short_run_times_every_request(smollm2_model_dir, tmp_path):
    done = run("--turns", "4", "--repeat", "2", "--json", "--output-dir", tmp_path)
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert figures["turns"] == 4 and figures["met"] is True
    assert len(figures["requests"]) == 4
    for timed in figures["requests"].values():
        assert 0 < timed["median_ms"] < figures["goal_ms"] and timed["bytes"] > 0
