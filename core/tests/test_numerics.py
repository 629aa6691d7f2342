"""The reproducibility environment of a run and the record of what its numbers depend on."""

from __future__ import annotations

import json

from rllm_core.numerics import (
    REPRODUCIBLE_ENVIRONMENT,
    changed_conditions,
    conditions,
    inherited_environment,
    prepare_environment,
)
from rllm_core.run.folder import RunFolder


class Reporting:
    def __init__(self, **report):
        self.report = report

    def numerics(self):
        return self.report


class Silent:
    pass


def test_a_deterministic_run_sets_each_variable_the_environment_lacks():
    env: dict[str, str] = {}
    assert prepare_environment(True, env) == dict(REPRODUCIBLE_ENVIRONMENT)
    assert env == dict(REPRODUCIBLE_ENVIRONMENT)
    assert env["MKL_CBWR"] == "AUTO,STRICT"


def test_a_users_own_setting_is_kept():
    env = {"MKL_CBWR": "COMPATIBLE", "PATH": "/bin"}
    now = prepare_environment(True, env)
    assert env["MKL_CBWR"] == "COMPATIBLE" and now["MKL_CBWR"] == "COMPATIBLE"
    assert env["PATH"] == "/bin"


def test_a_run_that_is_not_deterministic_changes_nothing():
    env = {"PATH": "/bin"}
    assert prepare_environment(False, env) == dict.fromkeys(REPRODUCIBLE_ENVIRONMENT)
    assert env == {"PATH": "/bin"}


def test_conditions_ask_the_components_that_report():
    found = conditions(True, {"[trainer]": Reporting(threads=2), "[renderer]": Silent()})
    assert found["deterministic"] is True
    assert found["components"] == {"[trainer]": {"threads": 2}}
    assert set(found["environment"]) == set(REPRODUCIBLE_ENVIRONMENT)
    assert found["machine"]["arch"] and found["python"]


def test_changed_conditions_name_each_difference_by_its_dotted_key():
    before = {"machine": {"cpu": "A", "arch": "x86_64"}, "components": {"t": {"threads": 2}}}
    after = {"machine": {"cpu": "B", "arch": "x86_64"}, "components": {"t": {"threads": 4}}}
    assert changed_conditions(before, after) == [
        "components.t.threads: 2 -> 4",
        "machine.cpu: 'A' -> 'B'",
    ]
    assert changed_conditions(before, before) == []


def test_sandboxes_inherit_only_the_reproducible_variables(monkeypatch):
    monkeypatch.setenv("MKL_CBWR", "AUTO,STRICT")
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setenv("SECRET_TOKEN", "x")
    assert inherited_environment() == {"MKL_CBWR": "AUTO,STRICT"}


def test_a_new_run_records_and_a_resume_compares(tmp_path):
    folder = RunFolder(tmp_path)
    start = {"deterministic": True, "components": {"[trainer]": {"threads": 2}}}
    assert folder.record_numerics(start, resume=False) is None
    assert json.loads(folder.numerics.read_text()) == start

    assert folder.record_numerics(start, resume=True) is None
    moved = {"deterministic": True, "components": {"[trainer]": {"threads": 8}}}
    warning = folder.record_numerics(moved, resume=True)
    assert warning is not None
    assert "components.[trainer].threads: 2 -> 8" in warning
    assert "not be bitwise equal" in warning
    assert json.loads(folder.numerics.read_text()) == start
