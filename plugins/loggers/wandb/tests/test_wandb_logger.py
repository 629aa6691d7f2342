"""The ``wandb`` logger offline, read back from the run's ``.wandb`` log by wandb itself."""

from __future__ import annotations

import json
import math

import pytest
from rllm_core.testing.suites.loggers import Logged, LoggerConformance
from rllm_logger_wandb.logger import WandbLogger


def read_logged(rows):
    """The history rows of a run as metrics by step and events."""
    logged = Logged()
    for step, row in rows.items():
        metrics = {key: value for key, value in row.items() if not key.startswith("event/")}
        if metrics:
            logged.metrics[step] = metrics
        for key, value in row.items():
            if key.startswith("event/"):
                logged.events += json.loads(value)
    return logged


class TestWandbConformance(LoggerConformance):
    closed_error = "closed; build a new one"

    @pytest.fixture
    def logger(self, tmp_path):
        return WandbLogger(path=tmp_path / "out")

    @pytest.fixture
    def read_logged(self, tmp_path, read_history):
        return lambda logger: read_logged(read_history(tmp_path / "out"))

    @pytest.fixture
    def more_skipped_metrics(self):
        return {"too-big": 10**400, "_step": 9, "_runtime": 9}


def test_the_run_has_its_project_name_tags_and_group(tmp_path, read_run, read_history):
    out = tmp_path / "out"
    with WandbLogger(path=out, project="p", name="n", tags=["a", "b"], group="g") as lg:
        lg.log_metrics(1, {"tokens": 512})
    assert read_history(tmp_path / "out") == {1: {"tokens": 512}}
    (run,) = [record["run"] for record in read_run(tmp_path / "out") if record["type"] == "run"]
    assert (run["project"], run["display_name"], run["tags"], run["run_group"]) == (
        "p",
        "n",
        ["a", "b"],
        "g",
    )


def test_events_join_the_row_of_the_latest_metrics_step(tmp_path, read_history):
    with WandbLogger(path=tmp_path) as logger:
        logger.log_event("start", {"plan": "plan.toml"})
        logger.log_metrics(3, {"loss": 0.5})
        logger.log_event("checkpoint", {"step": 3, "path": "runs/q/ckpt-3", "tags": ["a", 1]})
        logger.log_event("checkpoint", {"step": 3, "path": "runs/q/ckpt-3b"})
        logger.log_metrics(4, {"loss": 0.25})
        logger.log_event("checkpoint", {"step": 4})
    rows = read_history(tmp_path)
    assert rows[0] == {"event/start": '[{"event":"start","plan":"plan.toml"}]'}
    assert rows[3]["loss"] == 0.5
    assert json.loads(rows[3]["event/checkpoint"]) == [
        {"event": "checkpoint", "step": 3, "path": "runs/q/ckpt-3", "tags": ["a", 1]},
        {"event": "checkpoint", "step": 3, "path": "runs/q/ckpt-3b"},
    ]
    assert rows[4] == {"loss": 0.25, "event/checkpoint": '[{"event":"checkpoint","step":4}]'}


def test_non_finite_values_are_written_as_they_are(tmp_path, read_history):
    with WandbLogger(path=tmp_path) as logger:
        logger.log_metrics(1, {"a": math.nan, "b": math.inf, "c": -math.inf, "d": 1.5})
        logger.log_event("e", {"x": {"y": [math.nan, 2.0]}, "z": -math.inf})
    (row,) = read_history(tmp_path).values()
    assert row == {
        "a": "NaN",
        "b": "Infinity",
        "c": "-Infinity",
        "d": 1.5,
        "event/e": '[{"event":"e","x":{"y":[null,2.0]},"z":null}]',
    }


def test_disabled_mode_writes_nothing(tmp_path):
    with WandbLogger(mode="disabled", path=tmp_path / "out") as logger:
        logger.log_metrics(1, {"loss": 1.0})
        logger.log_event("e", {"x": 1})
    assert not list((tmp_path / "out").rglob("*.wandb"))
