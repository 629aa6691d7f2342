"""Every test runs wandb offline inside its tmp_path, and ends with no wandb service left."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def wandb_sandbox(tmp_path, monkeypatch):
    """Keep wandb off the network and out of the home folder; tear its service down after."""
    for key in list(os.environ):
        if key.startswith("WANDB_"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "false")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    for key, folder in (
        ("WANDB_CONFIG_DIR", "config"),
        ("WANDB_CACHE_DIR", "cache"),
        ("WANDB_DATA_DIR", "data"),
        ("WANDB_ARTIFACT_DIR", "artifacts"),
    ):
        monkeypatch.setenv(key, str(tmp_path / "wandb-home" / folder))
    monkeypatch.chdir(tmp_path)
    yield
    import wandb

    wandb.teardown()
    assert wandb_children() == [], "a wandb service process outlived wandb.teardown()"


def wandb_children() -> list[str]:
    """Command lines of this process's children that are wandb's service."""
    found = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(
                line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line
            )
            cmdline = (status.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if fields.get("PPid", "").strip() == str(os.getpid()) and "wandb" in cmdline:
            found.append(cmdline)
    return found


@pytest.fixture
def read_run():
    """``read_run(folder)``: the records of the one offline run under ``folder``."""
    return _read_run


@pytest.fixture
def read_history():
    """``read_history(folder)``: the history rows of the one offline run under ``folder``."""
    return lambda folder: history(_read_run(folder))


def _read_run(folder: Path) -> list[dict]:
    """The records of the one offline run under ``folder``, read with ``wandb leet inspect``."""
    logs = sorted(folder.glob("wandb/offline-run-*/run-*.wandb"))
    assert len(logs) == 1, f"expected one offline run under {folder}, found {logs}"
    result = subprocess.run(
        [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(logs[0])],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def history(records: list[dict]) -> dict[int, dict]:
    """Each history row by step, without wandb's own keys."""
    rows = {}
    for record in records:
        if record["type"] == "history":
            item = record["history"]["item"]
            rows[int(record["history"]["step"]["num"])] = {
                key: value for key, value in item.items() if not key.startswith("_")
            }
    return rows
