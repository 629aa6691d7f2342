"""Entry module: the config model and the spec of the ``mlflow`` logger.

Imports only rllm-core, pydantic and the standard library; mlflow loads when a plan builds the
logger.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from rllm_core import ComponentSpec, hookimpl, lazy

__all__ = ["MlflowLoggerConfig"]


class MlflowLoggerConfig(BaseModel):
    """Keys of a ``[[loggers]] name = "mlflow"`` entry."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: Path = Field(
        description="folder of the local tracking store: the SQLite database `mlflow.db` and"
        " the `artifacts/` of experiments it creates; created when missing; used when neither"
        " `tracking_uri` nor MLFLOW_TRACKING_URI is set"
    )
    tracking_uri: str | None = Field(
        default=None,
        description="an MLflow tracking URI used instead of `path` (a server"
        " `http://host:5000`, `sqlite:///...`, another database, `databricks`); unset:"
        " MLFLOW_TRACKING_URI when set",
    )
    experiment: str = Field(
        default="Default", description="experiment of the run; created when missing"
    )
    run_name: str | None = Field(
        default=None, description="name of the run; unset: mlflow picks one"
    )


@hookimpl
def rllm_loggers() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="logger",
        name="mlflow",
        traits={"run_keys": ("path",)},
        factory=lazy("rllm_logger_mlflow.logger:MlflowLogger.from_config"),
        config=MlflowLoggerConfig,
        summary="an MLflow run (local SQLite store by default): metric history, events as tags",
    )
