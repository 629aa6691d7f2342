"""The ``tensorboard`` logger, read back with TensorBoard's own event reader."""

from __future__ import annotations

import json
import math
import struct
import threading

import pytest
from rllm_core.testing.suites.loggers import SKIPPED_EVENT_FIELDS, Logged, LoggerConformance
from rllm_logger_tensorboard.logger import TensorboardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def float32(value):
    return struct.unpack("f", struct.pack("f", value))[0]


def read(path):
    accumulator = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


def scalars(accumulator, tag):
    return [(event.step, event.value) for event in accumulator.Scalars(tag)]


def texts(accumulator, tag):
    return [
        (event.step, [s.decode() for s in event.tensor_proto.string_val])
        for event in accumulator.Tensors(tag)
    ]


def read_logged(path):
    accumulator = read(path)
    tags = accumulator.Tags()
    logged = Logged()
    for tag in tags["scalars"]:
        for step, value in scalars(accumulator, tag):
            logged.metrics.setdefault(step, {})[tag] = value
    for tag in tags["tensors"]:
        if tag.startswith("event/"):
            logged.events += [
                json.loads(line) for _, text in texts(accumulator, tag) for line in text
            ]
    return logged


class TestTensorboardConformance(LoggerConformance):
    closed_error = "closed; build a new one"

    @pytest.fixture
    def logger(self, tmp_path):
        return TensorboardLogger(tmp_path / "tb")

    @pytest.fixture
    def read_logged(self):
        return lambda logger: read_logged(logger.path)

    @pytest.fixture
    def stored_metric(self):
        return float32

    @pytest.fixture
    def more_skipped_metrics(self):
        return {"too-big": 10**400}


def test_metrics_are_stored_as_float32(tmp_path):
    with TensorboardLogger(tmp_path / "tb") as logger:
        logger.log_metrics(1, {"loss": 0.41, "reward/mean": 0.5})
    events = read(tmp_path / "tb")
    assert scalars(events, "loss") == [(1, float32(0.41))]
    assert scalars(events, "reward/mean") == [(1, 0.5)]


def test_events_are_text_at_the_latest_metrics_step(tmp_path):
    with TensorboardLogger(tmp_path / "tb") as logger:
        logger.log_event("start", {"plan": "plan.toml"})
        logger.log_metrics(3, {"loss": 0.5})
        logger.log_event("checkpoint", {"step": 3, "path": "runs/q/ckpt-3", "tags": ["a", 1]})
        logger.log_event("checkpoint", {"step": 3, "path": "runs/q/ckpt-3b"})
    events = read(tmp_path / "tb")
    assert texts(events, "event/start") == [(0, ['{"event":"start","plan":"plan.toml"}'])]
    assert texts(events, "event/checkpoint") == [
        (3, ['{"event":"checkpoint","step":3,"path":"runs/q/ckpt-3","tags":["a",1]}']),
        (3, ['{"event":"checkpoint","step":3,"path":"runs/q/ckpt-3b"}']),
    ]


def test_non_finite_values_are_written_as_they_are(tmp_path):
    with TensorboardLogger(tmp_path / "tb") as logger:
        logger.log_metrics(1, {"a": math.nan, "b": math.inf, "c": -math.inf, "huge": 1e300})
        logger.log_event("e", {"x": {"y": [math.nan, 2.0]}, "z": -math.inf})
    events = read(tmp_path / "tb")
    assert math.isnan(events.Scalars("a")[0].value)
    assert scalars(events, "b") == [(1, math.inf)]
    assert scalars(events, "c") == [(1, -math.inf)]
    assert scalars(events, "huge") == [(1, math.inf)]
    assert texts(events, "event/e") == [(1, ['{"event":"e","x":{"y":[null,2.0]},"z":null}'])]


def test_an_event_after_only_skipped_metrics_is_at_their_step(tmp_path):
    with TensorboardLogger(tmp_path / "tb") as logger:
        logger.log_metrics(2, {"loss": 1.0})
        logger.log_metrics(3, {"text": "only skipped values"})
        logger.log_event("e", SKIPPED_EVENT_FIELDS)
    events = read(tmp_path / "tb")
    assert sorted(events.Tags()["scalars"]) == ["loss"]
    assert texts(events, "event/e") == [(3, ['{"event":"e","kept":null}'])]


def test_each_call_is_on_disk_before_it_returns(tmp_path):
    logger = TensorboardLogger(tmp_path / "tb")
    try:
        logger.log_metrics(1, {"loss": 1.0})
        logger.log_event("checkpoint", {"step": 1})
        events = read(tmp_path / "tb")
        assert scalars(events, "loss") == [(1, 1.0)]
        assert texts(events, "event/checkpoint") == [(1, ['{"event":"checkpoint","step":1}'])]
    finally:
        logger.close()


def test_threads_share_one_logger(tmp_path):
    with TensorboardLogger(tmp_path / "tb") as logger:

        def work(index):
            for step in range(20):
                logger.log_event("tick", {"thread": index, "i": step})

        threads = [threading.Thread(target=work, args=(index,)) for index in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    ticks = [json.loads(text[0]) for _, text in texts(read(tmp_path / "tb"), "event/tick")]
    assert sorted((t["thread"], t["i"]) for t in ticks) == [
        (index, step) for index in range(4) for step in range(20)
    ]
