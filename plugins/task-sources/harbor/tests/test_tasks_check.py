"""``rllm-core tasks check`` over the harbor task source: listing, problems and exit codes,
--solve and --noop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from rllm_core import ComponentSpec, hookimpl
from rllm_core.cli import main, tasks_cmd
from rllm_core.plugins import PluginManager
from rllm_task_source_harbor import plugin
from task_sandbox import GOOD_SOLVE, RootedBackend, write_task


@pytest.fixture(autouse=True)
def backends(tmp_path, monkeypatch):
    """The command sees only this package's harbor task source and ``--sandbox rooted``,
    which builds a :class:`RootedBackend`; returns the backends built."""
    built: list[RootedBackend] = []

    def factory(config):
        backend = RootedBackend(tmp_path / f"backend-{len(built)}")
        built.append(backend)
        return backend

    class Plugin:
        @hookimpl
        def rllm_sandbox_backends(self):
            yield ComponentSpec(
                kind="sandbox_backend", name="rooted", factory=factory, summary="test double"
            )

    manager = PluginManager(load_entry_points=False, strict=True)
    manager.register(Plugin(), name="rooted")
    manager.register(plugin, name="harbor", distribution="rllm-task-source-harbor")
    monkeypatch.setattr(tasks_cmd, "get_plugin_manager", lambda: manager)
    return built


@pytest.fixture
def dataset(tmp_path) -> Path:
    root = tmp_path / "set"
    write_task(root, "alpha")
    write_task(root, "beta", toml="[agent]\ntimeout_sec = 7\n[environment]\nmemory = '1G'\n")
    (root / "dataset.toml").write_text('name = "tiny"\n')
    return root


def invoke(*args: str):
    return CliRunner().invoke(main, ["tasks", "check", *args])


def test_lists_tasks_with_settings(dataset):
    result = invoke(str(dataset))
    assert result.exit_code == 0, result.output
    assert "tiny: 2 task(s)" in result.output
    assert "alpha" in result.output and "beta" in result.output
    assert "1 cpu 1024M" in result.output
    assert "7/600s" in result.output


def test_json_report(dataset):
    result = invoke(str(dataset), "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["ok"] is True
    assert report["dataset"] == "tiny"
    assert [t["task_id"] for t in report["tasks"]] == ["alpha", "beta"]
    beta = report["tasks"][1]["settings"]
    assert beta["memory_mb"] == 1024
    assert beta["agent_timeout_s"] == 7.0
    assert beta["workdir"] == "/app"
    assert beta["setup_steps"] == 1
    assert beta["replay_dockerfile"] is True
    assert report["tasks"][0]["runs"] == {}


def test_format_problems_exit_2_naming_task_and_field(dataset):
    write_task(dataset, "gamma", toml="[environment]\nmemory = 'lots'\n", test_sh=None)
    result = invoke(str(dataset))
    assert result.exit_code == 2
    assert "task format error (2 problems)" in result.output
    assert "gamma: [environment].memory: 'lots' is not a size" in result.output
    assert "gamma: tests/test.sh: missing" in result.output


def test_format_problems_as_json(dataset):
    write_task(dataset, "gamma", toml="[agent]\ntimeout_sec = 0\n")
    result = invoke(str(dataset), "--json")
    assert result.exit_code == 2
    report = json.loads(result.output)
    assert report["ok"] is False
    assert report["problems"] == [
        {"task": "gamma", "field": "[agent].timeout_sec", "message": "must be positive, got 0"}
    ]


def test_solve_and_noop_get_the_expected_rewards(dataset, backends):
    result = invoke(str(dataset), "--solve", "--noop", "--sandbox", "rooted", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    runs = {t["task_id"]: t["runs"] for t in report["tasks"]}
    for task_id in ("alpha", "beta"):
        assert runs[task_id]["solve"]["reward"] == 1.0
        assert runs[task_id]["noop"]["reward"] == 0.0
        assert runs[task_id]["solve"]["passed"] and runs[task_id]["noop"]["passed"]
    assert len(backends) == 1
    assert len(backends[0].specs) == 4
    assert backends[0]._sandboxes == []


def test_solve_table_output(dataset, backends):
    result = invoke(str(dataset), "--solve", "--sandbox", "rooted", "--jobs", "2")
    assert result.exit_code == 0, result.output
    assert "solve (want 1)" in result.output
    assert "all 2 run(s) got the expected reward" in result.output


def test_wrong_solution_exits_1(dataset, backends):
    (dataset / "beta" / "solution" / "solve.sh").write_text("echo nope > output.txt\n")
    result = invoke(str(dataset), "--solve", "--sandbox", "rooted")
    assert result.exit_code == 1
    assert "1 of 2 run(s) did not get the expected reward" in result.output


def test_noop_that_passes_exits_1(dataset, backends):
    logs = '"$SANDBOX_ROOT/logs/verifier"'
    (dataset / "alpha" / "tests" / "test.sh").write_text(
        f"mkdir -p {logs}; echo 1 > {logs}/reward.txt\n"
    )
    result = invoke(str(dataset), "--noop", "--sandbox", "rooted", "--json")
    assert result.exit_code == 1
    runs = {t["task_id"]: t["runs"]["noop"] for t in json.loads(result.output)["tasks"]}
    assert (runs["alpha"]["reward"], runs["alpha"]["passed"]) == (1.0, False)
    assert (runs["beta"]["reward"], runs["beta"]["passed"]) == (0.0, True)


def test_verifier_error_is_reported_and_exits_1(dataset, backends):
    (dataset / "alpha" / "tests" / "test.sh").write_text("echo broken >&2; exit 5\n")
    result = invoke(str(dataset), "--solve", "--sandbox", "rooted", "--json")
    assert result.exit_code == 1
    alpha = json.loads(result.output)["tasks"][0]["runs"]["solve"]
    assert alpha["reward"] is None
    assert alpha["error"].startswith("VerifierCrashed: task alpha: tests/test.sh exited 5")


def test_solve_needs_every_solution(dataset, backends):
    (dataset / "beta" / "solution" / "solve.sh").unlink()
    result = invoke(str(dataset), "--solve", "--sandbox", "rooted")
    assert result.exit_code == 2
    assert "beta: solution/solve.sh: missing; --solve needs a reference solution" in result.output
    assert backends == []


def test_unknown_sandbox_exits_2(dataset, backends):
    result = invoke(str(dataset), "--solve", "--sandbox", "nosuch")
    assert result.exit_code == 2
    assert "no sandbox backend named 'nosuch' is installed" in result.output


def test_no_replay_flag(dataset):
    result = invoke(str(dataset), "--no-replay", "--json")
    settings = json.loads(result.output)["tasks"][0]["settings"]
    assert (settings["replay_dockerfile"], settings["setup_steps"]) == (False, 0)


def test_verbose_shows_replay_notes(tmp_path):
    dockerfile = "FROM debian\nUSER app\nCOPY in.txt /app/\n"
    extra = {"environment/in.txt": "1\n"}
    write_task(tmp_path / "set", "a", dockerfile=dockerfile, solve_sh=GOOD_SOLVE, extra=extra)
    result = invoke(str(tmp_path / "set"), "-v")
    assert result.exit_code == 0, result.output
    assert "a: Dockerfile line 2: USER app skipped on replay" in result.output
    assert "1 RUN" not in result.output and "0 RUN, 1 COPY" in result.output


def test_a_copy_replay_cannot_do_is_a_problem_of_the_task(tmp_path):
    dockerfile = "FROM debian\nCOPY --from=build /out /app/\nCOPY missing.txt /app/\n"
    write_task(tmp_path / "set", "a", dockerfile=dockerfile, solve_sh=GOOD_SOLVE)
    result = invoke(str(tmp_path / "set"))
    assert result.exit_code == 2, result.output
    assert "a: environment/Dockerfile: line 2: COPY --from=build copies from another" in (
        result.output
    )


def test_the_healthcheck_is_listed(tmp_path):
    toml = '[environment.healthcheck]\ncommand = "test -f /app/ready"\nretries = 1\n'
    write_task(tmp_path / "set", "a", toml=toml, solve_sh=GOOD_SOLVE)
    result = invoke(str(tmp_path / "set"), "--json")
    assert result.exit_code == 0, result.output
    settings = json.loads(result.output)["tasks"][0]["settings"]
    assert settings["healthcheck"] == "test -f /app/ready"
    assert settings["setup"] == "1 RUN + healthcheck"
    table = invoke(str(tmp_path / "set"))
    assert "1 RUN + healthcheck" in table.output


NAMED_TEST = """\
mkdir -p "$SANDBOX_ROOT/logs/verifier"
if [ "$(cat output.txt 2>/dev/null)" = "done" ]; then c=1; else c=0; fi
echo "{\\"correctness\\": $c, \\"style\\": 0.5}" > "$SANDBOX_ROOT/logs/verifier/reward.json"
"""


def test_a_1_4_task_with_named_rewards_solves_and_reports_every_reward(tmp_path, backends):
    toml = 'schema_version = "1.4"\n[verifier]\nreward_key = "correctness"\n'
    write_task(tmp_path / "set", "named", toml=toml, test_sh=NAMED_TEST)
    result = invoke(str(tmp_path / "set"), "--solve", "--noop", "--sandbox", "rooted", "--json")
    assert result.exit_code == 0, result.output
    runs = json.loads(result.output)["tasks"][0]["runs"]
    assert runs["solve"]["reward"] == 1.0
    assert runs["solve"]["signals"] == {"correctness": 1.0, "style": 0.5}
    assert runs["noop"]["reward"] == 0.0
    assert runs["noop"]["signals"] == {"correctness": 0.0, "style": 0.5}


def test_a_separate_verifier_or_a_newer_version_is_refused_before_any_sandbox(tmp_path, backends):
    root = tmp_path / "set"
    separate = '[verifier]\nenvironment_mode = "separate"\n'
    write_task(root, "sep", toml=separate, extra={"tests/Dockerfile": "FROM alpine\n"})
    write_task(root, "newer", toml='schema_version = "2.0"\n')
    result = invoke(str(root), "--solve", "--sandbox", "rooted")
    assert result.exit_code == 2
    assert (
        "newer: schema_version: task.toml declares schema version '2.0', which this reader"
        " does not understand; it reads 1.0, 1.1, 1.2, 1.3, 1.4" in result.output
    )
    assert (
        "sep: [verifier].environment_mode: asks for a separate verifier environment (its"
        f" image built from {(root / 'sep' / 'tests' / 'Dockerfile').resolve()})" in result.output
    )
    assert backends == []
