"""Every test runs mlflow with no telemetry, inside its tmp_path.

Creating an MLflow database runs its migrations (seconds); ``store`` copies one made once per
session instead.
"""

from __future__ import annotations

import os
import shutil

import pytest


@pytest.fixture(scope="session")
def _template_db(tmp_path_factory):
    from mlflow.tracking import MlflowClient

    folder = tmp_path_factory.mktemp("mlflow-template")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
        MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}").search_experiments()
    return folder / "mlflow.db"


@pytest.fixture
def store(tmp_path, _template_db):
    """A folder holding a new, empty MLflow database, for the logger's ``path``."""
    folder = tmp_path / "store"
    folder.mkdir()
    shutil.copyfile(_template_db, folder / "mlflow.db")
    return folder


@pytest.fixture(autouse=True)
def mlflow_sandbox(tmp_path, monkeypatch):
    for key in list(os.environ):
        if key.startswith("MLFLOW_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.setenv("DO_NOT_TRACK", "true")
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def read_store():
    """``read_store(path)``: an ``MlflowClient`` on the local store the logger made at ``path``."""
    from mlflow.tracking import MlflowClient

    return lambda path: MlflowClient(tracking_uri=f"sqlite:///{path / 'mlflow.db'}")
