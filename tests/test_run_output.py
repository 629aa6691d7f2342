"""A run's terminal output is rllm-core's own: library progress bars and warnings go to the run
folder's ``run.log`` instead (``rllm_core.run.runlog``, docs/running.md, The run folder).

The end-to-end test trains SmolLM2 for one step of 1 task x 2 rollouts, 4 new tokens: loading it
with transformers draws a "Loading weights" progress bar, and wrapping it with peft warns (a
``FutureWarning``) on transformers releases that renamed ``is_gradient_checkpointing``.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rllm_core.numerics import REPRODUCIBLE_ENVIRONMENT
from rllm_core.run.runlog import RunLog

ROOT = Path(__file__).resolve().parents[1]
PLAN = ROOT / "examples" / "quickstart" / "plan.toml"
PROGRESS_BAR = ("%|", "it/s]", "Loading weights")


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rllm_core.cli", *args],
        cwd=cwd,
        env={k: v for k, v in os.environ.items() if k not in REPRODUCIBLE_ENVIRONMENT}
        | {"COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def assert_clean(text: str) -> None:
    for mark in (*PROGRESS_BAR, "FutureWarning", "DeprecationWarning", "warnings.warn("):
        assert mark not in text, f"{mark!r} in the output:\n{text[-3000:]}"


def test_a_run_prints_no_library_progress_bar_or_warning(smollm2_model_dir, tmp_path):
    tasks = tmp_path / "easy.jsonl"
    tasks.write_text(json.dumps({"id": "easy-2", "question": "What is 2 + 0?", "answer": "2"}))
    held_out = tmp_path / "held-out.jsonl"
    held_out.write_text(json.dumps({"id": "held-1", "question": "What is 4 + 0?", "answer": "4"}))
    settings = {
        "run.steps": "1",
        "algorithm.batch_size": "1",
        "algorithm.group_size": "2",
        "sampling.max_tokens": "4",
        "tasks.path": json.dumps(str(tasks)),
        "tasks.eval_path": json.dumps(str(held_out)),
    }
    overrides = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]

    # --json: stdout is the summary object alone, library output or not; the rest is on stderr.
    result = cli(tmp_path, "run", str(PLAN), "--json", *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_clean(result.stderr)
    report = json.loads(result.stdout)
    run_dir = tmp_path / report["run_folder"]
    assert report == json.loads((run_dir / "summary.json").read_text()) | {
        "run_folder": report["run_folder"],
        "summary": str(Path(report["run_folder"]) / "summary.json"),
    }
    assert report["status"] == "finished" and report["steps"] == 1
    assert f"run folder: {report['run_folder']}" in result.stderr.splitlines()
    assert (run_dir / "run.log").is_file()
    assert not any(mark in (run_dir / "run.log").read_text() for mark in PROGRESS_BAR)

    result = cli(tmp_path, "eval", str(PLAN), "--plain", "--limit", "1", *overrides)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_clean(result.stdout)
    assert_clean(result.stderr)
    eval_dir = Path(json.loads(result.stdout.splitlines()[-1])["summary"]).parent
    assert (tmp_path / eval_dir / "run.log").is_file()


SCRIPT = """
import logging, sys, warnings
from rllm_core.run.runlog import RunLog

logging.basicConfig(level=logging.ERROR)  # as the command line sets it up
root = logging.getLogger()
before = (list(root.handlers), root.level, [h.level for h in root.handlers])
with RunLog(sys.argv[1]):
    warnings.warn("frobnicate() is deprecated", FutureWarning)
    logging.getLogger("somelib.io").warning("retrying the download")
    logging.getLogger("somelib.io").info("connected")
    logging.getLogger("somelib.io").error("the download failed")
assert (list(root.handlers), root.level, [h.level for h in root.handlers]) == before
warnings.warn("warned after the run", FutureWarning)
logging.getLogger("somelib.io").error("failed after the run")
"""


def test_the_run_log_takes_library_warnings_off_stderr(tmp_path):
    path = tmp_path / "run.log"
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr

    lines = path.read_text(encoding="utf-8").splitlines()
    warning = next(line for line in lines if "frobnicate" in line)
    assert "WARNING py.warnings: <string>:" in warning
    assert "FutureWarning: frobnicate() is deprecated" in warning
    assert any("WARNING somelib.io: retrying the download" in line for line in lines)
    assert any("ERROR somelib.io: the download failed" in line for line in lines)
    assert not any("connected" in line or "after the run" in line for line in lines)

    err = result.stderr
    assert "frobnicate" not in err
    assert "retrying the download" not in err
    assert "the download failed" in err, "errors still reach the command line's handler"
    assert "FutureWarning: warned after the run" in err, "closing the log restores warnings"
    assert "failed after the run" in err


def test_the_run_log_detaches_transformers_handler_and_progress_bars(tmp_path):
    tf_logging = pytest.importorskip("transformers.utils.logging")
    hub = pytest.importorskip("huggingface_hub.utils")
    library = logging.getLogger("transformers")
    before = (list(library.handlers), library.propagate, tf_logging.is_progress_bar_enabled())
    with RunLog(tmp_path / "run.log"):
        assert not tf_logging.is_progress_bar_enabled()
        assert hub.are_progress_bars_disabled()
        assert library.handlers == [] and library.propagate
        tf_logging.get_logger("transformers.modeling_utils").warning("some weights are new")
    after = (list(library.handlers), library.propagate, tf_logging.is_progress_bar_enabled())
    assert after == before
    log = (tmp_path / "run.log").read_text(encoding="utf-8")
    assert "WARNING transformers.modeling_utils: some weights are new" in log
