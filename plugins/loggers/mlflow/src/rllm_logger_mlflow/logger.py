"""The ``mlflow`` logger: one MLflow run per logger, through ``MlflowClient``.

``log_metrics(3, {"reward/mean": 0.41})`` logs each metric at step 3 in one batch (metric
history, read back with ``MlflowClient().get_metric_history(run_id, "reward/mean")``).
``log_event("checkpoint", {"path": "ckpt-3"})`` sets the run tag ``event/000001`` (numbered
from 1 in the order logged, six digits so they sort) to the line the ``jsonl`` logger writes,
``{"event":"checkpoint","path":"ckpt-3"}``. ``close`` ends the run as FINISHED.

Where the run goes: ``tracking_uri`` when given, else the ``MLFLOW_TRACKING_URI`` environment
variable when set, else the local store in the folder ``path``: ``sqlite:///<path>/mlflow.db``,
with the artifacts of experiments it creates under ``<path>/artifacts``. The client is used
directly, never mlflow's global active run, so the logger leaves the user's own
``mlflow.start_run()`` alone.

What it writes:

- Metric values must be numbers: ints, floats, bools and numpy or torch scalars, written as
  64-bit floats; anything else is skipped, and so is a metric whose name MLflow refuses (names
  may hold letters, digits, ``_ - . : /`` and spaces).
- ``nan`` is stored as NaN. ``inf`` and ``-inf`` are stored as MLflow stores them: on a
  database store, as the largest double, ``±1.7976931348623157e308``.
- Event fields follow the ``jsonl`` logger's rules (see :mod:`rllm_core.logging_values`); an
  event whose line is longer than a tag value may be (8000 characters) is skipped rather than
  cut.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlflow.entities import Metric, RunStatus
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import (
    INVALID_PARAMETER_VALUE,
    RESOURCE_ALREADY_EXISTS,
    ErrorCode,
)
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import MAX_METRICS_PER_BATCH, MAX_TAG_VAL_LENGTH
from rllm_core.logging_values import event_json, metric_number

if TYPE_CHECKING:
    from rllm_logger_mlflow.plugin import MlflowLoggerConfig

__all__ = ["MlflowLogger"]


class MlflowLogger:
    """A :class:`~rllm_core.ports.Logger` writing to a new MLflow run. Thread-safe."""

    def __init__(
        self,
        *,
        path: str | os.PathLike[str] | None = None,
        tracking_uri: str | None = None,
        experiment: str = "Default",
        run_name: str | None = None,
    ) -> None:
        tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or None
        artifact_location = None
        if tracking_uri is None:
            if path is None:
                raise ValueError(
                    "the mlflow logger needs a store: give path (a folder for a local store)"
                    " or tracking_uri, or set MLFLOW_TRACKING_URI"
                )
            folder = Path(path).absolute()
            folder.mkdir(parents=True, exist_ok=True)
            tracking_uri = f"sqlite:///{folder / 'mlflow.db'}"
            artifact_location = (folder / "artifacts").as_uri()
        self.client = MlflowClient(tracking_uri=tracking_uri)
        experiment_id = _experiment_id(self.client, experiment, artifact_location)
        self.run_id: str = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        self._lock = threading.Lock()
        self._closed = False
        self._events = 0

    @classmethod
    def from_config(cls, config: MlflowLoggerConfig) -> MlflowLogger:
        """Build from the validated plan config (the component factory)."""
        return cls(
            path=config.path,
            tracking_uri=config.tracking_uri,
            experiment=config.experiment,
            run_name=config.run_name,
        )

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Log every number in ``metrics`` at ``step``, skipping what MLflow cannot store."""
        timestamp = int(time.time() * 1000)
        batch = []
        for name, value in metrics.items():
            number = metric_number(value)
            if isinstance(name, str) and number is not None:
                batch.append(Metric(name, number, timestamp, step))
        with self._lock:
            self._check_open()
            for start in range(0, len(batch), MAX_METRICS_PER_BATCH):
                self._log_batch(batch[start : start + MAX_METRICS_PER_BATCH])

    def log_event(self, name: str, fields: Mapping[str, Any]) -> None:
        """Set the next ``event/NNNNNN`` tag to the event's JSON line."""
        line = event_json(name, fields)
        with self._lock:
            self._check_open()
            if len(line) > MAX_TAG_VAL_LENGTH:
                return
            self._events += 1
            self.client.set_tag(self.run_id, f"event/{self._events:06d}", line)

    def close(self) -> None:
        """End the run as FINISHED; idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self.client.set_terminated(self.run_id, RunStatus.to_string(RunStatus.FINISHED))

    def __enter__(self) -> MlflowLogger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MlflowLogger(run_id={self.run_id!r})"

    def _log_batch(self, batch: list[Metric]) -> None:
        try:
            self.client.log_batch(self.run_id, metrics=batch)
        except MlflowException as exc:
            if not _refused(exc):
                raise
            # one refused name fails the whole batch: log one at a time, skipping the refused
            for metric in batch:
                try:
                    self.client.log_batch(self.run_id, metrics=[metric])
                except MlflowException as one:
                    if not _refused(one):
                        raise

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(
                f"the mlflow logger of run {self.run_id} is closed; build a new one to log more"
            )


def _refused(exc: MlflowException) -> bool:
    return exc.error_code == ErrorCode.Name(INVALID_PARAMETER_VALUE)


def _experiment_id(client: MlflowClient, name: str, artifact_location: str | None) -> str:
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location)
    except MlflowException as exc:  # created meanwhile by another process
        if exc.error_code != ErrorCode.Name(RESOURCE_ALREADY_EXISTS):
            raise
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id
