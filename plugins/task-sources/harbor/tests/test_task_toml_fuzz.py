"""A task directory from anyone ends in a task or a ``TaskFormatError``: never in another
exception.

``task.toml`` documents are drawn from :class:`TaskToml` itself (its sections and their keys,
with plausible values from the field types, sizes and versions among them) mixed with unknown
keys, values of the wrong type and undecodable bytes; ``dataset.toml`` the same way. Every
problem names the task (or dataset) and the field.

``test_any_task_soak`` (marker ``slow``) tries ``RLLM_SOAK_REPEATS`` (2 unless set) times as
many; ``RLLM_SOAK_REPEATS=20`` is the full soak.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from rllm_core.cli import main, tasks_cmd
from rllm_core.errors import TaskFormatError
from rllm_core.plugins import PluginManager
from rllm_core.types import Task
from rllm_task_source_harbor import plugin
from rllm_task_source_harbor.reader import load_dataset
from rllm_task_source_harbor.task_toml import SCHEMA_VERSIONS, TaskToml
from task_sandbox import write_task
from toml_documents import JUNK, file_bytes, schema_table

EXAMPLES = 200
SOAK_REPEATS = int(os.environ.get("RLLM_SOAK_REPEATS", "2"))
SETTINGS = {
    "deadline": None,
    "suppress_health_check": [
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
}
SIZES = st.sampled_from(["2G", "1.5GiB", "512M", "512", "-1G", "1e400G", "nanG", "0", "4 TB"])


def _task_field(key: str, annotation: Any) -> st.SearchStrategy[Any] | None:
    if key in ("memory", "storage", "memory_mb", "storage_mb"):
        return SIZES | st.integers(min_value=-1, max_value=2**64)
    if key in ("version", "schema_version"):
        return st.sampled_from([*SCHEMA_VERSIONS, " 1.4 ", "2.0", ""])
    if key in ("network_mode", "environment_mode"):
        return st.sampled_from(["public", "no-network", "allowlist", "shared", "separate"])
    return None


TASK_TOML = file_bytes(schema_table(TaskToml, _task_field))
DATASET_TOML = (
    st.none()
    | st.none()
    | st.none()
    | file_bytes(
        st.fixed_dictionaries(
            {}, optional={"name": st.text(max_size=8) | JUNK, "version": JUNK, "dataset": JUNK}
        )
    )
)


def _assert_loads_or_task_format_error(
    root: Path, task_toml: bytes, dataset_toml: bytes | None
) -> None:
    task_dir = root / "task-a"
    if not task_dir.exists():
        write_task(root, "task-a", toml="")
    (task_dir / "task.toml").write_bytes(task_toml)
    if dataset_toml is None:
        (root / "dataset.toml").unlink(missing_ok=True)
    else:
        (root / "dataset.toml").write_bytes(dataset_toml)
    try:
        tasks = load_dataset(root)
    except TaskFormatError as exc:
        assert exc.problems
        for problem in exc.problems:
            assert problem.task and problem.field and problem.message, problem
            assert str(problem).startswith(f"{problem.task}: {problem.field}: "), problem
    else:
        assert [type(task) for task in tasks] == [Task]
        assert tasks[0].task_id == "task-a"


REGRESSIONS = [
    # [environment] not a table broke the listing of unknown keys.
    (b"environment = 1.5\n", None),
    (b'environment = ["x"]\n', None),
    # Nesting deep enough for the parser, or a deep copy of the data, to recurse too far.
    (b"[agent]\ntimeout_sec = " + b"[" * 5000 + b"]" * 5000 + b"\n", None),
    (b"[" + b".".join([b"metadata"] * 2000) + b"]\n", None),
    (b'version = "1.0"\n', b"dataset = " + b"[" * 5000 + b"]" * 5000 + b"\n"),
    # Not UTF-8.
    (b"[agent]\nuser = '\xff'\n", b"name = '\xfe'\n"),
]


def _with_regressions(test):
    for task_toml, dataset_toml in REGRESSIONS:
        test = example(task_toml=task_toml, dataset_toml=dataset_toml)(test)
    return test


@pytest.fixture
def quiet():
    """Unknown keys are logged as warnings, one per example; they are not what is tested."""
    logger = logging.getLogger("rllm_task_source_harbor")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


@_with_regressions
@settings(max_examples=EXAMPLES, **SETTINGS)
@given(task_toml=TASK_TOML, dataset_toml=DATASET_TOML)
def test_any_task_loads_or_fails_with_a_located_task_format_error(
    task_toml, dataset_toml, tmp_path, quiet, fuzz_counts
):
    fuzz_counts["task.toml and dataset.toml files"] += 1
    _assert_loads_or_task_format_error(tmp_path / "dataset", task_toml, dataset_toml)


@pytest.mark.slow
@settings(max_examples=EXAMPLES * SOAK_REPEATS, **SETTINGS)
@given(task_toml=TASK_TOML, dataset_toml=DATASET_TOML)
def test_any_task_soak(task_toml, dataset_toml, tmp_path, quiet, fuzz_counts):
    fuzz_counts["task.toml and dataset.toml files (soak)"] += 1
    _assert_loads_or_task_format_error(tmp_path / "dataset", task_toml, dataset_toml)


def test_generated_task_tomls_load_and_fail(tmp_path, quiet):
    """The documents are not all junk: some load into a task, some are refused."""
    outcomes: set[str] = set()

    @settings(max_examples=80, database=None, **SETTINGS)
    @given(data=schema_table(TaskToml, _task_field))
    def draw(data):
        root = tmp_path / "dataset"
        if not root.exists():
            write_task(root, "task-a", toml="")
        (root / "task-a" / "task.toml").write_text(tomli_w.dumps(data), encoding="utf-8")
        try:
            load_dataset(root)
            outcomes.add("task")
        except TaskFormatError:
            outcomes.add("refused")

    draw()
    assert outcomes == {"task", "refused"}


@pytest.mark.parametrize(
    ("task_toml", "shown"),
    [
        (b"environment = 1.5\n", "[environment]: must be a table, got 1.5"),
        (
            b"[agent]\ntimeout_sec = " + b"[" * 5000 + b"]" * 5000 + b"\n",
            "task.toml: is not valid TOML: tables or arrays nest too deeply",
        ),
        (b"[agent]\nuser = '\xff'\n", "task.toml: cannot be read as UTF-8 text"),
    ],
    ids=["not-a-table", "too-deep", "not-utf8"],
)
def test_tasks_check_reports_without_a_traceback(tmp_path, monkeypatch, task_toml, shown):
    manager = PluginManager(load_entry_points=False, strict=True)
    manager.register(plugin, name="harbor", distribution="rllm-task-source-harbor")
    monkeypatch.setattr(tasks_cmd, "get_plugin_manager", lambda: manager)
    task_dir = write_task(tmp_path / "dataset", "task-a", toml="")
    (task_dir / "task.toml").write_bytes(task_toml)
    result = CliRunner().invoke(main, ["tasks", "check", str(tmp_path / "dataset")])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    assert f"task-a: {shown}" in result.output
