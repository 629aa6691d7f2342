"""The ``mlflow`` logger on a local store, read back with ``MlflowClient``."""

from __future__ import annotations

import json
import math
import sys

import pytest
from rllm_core.testing.suites.loggers import SKIPPED_EVENT_FIELDS, Logged, LoggerConformance
from rllm_logger_mlflow.logger import MlflowLogger


def history(client, run_id, key):
    return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]


def events(client, run_id):
    tags = client.get_run(run_id).data.tags
    return {key: json.loads(value) for key, value in tags.items() if key.startswith("event/")}


class TestMlflowConformance(LoggerConformance):
    closed_error = "closed; build a new one"

    @pytest.fixture
    def logger(self, store):
        return MlflowLogger(path=store)

    @pytest.fixture
    def read_logged(self, store, read_store):
        def read_logged(logger):
            client = read_store(store)
            logged = Logged(events=list(events(client, logger.run_id).values()))
            for key in client.get_run(logger.run_id).data.metrics:
                for step, value in history(client, logger.run_id, key):
                    logged.metrics.setdefault(step, {})[key] = value
            return logged

        return read_logged

    @pytest.fixture
    def more_skipped_metrics(self):
        return {"too-big": 10**400, "bad(name)": 1.0}


def test_the_run_is_named_finished_and_in_its_experiment(store, read_store):
    with MlflowLogger(path=store, experiment="exp", run_name="r1") as logger:
        logger.log_metrics(1, {"tokens": 512})
    client = read_store(store)
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


def test_events_too_long_for_a_tag_are_skipped_and_numbering_goes_on(store, read_store):
    with MlflowLogger(path=store) as logger:
        logger.log_event("e", SKIPPED_EVENT_FIELDS)
        logger.log_event("huge", {"blob": "x" * 9000})
        logger.log_event("after", {})
    assert events(read_store(store), logger.run_id) == {
        "event/000001": {"event": "e", "kept": None},
        "event/000002": {"event": "after"},
    }


def test_more_metrics_than_one_batch_holds(store, read_store):
    metrics = {f"layer/{index}": float(index) for index in range(2500)}
    with MlflowLogger(path=store) as logger:
        logger.log_metrics(1, metrics)
    assert read_store(store).get_run(logger.run_id).data.metrics == metrics


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
