"""The ``wandb`` logger offline, read back from the run's ``.wandb`` log by wandb itself."""

from __future__ import annotations

import json
import math

import pytest
from rllm_logger_wandb.logger import WandbLogger


class Scalar:
    """Stands in for a numpy or torch scalar: it has ``item()``."""

    def __init__(self, value):
        self.value = value

    def item(self):
        return self.value


class Vector:
    """Stands in for a tensor with several elements: ``item()`` raises."""

    def item(self):
        raise ValueError("only one element tensors can be converted to Python scalars")


def test_two_steps_of_metrics_read_back(tmp_path, read_run, read_history):
    out = tmp_path / "out"
    with WandbLogger(path=out, project="p", name="n", tags=["a", "b"], group="g") as lg:
        lg.log_metrics(1, {"reward/mean": 0.41, "offpolicy/k3": 1.25, "tokens": 512})
        lg.log_metrics(2, {"reward/mean": 0.75, "offpolicy/k3": -0.1})
    assert read_history(tmp_path / "out") == {
        1: {"reward/mean": 0.41, "offpolicy/k3": 1.25, "tokens": 512},
        2: {"reward/mean": 0.75, "offpolicy/k3": -0.1},
    }
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


def test_values_it_cannot_represent_are_skipped(tmp_path, read_history):
    with WandbLogger(path=tmp_path) as logger:
        logger.log_metrics(
            2,
            {
                "text": "hello",
                "list": [1, 2],
                "object": object(),
                "vector": Vector(),
                "word": Scalar("no"),
                "too-big": 10**400,
                "_step": 9,
                "_runtime": 9,
                "scalar": Scalar(0.25),
                "flag": True,
                7: 1.0,
            },
        )
        logger.log_event("e", {"object": object(), "nested": {"bad": [1, object()]}, "kept": None})
    assert read_history(tmp_path) == {
        2: {"scalar": 0.25, "flag": 1, "event/e": '[{"event":"e","kept":null}]'}
    }


def test_close_is_idempotent_and_later_calls_say_so(tmp_path, read_history):
    logger = WandbLogger(path=tmp_path)
    logger.log_metrics(1, {"loss": 1.0})
    logger.close()
    logger.close()
    with pytest.raises(ValueError, match="closed; build a new one"):
        logger.log_metrics(2, {"loss": 1.0})
    with pytest.raises(ValueError, match="closed; build a new one"):
        logger.log_event("e", {})
    assert read_history(tmp_path) == {1: {"loss": 1.0}}


def test_disabled_mode_writes_nothing(tmp_path):
    with WandbLogger(mode="disabled", path=tmp_path / "out") as logger:
        logger.log_metrics(1, {"loss": 1.0})
        logger.log_event("e", {"x": 1})
    assert not list((tmp_path / "out").rglob("*.wandb"))
