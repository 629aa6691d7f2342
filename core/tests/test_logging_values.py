"""The rules every logger plugin follows for metric values and event fields
(:mod:`rllm_core.logging_values`)."""

from __future__ import annotations

import json
import math

import pytest
from rllm_core.logging_values import event_json, metric_number
from rllm_core.testing.suites.loggers import Scalar, Vector


class Itself:
    """A scalar type whose ``item()`` returns the object itself."""

    def item(self):
        return self


@pytest.mark.parametrize(
    ("value", "number"),
    [
        (0.41, 0.41),
        (512, 512.0),
        (True, 1.0),
        (False, 0.0),
        (Scalar(0.25), 0.25),
        (Scalar(9), 9.0),
        (2**70, float(2**70)),
    ],
)
def test_numbers_become_floats(value, number):
    result = metric_number(value)
    assert type(result) is float
    assert result == number


def test_non_finite_numbers_stay_as_they_are():
    assert math.isnan(metric_number(math.nan))
    assert metric_number(math.inf) == math.inf
    assert metric_number(Scalar(-math.inf)) == -math.inf


@pytest.mark.parametrize(
    "value",
    [
        *("hello", "1.5", [1, 2], (1,), {"a": 1}, None, object()),
        *(Vector(), Scalar("no"), Itself(), 10**400, Scalar(10**400)),
    ],
    ids=[
        *("str", "numeric-str", "list", "tuple", "dict", "None", "object"),
        *("vector", "scalar-of-str", "returns-itself", "huge-int", "scalar-of-huge-int"),
    ],
)
def test_values_that_are_not_numbers_are_none(value):
    assert metric_number(value) is None


def test_numpy_scalars():
    numpy = pytest.importorskip("numpy")
    assert metric_number(numpy.float32(0.5)) == 0.5
    assert metric_number(numpy.int64(9)) == 9.0
    assert metric_number(numpy.bool_(True)) == 1.0
    assert metric_number(numpy.array([1.0, 2.0])) is None
    assert event_json("e", {"f64": numpy.float64(numpy.nan), "i": numpy.int64(3)}) == (
        '{"event":"e","f64":null,"i":3}'
    )


def test_event_line():
    line = event_json("checkpoint", {"step": 3, "path": "runs/q/ckpt-3", "tags": ["a", 1]})
    assert line == '{"event":"checkpoint","step":3,"path":"runs/q/ckpt-3","tags":["a",1]}'


def test_event_line_is_compact_and_keeps_text_as_it_is():
    line = event_json("note", {"text": "é ü 中", "nested": {"a": [1, {"b": None}], "t": (2.5,)}})
    assert line == '{"event":"note","text":"é ü 中","nested":{"a":[1,{"b":null}],"t":[2.5]}}'
    assert "\n" not in event_json("e", {"text": "two\nlines"})


def test_non_finite_floats_become_null_at_any_depth():
    line = event_json("e", {"x": {"y": [math.nan, 2.0]}, "z": -math.inf, "s": Scalar(math.inf)})
    assert line == '{"event":"e","x":{"y":[null,2.0]},"z":null,"s":null}'


def test_fields_that_are_not_json_values_are_skipped_whole():
    fields = {
        "object": object(),
        "nested": {"bad": [1, object()]},
        "set": {1, 2},
        "bytes": b"ab",
        "int-key": {"ok": {1: 2}},
        "vector": Vector(),
        "itself": Itself(),
        "scalar": Scalar(0.25),
        "kept": None,
    }
    assert event_json("e", fields) == '{"event":"e","scalar":0.25,"kept":null}'


def test_a_cycle_is_skipped():
    loop: list = []
    loop.append(loop)
    assert event_json("e", {"loop": loop, "kept": 1}) == '{"event":"e","kept":1}'


def test_the_event_key_and_non_string_names_are_skipped():
    assert event_json("real", {"event": "fake", ("t",): 1, 7: 2, "y": 3}) == (
        '{"event":"real","y":3}'
    )


def test_the_event_name_is_a_string():
    assert json.loads(event_json(5, {})) == {"event": "5"}  # type: ignore[arg-type]
