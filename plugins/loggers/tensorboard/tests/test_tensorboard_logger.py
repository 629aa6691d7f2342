"""The ``tensorboard`` logger, read back with TensorBoard's own event reader."""

from __future__ import annotations

import json
import math
import struct
import threading

import pytest
from rllm_logger_tensorboard.logger import TensorboardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


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


def test_two_steps_of_metrics_read_back(tmp_path):
    with TensorboardLogger(tmp_path / "tb") as logger:
        logger.log_metrics(1, {"reward/mean": 0.5, "offpolicy/k3": 1.25, "loss": 0.41})
        logger.log_metrics(2, {"reward/mean": 0.75, "offpolicy/k3": -2.0, "tokens": 512})
    events = read(tmp_path / "tb")
    assert sorted(events.Tags()["scalars"]) == ["loss", "offpolicy/k3", "reward/mean", "tokens"]
    assert scalars(events, "reward/mean") == [(1, 0.5), (2, 0.75)]
    assert scalars(events, "offpolicy/k3") == [(1, 1.25), (2, -2.0)]
    assert scalars(events, "loss") == [(1, float32(0.41))]
    assert scalars(events, "tokens") == [(2, 512.0)]


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


def test_values_it_cannot_represent_are_skipped(tmp_path):
    with TensorboardLogger(tmp_path / "tb") as logger:
        logger.log_metrics(
            2,
            {
                "text": "hello",
                "list": [1, 2],
                "object": object(),
                "vector": Vector(),
                "word": Scalar("no"),
                "too-big": 10**400,
                "scalar": Scalar(0.25),
                "flag": True,
                7: 1.0,
            },
        )
        logger.log_metrics(3, {"text": "only skipped values"})
        logger.log_event("e", {"object": object(), "nested": {"bad": [1, object()]}, "kept": None})
    events = read(tmp_path / "tb")
    assert sorted(events.Tags()["scalars"]) == ["flag", "scalar"]
    assert scalars(events, "scalar") == [(2, 0.25)]
    assert scalars(events, "flag") == [(2, 1.0)]
    assert texts(events, "event/e") == [(3, ['{"event":"e","kept":null}'])]


def test_close_is_idempotent_and_later_calls_say_so(tmp_path):
    logger = TensorboardLogger(tmp_path / "tb")
    logger.log_metrics(1, {"loss": 1.0})
    logger.close()
    logger.close()
    with pytest.raises(ValueError, match="closed; build a new one"):
        logger.log_metrics(2, {"loss": 1.0})
    with pytest.raises(ValueError, match="closed; build a new one"):
        logger.log_event("e", {})
    assert scalars(read(tmp_path / "tb"), "loss") == [(1, 1.0)]


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
