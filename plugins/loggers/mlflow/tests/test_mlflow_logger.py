"""The ``mlflow`` logger on a local store, read back with ``MlflowClient``."""

from __future__ import annotations

import json
import math
import sys

import pytest
from rllm_logger_mlflow.logger import MlflowLogger


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


def history(client, run_id, key):
    return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]


def events(client, run_id):
    tags = client.get_run(run_id).data.tags
    return {key: json.loads(value) for key, value in tags.items() if key.startswith("event/")}


def test_two_steps_of_metrics_read_back(store, read_store):
    with MlflowLogger(path=store, experiment="exp", run_name="r1") as logger:
        logger.log_metrics(1, {"reward/mean": 0.41, "offpolicy/k3": 1.25, "tokens": 512})
        logger.log_metrics(2, {"reward/mean": 0.75, "offpolicy/k3": -0.1})
    client = read_store(store)
    assert history(client, logger.run_id, "reward/mean") == [(1, 0.41), (2, 0.75)]
    assert history(client, logger.run_id, "offpolicy/k3") == [(1, 1.25), (2, -0.1)]
    assert history(client, logger.run_id, "tokens") == [(1, 512.0)]
    run = client.get_run(logger.run_id)
    assert (run.info.run_name, run.info.status) == ("r1", "FINISHED")
    assert client.get_experiment(run.info.experiment_id).name == "exp"
    assert (store / "mlflow.db").is_file()


def test_events_are_numbered_tags_holding_the_jsonl_line(store, read_store):
    with MlflowLogger(path=store) as logger:
        logger.log_event("start", {"plan": "plan.toml"})
        logger.log_metrics(3, {"loss": 0.5})
        logger.log_event("checkpoint", {"step": 3, "path": "runs/q/ckpt-3", "tags": ["a", 1]})
    tags = read_store(store).get_run(logger.run_id).data.tags
    assert tags["event/000001"] == '{"event":"start","plan":"plan.toml"}'
    assert tags["event/000002"] == (
        '{"event":"checkpoint","step":3,"path":"runs/q/ckpt-3","tags":["a",1]}'
    )
    assert events(read_store(store), logger.run_id).keys() == {"event/000001", "event/000002"}


def test_non_finite_values_are_stored_as_mlflow_stores_them(store, read_store):
    with MlflowLogger(path=store) as logger:
        logger.log_metrics(1, {"a": math.nan, "b": math.inf, "c": -math.inf})
        logger.log_event("e", {"x": {"y": [math.nan, 2.0]}, "z": -math.inf})
    client = read_store(store)
    (nan,) = history(client, logger.run_id, "a")
    assert nan[0] == 1 and math.isnan(nan[1])
    assert history(client, logger.run_id, "b") == [(1, sys.float_info.max)]
    assert history(client, logger.run_id, "c") == [(1, -sys.float_info.max)]
    assert events(client, logger.run_id) == {
        "event/000001": {"event": "e", "x": {"y": [None, 2.0]}, "z": None}
    }


def test_values_it_cannot_represent_are_skipped(store, read_store):
    with MlflowLogger(path=store) as logger:
        logger.log_metrics(
            2,
            {
                "text": "hello",
                "list": [1, 2],
                "object": object(),
                "vector": Vector(),
                "word": Scalar("no"),
                "too-big": 10**400,
                "bad(name)": 1.0,
                "scalar": Scalar(0.25),
                "flag": True,
                7: 1.0,
            },
        )
        logger.log_event("e", {"object": object(), "nested": {"bad": [1, object()]}, "kept": None})
        logger.log_event("huge", {"blob": "x" * 9000})
        logger.log_event("after", {})
    client = read_store(store)
    assert client.get_run(logger.run_id).data.metrics == {"scalar": 0.25, "flag": 1.0}
    assert events(client, logger.run_id) == {
        "event/000001": {"event": "e", "kept": None},
        "event/000002": {"event": "after"},
    }


def test_more_metrics_than_one_batch_holds(store, read_store):
    metrics = {f"layer/{index}": float(index) for index in range(2500)}
    with MlflowLogger(path=store) as logger:
        logger.log_metrics(1, metrics)
    assert read_store(store).get_run(logger.run_id).data.metrics == metrics


def test_close_is_idempotent_and_later_calls_say_so(store, read_store):
    logger = MlflowLogger(path=store)
    logger.log_metrics(1, {"loss": 1.0})
    logger.close()
    logger.close()
    with pytest.raises(ValueError, match="closed; build a new one"):
        logger.log_metrics(2, {"loss": 1.0})
    with pytest.raises(ValueError, match="closed; build a new one"):
        logger.log_event("e", {})
    assert history(read_store(store), logger.run_id, "loss") == [(1, 1.0)]


def test_a_second_logger_reuses_the_store_and_experiment(store, read_store):
    with MlflowLogger(path=store, experiment="exp") as first:
        first.log_metrics(1, {"loss": 1.0})
    with MlflowLogger(tracking_uri=f"sqlite:///{store / 'mlflow.db'}", experiment="exp") as second:
        second.log_metrics(1, {"loss": 2.0})
    client = read_store(store)
    assert first.run_id != second.run_id
    assert client.get_run(first.run_id).info.experiment_id == (
        client.get_run(second.run_id).info.experiment_id
    )
    assert history(client, second.run_id, "loss") == [(1, 2.0)]


def test_tracking_uri_then_the_environment_win_over_path(tmp_path, store, read_store, monkeypatch):
    unused = tmp_path / "unused"
    uri = f"sqlite:///{store / 'mlflow.db'}"
    with MlflowLogger(path=unused, tracking_uri=uri) as logger:
        logger.log_metrics(1, {"loss": 1.0})
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    with MlflowLogger(path=unused) as from_env:
        from_env.log_metrics(1, {"loss": 2.0})
    assert not unused.exists()
    client = read_store(store)
    assert history(client, logger.run_id, "loss") == [(1, 1.0)]
    assert history(client, from_env.run_id, "loss") == [(1, 2.0)]


def test_without_a_store_it_says_what_to_give():
    with pytest.raises(ValueError, match="give path"):
        MlflowLogger()
