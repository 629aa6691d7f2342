"""Conformance suite for run loggers (the :class:`~rllm_core.ports.Logger` port).

Subclass the suite in a test module and provide its fixtures::

    class TestMyLogger(LoggerConformance):
        closed_error = "is closed"

        @pytest.fixture
        def logger(self, tmp_path):
            return MyLogger(tmp_path / "logs")

        @pytest.fixture
        def read_logged(self):
            def read(logger):
                records = [json.loads(line) for line in my_reader(logger.path)]
                return Logged(
                    metrics={r.pop("step"): r for r in records if "step" in r},
                    events=[r for r in records if "event" in r],
                )
            return read

Fixtures:

- ``logger`` (required): a new logger writing to a fresh location. Every test closes it, and
  the suite closes it again on teardown (``close`` is idempotent).
- ``read_logged`` (required): ``read_logged(logger)``, called once the logger is closed,
  returns a :class:`Logged` of what it wrote, read back from its destination (with the
  destination's own reader where it has one).
- ``stored_metric`` (optional): ``stored_metric(value)`` is the number the destination gives
  back for the float ``value``; the value itself by default. A destination that stores float32
  rounds here.
- ``more_skipped_metrics`` (optional): metrics this logger cannot represent besides
  :data:`SKIPPED_METRICS` (an int too large for a float, a name the destination refuses).

The class attribute ``closed_error`` is a pattern that the ``ValueError`` raised by a call after
``close`` matches. The port does not require such an error; while ``closed_error`` is ``None``
(the default) that test is skipped.

The suite asserts only what the port promises: metrics read back under their step, values the
logger cannot represent skipped without raising, events written with their fields, and ``close``
idempotent. How a destination stores ``nan``, ints or event placement is the plugin's to test.
Events are compared as a multiset: the port does not promise that a destination keeps their
order. :class:`Scalar`, :class:`Vector` and the tables of values are public for
plugin-specific tests. Standard library and pytest only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest

__all__ = [
    "KEPT_METRICS",
    "SKIPPED_EVENT_FIELDS",
    "SKIPPED_METRICS",
    "TWO_STEPS",
    "LoggerConformance",
    "Logged",
    "Scalar",
    "Vector",
]


class Scalar:
    """Stands in for a numpy or torch scalar: it has ``item()``."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def item(self) -> Any:
        return self.value


class Vector:
    """Stands in for a tensor with several elements: ``item()`` raises."""

    def item(self) -> Any:
        raise ValueError("only one element tensors can be converted to Python scalars")


@dataclass
class Logged:
    """What a logger wrote, read back: ``metrics`` by step, each ``{name: number}``, and
    ``events`` as ``{"event": name, **fields}`` records."""

    metrics: dict[int, dict[str, Any]] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)


TWO_STEPS: tuple[tuple[int, dict[str, float]], ...] = (
    (1, {"reward/mean": 0.41, "offpolicy/k3": 1.25, "tokens": 512}),
    (2, {"reward/mean": 0.75, "offpolicy/k3": -0.1}),
)
"""Two steps of metrics, an int among them."""

SKIPPED_METRICS: dict[Any, Any] = {
    "text": "hello",
    "list": [1, 2],
    "object": object(),
    "vector": Vector(),
    "word": Scalar("no"),
    7: 1.0,
}
"""Metric values (and a name) no logger can represent: not numbers, or not under a string."""

KEPT_METRICS: dict[str, Any] = {"scalar": Scalar(0.25), "flag": True}
"""Metric values every logger writes, read back as ``0.25`` and ``1.0``."""

SKIPPED_EVENT_FIELDS: dict[str, Any] = {
    "object": object(),
    "nested": {"bad": [1, object()]},
    "kept": None,
}
"""Event fields of which only ``kept`` is a JSON value."""


def _canonical(events: list[dict[str, Any]]) -> list[str]:
    return sorted(json.dumps(event, sort_keys=True) for event in events)


def _assert_events(logged: Logged, expected: list[dict[str, Any]]) -> None:
    assert _canonical(logged.events) == _canonical(expected), (
        f"read back events {logged.events}, expected {expected} (in any order)"
    )


@pytest.mark.rllm_conformance
class LoggerConformance:
    """The :class:`~rllm_core.ports.Logger` contract; fixtures and class attributes in the
    module docstring."""

    closed_error: ClassVar[str | None] = None

    @pytest.fixture
    def logger(self) -> Any:
        pytest.fail(f"{type(self).__name__} must define a 'logger' fixture returning a logger")

    @pytest.fixture
    def read_logged(self) -> Callable[[Any], Logged]:
        pytest.fail(
            f"{type(self).__name__} must define a 'read_logged' fixture: a callable that reads"
            " back what a closed logger wrote"
        )

    @pytest.fixture
    def stored_metric(self) -> Callable[[float], float]:
        return lambda value: value

    @pytest.fixture
    def more_skipped_metrics(self) -> Mapping[Any, Any]:
        return {}

    @pytest.fixture(autouse=True)
    def _close_after_the_test(self, logger: Any) -> Iterator[None]:
        yield
        logger.close()

    def test_two_steps_of_metrics_read_back(
        self,
        logger: Any,
        read_logged: Callable[[Any], Logged],
        stored_metric: Callable[[float], float],
    ) -> None:
        for step, metrics in TWO_STEPS:
            logger.log_metrics(step, metrics)
        logger.close()
        logged = read_logged(logger)
        expected = {
            step: {name: stored_metric(float(value)) for name, value in metrics.items()}
            for step, metrics in TWO_STEPS
        }
        assert logged.metrics == expected, f"read back {logged.metrics}, logged {expected}"
        assert logged.events == [], f"no event was logged, read back {logged.events}"

    def test_values_it_cannot_represent_are_skipped(
        self,
        logger: Any,
        read_logged: Callable[[Any], Logged],
        stored_metric: Callable[[float], float],
        more_skipped_metrics: Mapping[Any, Any],
    ) -> None:
        logger.log_metrics(2, {**SKIPPED_METRICS, **more_skipped_metrics, **KEPT_METRICS})
        logger.log_event("e", SKIPPED_EVENT_FIELDS)
        logger.close()
        logged = read_logged(logger)
        expected = {2: {"scalar": stored_metric(0.25), "flag": stored_metric(1.0)}}
        assert logged.metrics == expected, (
            f"read back {logged.metrics}; only the numbers {expected} should be written"
        )
        _assert_events(logged, [{"event": "e", "kept": None}])

    def test_non_finite_metrics_do_not_raise(
        self,
        logger: Any,
        read_logged: Callable[[Any], Logged],
        stored_metric: Callable[[float], float],
    ) -> None:
        logger.log_metrics(1, {"a": math.nan, "b": math.inf, "c": -math.inf, "d": 1.5})
        logger.close()
        logged = read_logged(logger)
        assert logged.metrics.get(1, {}).get("d") == stored_metric(1.5), (
            f"read back {logged.metrics}: the finite metric next to nan and inf is lost"
        )

    def test_events_are_written(self, logger: Any, read_logged: Callable[[Any], Logged]) -> None:
        logger.log_event("start", {"plan": "plan.toml"})
        logger.log_metrics(3, {"loss": 0.5})
        logger.log_event("checkpoint", {"step": 3, "path": "runs/q/ckpt-3", "tags": ["a", 1]})
        logger.close()
        logged = read_logged(logger)
        assert logged.metrics == {3: {"loss": 0.5}}, f"read back {logged.metrics}"
        _assert_events(
            logged,
            [
                {"event": "start", "plan": "plan.toml"},
                {"event": "checkpoint", "step": 3, "path": "runs/q/ckpt-3", "tags": ["a", 1]},
            ],
        )

    def test_close_is_idempotent(self, logger: Any, read_logged: Callable[[Any], Logged]) -> None:
        logger.log_metrics(1, {"loss": 1.0})
        logger.close()
        logger.close()
        logged = read_logged(logger)
        assert logged.metrics == {1: {"loss": 1.0}}, f"read back {logged.metrics}"

    def test_calls_after_close_raise(
        self, logger: Any, read_logged: Callable[[Any], Logged]
    ) -> None:
        if self.closed_error is None:
            pytest.skip("set the class attribute 'closed_error' to check calls after close")
        logger.log_metrics(1, {"loss": 1.0})
        logger.close()
        for call, args in (("log_metrics", (2, {"loss": 1.0})), ("log_event", ("e", {}))):
            with pytest.raises(ValueError, match=self.closed_error):
                getattr(logger, call)(*args)
        logged = read_logged(logger)
        assert logged.metrics == {1: {"loss": 1.0}}, (
            f"read back {logged.metrics}: a call after close wrote something"
        )
        assert logged.events == [], f"a call after close wrote {logged.events}"
