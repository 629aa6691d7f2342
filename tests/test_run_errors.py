"""How `rllm-core run` and `rllm-core eval` fail, through the CLI: one message, the right exit
code, no traceback, no run folder for what the plan got wrong, finished checkpoints intact.

The verifier crash runs a tiny random Llama over SmolLM2's tokenizer (what it answers does
not matter: the verifier crashes whatever it is) on a copy of the shipped `hello-file` Harbor
task in the local sandbox, which runs a task's tests only in bubblewrap (those tests skip
without it): one step that passes and saves step-1, then the task's tests/test.sh made to
crash and the run resumed for a second step.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from reference.run_cuts import cut_path, cut_steps

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart" / "plan.toml"
HELLO = ROOT / "examples" / "tasks" / "shell" / "hello-file"
HARBOR_PLAN = """\
[run]
name = "crash"
steps = 1
save_every = 1

[algorithm]
loss = "dppo-tv"
advantage = "grpo"
group_size = 2
batch_size = 1

[sampling]
max_tokens = 2

[rollout]
max_infra_retries = 0

[trainer]
name = "torch"
model = "{model}"
device = "cpu"
lora = { rank = 2, alpha = 4.0 }

[renderer]
name = "chatml"

[harness]
name = "single-turn"

[tasks]
name = "harbor"
path = "tasks"
eval_path = "tasks"

[trace_store]
name = "deltachain"

[sandbox]
name = "local"
"""
CRASHING_TEST = '#!/bin/bash\necho "the checker exploded" >&2\nexit 3\n'


def run_cli(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rllm_core.cli", *args],
        cwd=cwd,
        env=dict(os.environ, COLUMNS="200", **env),
        capture_output=True,
        text=True,
        timeout=300,
    )


def one_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    """The single error message of a failed command, checked to be the only one."""
    report = f"exit {result.returncode}\n--- stdout\n{result.stdout}--- stderr\n{result.stderr}"
    assert result.returncode == code, report
    assert "Traceback (most recent call last)" not in result.stderr, report
    starts = [
        line for line in result.stderr.splitlines() if line.startswith(("error:", "plan error"))
    ]
    assert len(starts) == 1, report
    return " ".join(result.stderr[result.stderr.index(starts[0]) :].split())


# ------------------------------------------------------------------ before anything is built


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("syntax", ["bad.toml: (top level): invalid TOML", "line 2", "fix the syntax"]),
        ("unknown key", ["[run].bogus: unknown key 'bogus'", "valid keys:"]),
        (
            "missing component",
            ["[trace_store]: a run needs a trace store", 'add name = "deltachain"'],
        ),
        ("bad value", ["[sampling].top_p", "(got 2)", "remove the key for the default 1.0"]),
        ("model not cached", ["[trainer].model", "rllm-core models pull smollm2-135m-instruct"]),
    ],
)
def test_a_bad_plan_exits_2_with_one_message_and_no_run_folder(tmp_path, case, expected):
    plan = tmp_path / "bad.toml"
    text = QUICKSTART.read_text()
    args: list[str] = []
    env: dict[str, str] = {}
    if case == "syntax":
        text = '[run]\nname = "quickstart\n'
    elif case == "unknown key":
        args = ["--set", "run.bogus=1"]
    elif case == "missing component":
        text = text.replace('[trace_store]\nname = "deltachain"', "")
    elif case == "bad value":
        text = text.replace("top_p = 1.0", "top_p = 2")
    else:
        (tmp_path / "empty-cache").mkdir()
        env["RLLM_CORE_CACHE"] = str(tmp_path / "empty-cache")
    plan.write_text(text)
    for command in ("run", "eval"):
        result = run_cli(tmp_path, command, str(plan), *args, **env)
        message = one_error(result, 2)
        for part in expected:
            assert part.replace("a run", "an evaluation" if command == "eval" else "a run") in (
                message
            ), message
        assert "bad.toml" in message
        assert not (tmp_path / "runs").exists(), f"{command} left a folder for a bad plan"


@pytest.mark.parametrize("role", ["sampler", "trainer"])
def test_a_role_of_a_plan_that_cannot_split_exits_2_with_no_run_folder(tmp_path, role):
    result = run_cli(tmp_path, "run", str(QUICKSTART), "--role", role)
    message = one_error(result, 2)
    assert f"--role {role} shares the run with the other role through an object store" in message
    assert '[run].pipeline = "async" and an [object_store] section' in message
    assert not (tmp_path / "runs").exists(), "a refused role left a run folder"


def test_a_role_of_a_plan_that_exports_exits_2_naming_the_key(tmp_path):
    text = QUICKSTART.read_text().replace("../tasks/", f"{ROOT / 'examples' / 'tasks'}/")
    plan = tmp_path / "split.toml"
    plan.write_text(
        "".join(
            line
            for line in text.splitlines(keepends=True)
            if not line.startswith(("eval_every", "keep_best"))
        )
    )
    settings = [
        'run.pipeline="async"',
        "algorithm.max_policy_age=1",
        'object_store.name="file"',
        f'object_store.root="{tmp_path / "store"}"',
        f'run.export="{tmp_path / "model"}"',
    ]
    sets = [arg for setting in settings for arg in ("--set", setting)]
    result = run_cli(tmp_path, "run", str(plan), "--role", "trainer", *sets)
    message = one_error(result, 2)
    assert "[run].export" in message and "--role trainer splits it" in message
    assert "rllm-core checkpoints export RUN_FOLDER --merge --out DIR" in message
    assert not (tmp_path / "runs").exists(), "a refused role left a run folder"


def test_a_port_in_use_exits_2_before_loading_the_model(smollm2_model_dir, tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        for command in ("run", "eval"):
            result = run_cli(tmp_path, command, str(QUICKSTART), "--set", f"gateway.port={port}")
            message = one_error(result, 2)
            assert message == (
                f"error: {QUICKSTART}: [gateway].port: port {port} on 127.0.0.1 is already in"
                " use; free it (stop the process listening on it) or set port = 0 under"
                " [gateway] to use a free port"
            )
            assert "Loading weights" not in result.stderr
            assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------ a verifier that crashes


def require_bubblewrap() -> None:
    """The Harbor task uploads /tests/test.sh and runs it, which the local sandbox can do only
    in bubblewrap (without it commands do not see /tests): skip without it, fail in CI."""
    testing = pytest.importorskip("rllm_sandbox_backend_local.testing")
    testing.require_bubblewrap()


def harbor_plan(folder: Path, model: Path) -> Path:
    shutil.copytree(HELLO, folder / "tasks" / HELLO.name)
    plan = folder / "plan.toml"
    plan.write_text(HARBOR_PLAN.replace("{model}", str(model)))
    return plan


def digests(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def crash_verifier(folder: Path) -> None:
    (folder / "tasks" / HELLO.name / "tests" / "test.sh").write_text(CRASHING_TEST)


def test_a_crashing_verifier_stops_the_run_with_its_output_and_keeps_checkpoints(
    tiny_smol_model_dir, tmp_path
):
    require_bubblewrap()
    plan = harbor_plan(tmp_path, tiny_smol_model_dir)
    first = run_cli(tmp_path, "run", str(plan), "--plain")
    assert first.returncode == 0, first.stderr[-3000:]
    run_dir = tmp_path / first.stdout.splitlines()[0].removeprefix("run folder: ")
    checkpoints = run_dir / "checkpoints"
    before = digests(checkpoints)
    assert f"{cut_path(checkpoints, 1).relative_to(checkpoints)}/loop.json" in before

    crash_verifier(tmp_path)
    resumed = run_cli(
        tmp_path, "run", str(plan), "--plain", "--resume", str(run_dir), "--set", "run.steps=2"
    )
    message = one_error(resumed, 1)
    assert message.startswith(
        "error: step 2: 2 of 2 rollouts failed on infrastructure (2 verifier_error)"
    )
    assert "more than [rollout].max_failed_fraction = 0.5 allows" in message
    assert "Task 'hello-file'" in message
    assert "tests/test.sh exited 3 without writing a reward file" in message
    assert "the checker exploded" in message
    assert f"{tmp_path / 'tasks' / HELLO.name}/tests/test.sh" in message
    assert "The run stopped at step 2 without training it" in message

    assert digests(checkpoints) == before
    assert cut_steps(checkpoints) == [1]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["last_step"] == 1
    assert summary["failure"]["kind"] == "verifier_error"
    assert "the checker exploded" in summary["reason"]
    metrics = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in metrics] == [1]


def test_an_evaluation_where_every_attempt_crashed_exits_1_with_results(
    tiny_smol_model_dir, tmp_path
):
    require_bubblewrap()
    plan = harbor_plan(tmp_path, tiny_smol_model_dir)
    crash_verifier(tmp_path)
    result = run_cli(tmp_path, "eval", str(plan), "--plain", "--attempts", "2")
    message = one_error(result, 1)
    assert message.startswith(
        "error: evaluation: 2 of 2 rollouts failed on infrastructure (2 verifier_error)"
    )
    assert "so no attempt was scored" in message and "the checker exploded" in message
    folder = tmp_path / result.stdout.splitlines()[0].removeprefix("eval folder: ")
    (line,) = [json.loads(x) for x in (folder / "results.jsonl").read_text().splitlines()]
    assert line["task_id"] == "hello-file" and line["rewards"] == []
    assert [f["termination"] for f in line["infra_failures"]] == ["verifier_error"] * 2
    assert json.loads((folder / "summary.json").read_text())["tasks_unscored"] == 1
