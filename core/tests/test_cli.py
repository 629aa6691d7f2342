"""The ``rllm-core`` command line, run as a real subprocess over fake distributions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from fake_plugins import BROKEN_IMPORT, loss_plugin


def cli(*args: str, fakes=None, cwd: Path | None = None, **env: str):
    environment = dict(os.environ)
    environment["RLLM_CORE_STRICT_PLUGINS"] = "0"
    environment["COLUMNS"] = "200"
    if fakes is not None:
        environment["PYTHONPATH"] = fakes.pythonpath
    environment.update(env)
    return subprocess.run(
        [sys.executable, "-m", "rllm_core.cli", *args],
        capture_output=True,
        text=True,
        env=environment,
        cwd=cwd,
        timeout=60,
    )


def rows(result) -> dict[str, dict]:
    assert result.returncode == 0, result.stderr
    return {row["distribution"]: row for row in json.loads(result.stdout)}


@pytest.fixture
def broken(fake_distributions):
    fake_distributions.add(
        "rllm-loss-broken",
        version="0.1.0",
        entry_points={"fake_broken": "fake_broken"},
        modules={"fake_broken": BROKEN_IMPORT},
    )
    fake_distributions.add(
        "rllm-loss-alpha",
        version="1.2.0",
        entry_points={"fake_alpha": "fake_alpha"},
        modules={"fake_alpha": loss_plugin("alpha")},
    )
    return fake_distributions


def test_plugins_lists_status_version_and_components(broken):
    data = rows(cli("plugins", "--json", fakes=broken))
    assert data["rllm-loss-alpha"]["status"] == "active"
    assert data["rllm-loss-alpha"]["version"] == "1.2.0"
    assert data["rllm-loss-alpha"]["provides"] == ["loss:alpha"]
    assert data["rllm-loss-broken"]["status"] == "error"
    assert "RuntimeError: this plugin is broken on purpose" in data["rllm-loss-broken"]["error"]
    assert "traceback" not in data["rllm-loss-broken"]


def test_plugins_table_shows_error_row(broken):
    result = cli("plugins", fakes=broken)
    assert result.returncode == 0, result.stderr
    # Piped, the table is one tab-separated line per plugin under a header line.
    lines = result.stdout.splitlines()
    assert lines[:2] == ["# rllm-core plugins", "Plugin\tVersion\tStatus\tProvides"]
    fields = {line.split("\t")[0]: line.split("\t") for line in lines[2:]}
    assert fields["rllm-loss-broken"][1:3] == ["0.1.0", "error"]
    assert "this plugin is broken on purpose" in fields["rllm-loss-broken"][3]
    assert fields["rllm-loss-alpha"][1:] == ["1.2.0", "active", "loss:alpha"]
    assert "Traceback" not in result.stdout


def test_verbose_shows_traceback_and_module(broken):
    result = cli("plugins", "-v", fakes=broken)
    assert result.returncode == 0, result.stderr
    assert "Traceback (most recent call last)" in result.stdout
    assert 'raise RuntimeError("this plugin is broken on purpose")' in result.stdout
    assert "fake_broken" in result.stdout
    data = rows(cli("plugins", "--json", "-v", fakes=broken))
    assert "Traceback" in data["rllm-loss-broken"]["traceback"]
    assert data["rllm-loss-alpha"]["module"] == "fake_alpha"


def test_check_exits_1_on_error(broken):
    assert cli("plugins", "--check", fakes=broken).returncode == 1


def test_check_exits_0_when_healthy(fake_distributions):
    fake_distributions.add(
        "rllm-loss-alpha",
        entry_points={"fake_alpha": "fake_alpha"},
        modules={"fake_alpha": loss_plugin("alpha")},
    )
    installed = {ep.dist.metadata["Name"] for ep in entry_points(group="rllm_core") if ep.dist}
    others = ",".join(sorted(installed - {"rllm-loss-alpha"}))
    result = cli(
        "plugins", "--check", "--json", fakes=fake_distributions, RLLM_CORE_DISABLE_PLUGINS=others
    )
    assert result.returncode == 0, result.stdout
    statuses = {r["distribution"]: r["status"] for r in json.loads(result.stdout)}
    assert statuses.pop("rllm-loss-alpha") == "active"
    assert set(statuses.values()) <= {"disabled"}


def test_kind_filter(broken):
    data = rows(cli("plugins", "--json", "--kind", "loss", fakes=broken))
    assert "rllm-loss-alpha" in data
    assert "rllm-loss-broken" not in data
    assert (
        rows(cli("plugins", "--json", "--kind", "renderer", fakes=broken)).get("rllm-loss-alpha")
        is None
    )
    assert cli("plugins", "--kind", "nonsense", fakes=broken).returncode == 2


def test_every_command_works_with_a_broken_plugin(broken, tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text('[algorithm]\nloss = "alpha"\n')
    assert cli("--help", fakes=broken).returncode == 0
    assert cli("--version", fakes=broken).returncode == 0
    checked = cli("plan", "check", str(plan), "--json", fakes=broken)
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["components"][0]["name"] == "alpha"
    ran = cli("run", str(plan), fakes=broken)
    assert ran.returncode == 2
    assert "a run needs a trainer backend" in ran.stderr
    assert "Traceback" not in ran.stderr
    marks = "# generated by `rllm-core docs write`"
    (tmp_path / "mkdocs.yml").write_text(f"nav:\n  {marks}: begin\n  {marks}: end\n")
    (tmp_path / "plugins" / "losses" / "alpha").mkdir(parents=True)
    (tmp_path / "plugins" / "losses" / "alpha" / "README.md").write_text("# rllm-loss-alpha\n")
    docs = cli("docs", "write", "--root", str(tmp_path), fakes=broken)
    assert docs.returncode == 0, docs.stderr
    assert (tmp_path / "docs" / "plugins" / "hooks.md").exists()
    assert (tmp_path / "docs" / "reference" / "plugins" / "losses-alpha.md").exists()


def test_conflict_shown_and_plan_names_both(fake_distributions, tmp_path):
    for dist, module, version in (
        ("rllm-loss-one", "fake_one", "1.0.0"),
        ("rllm-loss-two", "fake_two", "2.0.0"),
    ):
        fake_distributions.add(
            dist, version=version, entry_points={module: module}, modules={module: loss_plugin("x")}
        )
    data = rows(cli("plugins", "--json", fakes=fake_distributions))
    assert data["rllm-loss-one"]["status"] == "conflict"
    assert data["rllm-loss-two"]["status"] == "conflict"
    assert data["rllm-loss-one"]["conflicts"] == ["loss:x also provided by rllm-loss-two 2.0.0"]
    assert cli("plugins", "--check", fakes=fake_distributions).returncode == 1
    plan = tmp_path / "plan.toml"
    plan.write_text('[algorithm]\nloss = "x"\n')
    result = cli("plan", "check", str(plan), fakes=fake_distributions)
    assert result.returncode == 2
    assert "rllm-loss-one 1.0.0" in result.stderr and "rllm-loss-two 2.0.0" in result.stderr
    assert "[algorithm].loss" in result.stderr


def test_plan_check_typo_exit_2_with_one_message(fake_distributions, tmp_path):
    fake_distributions.add(
        "rllm-loss-zeta",
        entry_points={"fake_zeta": "fake_zeta"},
        modules={"fake_zeta": loss_plugin("zeta-tv")},
    )
    plan = tmp_path / "plan.toml"
    plan.write_text('[algorithm]\nloss = "zeta_tvv"\n')
    result = cli("plan", "check", str(plan), fakes=fake_distributions)
    assert result.returncode == 2
    problems = [line for line in result.stderr.splitlines() if line.startswith("  ")]
    assert len(problems) == 1
    (message,) = problems
    assert str(plan) in message
    assert "[algorithm].loss" in message
    assert "did you mean 'zeta-tv'?" in message
    assert "available: " in message and "zeta-tv" in message.split("available: ")[1]
    as_json = json.loads(cli("plan", "check", str(plan), "--json", fakes=fake_distributions).stdout)
    assert as_json["ok"] is False
    assert as_json["issues"][0]["location"] == "[algorithm].loss"


def test_plan_check_unknown_component_key(fake_distributions, tmp_path):
    fake_distributions.add(
        "rllm-loss-alpha",
        entry_points={"fake_alpha": "fake_alpha"},
        modules={"fake_alpha": loss_plugin("alpha")},
    )
    plan = tmp_path / "plan.toml"
    plan.write_text('[algorithm]\nloss = { name = "alpha", scael = 2 }\n')
    result = cli("plan", "check", str(plan), fakes=fake_distributions)
    assert result.returncode == 2
    assert "[algorithm].loss.scael: loss 'alpha' has no key 'scael'; did you mean 'scale'?" in (
        result.stderr
    )
    assert "valid keys: scale" in result.stderr


def test_plan_check_prints_resolved_plan_with_overrides(fake_distributions, tmp_path):
    fake_distributions.add(
        "rllm-loss-alpha",
        entry_points={"fake_alpha": "fake_alpha"},
        modules={"fake_alpha": loss_plugin("alpha")},
    )
    plan = tmp_path / "plan.toml"
    plan.write_text('[run]\nsteps = 3\n[algorithm]\nloss = "alpha"\n')
    result = cli(
        "plan",
        "check",
        str(plan),
        "--set",
        "run.steps=7",
        "--set",
        "algorithm.loss.scale=0.5",
        fakes=fake_distributions,
    )
    assert result.returncode == 0, result.stderr
    assert "[run].steps" in result.stdout and "7" in result.stdout
    assert "loss:alpha" in result.stdout and "scale = 0.5" in result.stdout
    data = json.loads(
        cli(
            "plan", "check", str(plan), "--json", "--set", "run.steps=7", fakes=fake_distributions
        ).stdout
    )
    assert data["plan"]["run"]["steps"] == 7


def test_missing_plan_file_exit_2(tmp_path):
    result = cli("plan", "check", str(tmp_path / "nope.toml"))
    assert result.returncode == 2
    assert "plan file not found" in result.stderr


def test_run_names_every_missing_component(fake_distributions, tmp_path):
    fake_distributions.add(
        "rllm-loss-alpha",
        entry_points={"fake_alpha": "fake_alpha"},
        modules={"fake_alpha": loss_plugin("alpha")},
    )
    plan = tmp_path / "plan.toml"
    plan.write_text('[algorithm]\nloss = "alpha"\n')
    result = cli("run", str(plan), fakes=fake_distributions)
    assert result.returncode == 2
    for needed in (
        "[trainer]:",
        "[renderer]:",
        "[harness]:",
        "[tasks]:",
        "[trace_store]:",
        "[algorithm].advantage:",
    ):
        assert needed in result.stderr
    assert "rllm-trainer-backend-torch" in result.stderr
    assert "[algorithm].loss:" not in result.stderr


EVERYTHING = """
from rllm_core import ComponentSpec, hookimpl

class Closable:
    def __init__(self, config):
        self.config = config
    def close(self):
        print("closed", type(self).__name__)

def explode(config):
    raise OSError("disk on fire")

@hookimpl
def rllm_losses():
    yield ComponentSpec(kind="loss", name="l", factory=Closable, summary="s")
@hookimpl
def rllm_advantage_estimators():
    yield ComponentSpec(kind="advantage_estimator", name="a", factory=Closable, summary="s")
@hookimpl
def rllm_renderers():
    yield ComponentSpec(kind="renderer", name="r", factory=Closable, summary="s")
@hookimpl
def rllm_harnesses():
    yield ComponentSpec(kind="harness", name="h", factory=Closable, summary="s")
@hookimpl
def rllm_task_sources():
    yield ComponentSpec(kind="task_source", name="t", factory=Closable, summary="s")
@hookimpl
def rllm_trace_stores():
    yield ComponentSpec(kind="trace_store", name="ts", factory=Closable, summary="s")
    yield ComponentSpec(kind="trace_store", name="boom", factory=explode, summary="s")
@hookimpl
def rllm_trainer_backends():
    yield ComponentSpec(kind="trainer_backend", name="tb", factory=Closable, summary="s")
"""


def test_run_builds_every_component(fake_distributions, tmp_path):
    fake_distributions.add(
        "rllm-all-things", entry_points={"fake_all": "fake_all"}, modules={"fake_all": EVERYTHING}
    )
    plan = tmp_path / "plan.toml"
    plan.write_text(
        f'[run]\noutput_dir = "{tmp_path / "runs"}"\n'
        '[algorithm]\nloss = "l"\nadvantage = "a"\n[trainer]\nname = "tb"\n'
        '[renderer]\nname = "r"\n[harness]\nname = "h"\n[tasks]\nname = "t"\n'
        '[trace_store]\nname = "ts"\n'
    )
    result = cli("run", str(plan), fakes=fake_distributions)
    assert result.returncode == 1
    assert result.stdout.count("built ") == 7
    assert result.stdout.count("closed Closable") == 7
    assert "the run failed" in result.stderr
    failed = cli("run", str(plan), "--set", "trace_store.name=boom", fakes=fake_distributions)
    assert failed.returncode == 1
    assert "[trace_store]: building trace_store:boom (rllm-all-things 1.0.0) failed:" in (
        failed.stderr
    )
    assert "OSError: disk on fire" in failed.stderr
    assert failed.stdout.count("closed Closable") == failed.stdout.count("built ")


def test_plan_check_warns_when_an_evaluation_plan_lacks_what_a_run_needs(
    fake_distributions, tmp_path
):
    fake_distributions.add(
        "rllm-all-things", entry_points={"fake_all": "fake_all"}, modules={"fake_all": EVERYTHING}
    )
    plan = tmp_path / "plan.toml"
    sampling = (
        '[trainer]\nname = "tb"\n[renderer]\nname = "r"\n[harness]\nname = "h"\n'
        '[tasks]\nname = "t"\n[trace_store]\nname = "ts"\n'
    )
    plan.write_text(sampling + '[algorithm]\nadvantage = "a"\n')
    result = cli("plan", "check", str(plan), fakes=fake_distributions)
    assert result.returncode == 0, result.stderr
    assert "[algorithm].loss: a run needs a loss" in result.stderr
    assert "`rllm-core run` refuses the plan (`rllm-core eval` works)" in result.stderr
    assert cli("plan", "check", str(plan), "--strict", fakes=fake_distributions).returncode == 2
    # With the loss it is a run plan; without the sampling components it is neither, and
    # the run and eval commands name what is missing themselves.
    plan.write_text(sampling + '[algorithm]\nloss = "l"\nadvantage = "a"\n')
    assert "warning" not in cli("plan", "check", str(plan), fakes=fake_distributions).stderr
    plan.write_text('[algorithm]\nadvantage = "a"\n')
    assert "warning" not in cli("plan", "check", str(plan), fakes=fake_distributions).stderr
