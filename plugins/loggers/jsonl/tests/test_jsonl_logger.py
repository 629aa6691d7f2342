"""The ``jsonl`` logger writes exactly one JSON object per call."""

from __future__ import annotations

import json
import math
import threading

import pytest
from rllm_core.testing.suites.loggers import Logged, LoggerConformance, Scalar
from rllm_logger_jsonl.logger import JsonlLogger


def lines(path):
    return path.read_text(encoding="utf-8").splitlines()


def read_logged(path):
    logged = Logged()
    for record in map(json.loads, lines(path)):
        if "event" in record:
            logged.events.append(record)
        else:
            logged.metrics[record.pop("step")] = record
    return logged


class TestJsonlConformance(LoggerConformance):
    closed_error = "is closed; build a new one"

    @pytest.fixture
    def logger(self, tmp_path):
        return JsonlLogger(tmp_path / "m.jsonl")

    @pytest.fixture
    def read_logged(self):
        return lambda logger: read_logged(logger.path)


def test_metrics_line(tmp_path):
    path = tmp_path / "m.jsonl"
    with JsonlLogger(path) as logger:
        logger.log_metrics(3, {"reward/mean": 0.41, "loss": 0.125, "tokens": 512, "ok": True})
    assert lines(path) == ['{"step":3,"reward/mean":0.41,"loss":0.125,"tokens":512,"ok":true}']


def test_event_line(tmp_path):
    path = tmp_path / "m.jsonl"
    with JsonlLogger(path) as logger:
        logger.log_event("checkpoint", {"step": 3, "path": "runs/q/ckpt-3", "tags": ["a", 1]})
    assert lines(path) == ['{"event":"checkpoint","step":3,"path":"runs/q/ckpt-3","tags":["a",1]}']


def test_non_finite_floats_become_null(tmp_path):
    path = tmp_path / "m.jsonl"
    with JsonlLogger(path) as logger:
        logger.log_metrics(1, {"a": math.nan, "b": math.inf, "c": -math.inf, "d": 1.5})
        logger.log_event("e", {"x": {"y": [math.nan, 2.0]}, "z": -math.inf})
    assert lines(path) == [
        '{"step":1,"a":null,"b":null,"c":null,"d":1.5}',
        '{"event":"e","x":{"y":[null,2.0]},"z":null}',
    ]


def test_ints_of_any_size_are_written_as_ints(tmp_path):
    path = tmp_path / "m.jsonl"
    with JsonlLogger(path) as logger:
        logger.log_metrics(
            2, {"scalar": Scalar(0.25), "huge": 2**70, "kept": 7, "word": Scalar("no")}
        )
    assert lines(path) == ['{"step":2,"scalar":0.25,"huge":1180591620717411303424,"kept":7}']


def test_numpy_scalars(tmp_path):
    numpy = pytest.importorskip("numpy")
    path = tmp_path / "m.jsonl"
    with JsonlLogger(path) as logger:
        logger.log_metrics(1, {"f32": numpy.float32(0.5), "i64": numpy.int64(9)})
        logger.log_event("e", {"f64": numpy.float64(numpy.nan)})
    assert lines(path) == ['{"step":1,"f32":0.5,"i64":9}', '{"event":"e","f64":null}']


def test_reserved_and_non_string_keys_are_skipped(tmp_path):
    path = tmp_path / "m.jsonl"
    with JsonlLogger(path) as logger:
        logger.log_metrics(5, {"step": 99, 7: 1.0, "x": 2.0})
        logger.log_event("real", {"event": "fake", ("t",): 1, "y": 3})
    assert lines(path) == ['{"step":5,"x":2.0}', '{"event":"real","y":3}']


def test_each_line_is_flushed_when_written(tmp_path):
    path = tmp_path / "m.jsonl"
    logger = JsonlLogger(path)
    logger.log_metrics(1, {"a": 1.0})
    assert lines(path) == ['{"step":1,"a":1.0}']
    logger.close()


def test_appends_to_an_existing_file_and_creates_folders(tmp_path):
    path = tmp_path / "runs" / "q" / "m.jsonl"
    with JsonlLogger(path) as logger:
        logger.log_metrics(1, {"a": 1.0})
    with JsonlLogger(path) as logger:
        logger.log_metrics(2, {"a": 2.0})
    assert [json.loads(line)["step"] for line in lines(path)] == [1, 2]


def test_concurrent_calls_write_whole_lines(tmp_path):
    path = tmp_path / "m.jsonl"
    logger = JsonlLogger(path)

    def work(worker):
        for i in range(100):
            logger.log_event("tick", {"worker": worker, "i": i, "pad": "x" * 500})

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    logger.close()
    records = [json.loads(line) for line in lines(path)]
    assert sorted((r["worker"], r["i"]) for r in records) == [
        (w, i) for w in range(8) for i in range(100)
    ]
