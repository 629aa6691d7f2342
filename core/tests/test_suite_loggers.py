"""The logger conformance kit, run against a small in-memory logger, and shown to catch broken
ones."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import pytest
from rllm_core.logging_values import event_json, metric_number
from rllm_core.ports import Logger
from rllm_core.testing.suites.loggers import Logged, LoggerConformance


class MemoryLogger:
    """Keeps what it is given, by the rules of :mod:`rllm_core.logging_values`."""

    def __init__(self) -> None:
        self.logged = Logged()
        self.closed = False

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self._check_open()
        numbers = {name: metric_number(value) for name, value in metrics.items()}
        kept = {n: v for n, v in numbers.items() if isinstance(n, str) and v is not None}
        if kept:
            self.logged.metrics.setdefault(step, {}).update(kept)

    def log_event(self, name: str, fields: Mapping[str, Any]) -> None:
        self._check_open()
        self.logged.events.append(json.loads(event_json(name, fields)))

    def close(self) -> None:
        self.closed = True

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError("the memory logger is closed; build a new one to log more")


class TestMemoryLoggerConformance(LoggerConformance):
    closed_error = "closed; build a new one"

    @pytest.fixture
    def logger(self) -> MemoryLogger:
        return MemoryLogger()

    @pytest.fixture
    def read_logged(self):
        return lambda logger: logger.logged


def test_the_reference_is_a_logger() -> None:
    assert isinstance(MemoryLogger(), Logger)


def test_suite_is_marked_as_conformance_tests() -> None:
    assert [mark.name for mark in LoggerConformance.pytestmark] == ["rllm_conformance"]  # type: ignore[attr-defined]


class RaisesOnText(MemoryLogger):
    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        for value in metrics.values():
            if isinstance(value, str):
                raise TypeError(f"cannot log {value!r}")
        super().log_metrics(step, metrics)


class KeepsEverything(MemoryLogger):
    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self.logged.metrics.setdefault(step, {}).update(metrics)


class DropsEventFields(MemoryLogger):
    def log_event(self, name: str, fields: Mapping[str, Any]) -> None:
        self.logged.events.append({"event": name})


class ForgetsTheStep(MemoryLogger):
    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        super().log_metrics(0, metrics)


class ClosesOnce(MemoryLogger):
    def close(self) -> None:
        if self.closed:
            raise RuntimeError("already closed")
        super().close()


class WritesAfterClose(MemoryLogger):
    def _check_open(self) -> None:
        pass


class DropsFiniteNextToNan(MemoryLogger):
    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        if any(isinstance(v, float) and math.isnan(v) for v in metrics.values()):
            return
        super().log_metrics(step, metrics)


def identity(value: float) -> float:
    return value


BROKEN = [
    (RaisesOnText, "test_values_it_cannot_represent_are_skipped", TypeError, "cannot log"),
    (KeepsEverything, "test_values_it_cannot_represent_are_skipped", AssertionError, "only the"),
    (DropsEventFields, "test_events_are_written", AssertionError, "in any order"),
    (ForgetsTheStep, "test_two_steps_of_metrics_read_back", AssertionError, "read back"),
    (ClosesOnce, "test_close_is_idempotent", RuntimeError, "already closed"),
    (WritesAfterClose, "test_calls_after_close_raise", pytest.fail.Exception, "DID NOT RAISE"),
    (DropsFiniteNextToNan, "test_non_finite_metrics_do_not_raise", AssertionError, "is lost"),
]


@pytest.mark.parametrize(
    ("logger_class", "method", "error", "message"),
    BROKEN,
    ids=lambda x: getattr(x, "__name__", None),
)
def test_suite_catches_broken_logger(
    logger_class: type[MemoryLogger], method: str, error: type[BaseException], message: str
) -> None:
    fixtures: dict[str, Any] = {
        "logger": logger_class(),
        "read_logged": lambda logger: logger.logged,
        "stored_metric": identity,
        "more_skipped_metrics": {},
    }
    test = getattr(TestMemoryLoggerConformance(), method)
    names = test.__code__.co_varnames[1 : test.__code__.co_argcount]
    with pytest.raises(error, match=message):
        test(**{name: fixtures[name] for name in names})
