"""A plan.toml from anyone ends in a plan or a ``PlanError``: never in another exception.

Documents are drawn from the schema itself (the sections and keys of :class:`Plan`, each
component section's installed component names and their config keys, with plausible values
from the field types) mixed with unknown keys, values of the wrong type (arrays, tables, dates,
huge ints, inf and nan, unicode) and undecodable bytes. Each goes through what
``rllm-core plan check`` does; every issue of a ``PlanError`` names the file and the section.

``test_any_plan_soak`` (marker ``slow``) tries ``RLLM_SOAK_REPEATS`` (2 unless set) times as
many; ``RLLM_SOAK_REPEATS=20`` is the full soak.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from click.testing import CliRunner
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from rllm_core.cli import main
from rllm_core.cli.preflight import missing_components
from rllm_core.errors import PlanError
from rllm_core.plan.findings import find_problems
from rllm_core.plan.schema import COMPONENT_SECTIONS, Plan
from rllm_core.plugins.manager import PluginManager
from rllm_core.plugins.specs import Kind
from rllm_core.run.components import prepare_plan
from rllm_core.toml_text import MAX_TOML_NESTING
from toml_documents import JUNK, file_bytes, plausible, schema_table, some_of, with_junk_keys

EXAMPLES = 300
SOAK_REPEATS = int(os.environ.get("RLLM_SOAK_REPEATS", "2"))
SETTINGS = {
    "deadline": None,
    "suppress_health_check": [
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
}

# ---------------------------------------------------------------- documents


def _component(kind: Kind, manager: PluginManager) -> st.SearchStrategy[Any]:
    """A component reference of ``kind``: an installed name bare or with its config's keys,
    an unknown name, or junk."""
    names = manager.names(kind)
    tables = [
        schema_table(manager.get(kind, name).config).map(
            lambda table, name=name: {**table, "name": name}
        )
        for name in names
    ]
    return st.one_of(
        st.sampled_from(names) if names else st.nothing(),
        st.one_of(tables) if tables else st.nothing(),
        st.text(max_size=10),
        JUNK,
    )


@cache
def _manager() -> PluginManager:
    return PluginManager()


def _plan_field(key: str, annotation: Any) -> st.SearchStrategy[Any] | None:
    """Component references drawn from what is installed (``_section`` handles the top)."""
    manager = _manager()
    if key in ("loss", "aux_losses"):
        loss = _component(Kind.LOSS, manager)
        return loss if key == "loss" else st.lists(loss, max_size=2)
    if key == "advantage":
        return _component(Kind.ADVANTAGE_ESTIMATOR, manager)
    return None


def _section(name: str) -> st.SearchStrategy[Any]:
    manager = _manager()
    if name in COMPONENT_SECTIONS:
        return _component(COMPONENT_SECTIONS[name], manager)
    if name == "loggers":
        return st.lists(_component(Kind.LOGGER, manager), max_size=3) | JUNK
    return plausible(Plan.model_fields[name].annotation, _plan_field) | JUNK


@cache
def plan_documents() -> st.SearchStrategy[dict]:
    """Plan data: any subset of the schema's sections, plus junk sections."""
    sections = {name: _section(name) for name in Plan.model_fields}
    return with_junk_keys(some_of(sections, max_keys=6))


# ---------------------------------------------------------------- the property


def _check_plan(path: Path, manager: PluginManager) -> None:
    """What ``rllm-core plan check PATH`` does before printing."""
    resolved = prepare_plan(
        path, (), run_dir=Path("<run folder>"), manager=manager, require_models=False
    )
    find_problems(resolved, environ={})
    missing_components(resolved, training=True)
    json.dumps(resolved.to_dict(), default=str)


def _assert_loads_or_plan_error(raw: bytes, tmp_path: Path) -> None:
    path = tmp_path / "plan.toml"
    path.write_bytes(raw)
    try:
        _check_plan(path, _manager())
    except PlanError as exc:
        assert exc.issues
        for issue in exc.issues:
            assert issue.path == str(path), issue
            assert str(issue).startswith(f"{path}: "), issue
            whole_file = issue.message.startswith(("invalid TOML", "invalid plan", "cannot read"))
            assert issue.section or whole_file, issue


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """No model is cached and the home folder is empty, so findings depend on the plan only."""
    monkeypatch.setenv("RLLM_CORE_CACHE", str(tmp_path / "rllm-cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


REGRESSIONS = [
    # An unknown component name was looked up before the plan was resolved.
    b'loggers = ["nope", "nope"]\n',
    b'[trainer]\nname = "nope"\n',
    b'[trace_store]\nname = "nope"\n',
    b'[sampler]\nname = "nope"\n',
    b'[sft]\n[trainer]\nname = "nope"\n',
    # Nesting deep enough for the parser, or a deep copy of the data, to recurse too far.
    b"[run]\nname = " + b"[" * 5000 + b"]" * 5000 + b"\n",
    b"x = " + b"{a = " * 3000 + b"1" + b"}" * 3000 + b"\n",
    b"[" + b".".join([b"a"] * 2000) + b"]\n",
    # Not UTF-8.
    b"[run]\nname = '\xff\xfe'\n",
    # Keys that are empty or need quotes were shown bare: "(top level)", "[a b]".
    b'"" = []\n',
    b'["a b"]\nx = 1\n',
    b'[trainer]\nname = "torch"\n"" = 1\n',
]


def _with_regressions(test):
    for raw in REGRESSIONS:
        test = example(raw=raw)(test)
    return test


@_with_regressions
@settings(max_examples=EXAMPLES, **SETTINGS)
@given(raw=file_bytes(st.deferred(lambda: plan_documents())))
def test_any_plan_loads_or_fails_with_a_located_plan_error(raw, isolated, fuzz_counts):
    fuzz_counts["plan.toml files"] += 1
    _assert_loads_or_plan_error(raw, isolated)


@pytest.mark.slow
@settings(max_examples=EXAMPLES * SOAK_REPEATS, **SETTINGS)
@given(raw=file_bytes(st.deferred(lambda: plan_documents())))
def test_any_plan_soak(raw, isolated, fuzz_counts):
    fuzz_counts["plan.toml files (soak)"] += 1
    _assert_loads_or_plan_error(raw, isolated)


def test_generated_plans_reach_every_section(isolated):
    """The documents cover the schema: each core section is drawn, and some plans resolve."""
    seen: set[str] = set()
    resolved = 0

    @settings(max_examples=200, database=None, **SETTINGS)
    @given(data=plan_documents())
    def draw(data):
        nonlocal resolved
        seen.update(data)
        path = isolated / "plan.toml"
        path.write_text(tomli_w.dumps(data), encoding="utf-8")
        try:
            _check_plan(path, _manager())
            resolved += 1
        except PlanError:
            pass

    draw()
    assert set(Plan.model_fields) <= seen
    assert resolved > 0


def test_a_too_deep_override_is_a_plan_error(isolated):
    path = isolated / "plan.toml"
    path.write_text("[run]\nsteps = 2\n", encoding="utf-8")
    dotted = ".".join(["a"] * (MAX_TOML_NESTING + 1))
    with pytest.raises(PlanError, match="levels deep") as caught:
        prepare_plan(path, (f"{dotted}=1",), run_dir=Path("<run folder>"), manager=_manager())
    assert caught.value.issues[0].section == "a"


# ---------------------------------------------------------------- the command


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (b'[trainer]\nname = "nope"\n', "[trainer].name: no trainer backend named 'nope'"),
        (b"[run]\nname = " + b"[" * 5000 + b"]" * 5000 + b"\n", "(top level): invalid plan"),
        (b'[run]\nsteps = "ten"\n[gateway]\nport = 1e400\n', "[run].steps"),
        (b'"" = 1\n', '[""]: unknown section [""]'),
    ],
    ids=["unknown-component", "too-deep", "wrong-types", "empty-section-name"],
)
def test_plan_check_reports_in_one_paragraph_without_a_traceback(isolated, raw, where):
    path = isolated / "plan.toml"
    path.write_bytes(raw)
    result = CliRunner().invoke(main, ["plan", "check", str(path)])
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert lines[0].startswith("plan error"), result.output
    assert all(line.startswith(f"  {path}: ") for line in lines[1:]), result.output
    assert where in result.output


def test_run_refuses_a_plan_naming_an_unknown_logger_without_a_traceback(isolated):
    path = isolated / "plan.toml"
    path.write_text('loggers = ["nope", "nope"]\n', encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "rllm_core", "run", str(path)],
        capture_output=True,
        text=True,
        cwd=isolated,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert f"{path}: [loggers[1]].name: no logger named 'nope'" in result.stderr
    assert not (isolated / "runs").exists()
