"""Harbor task format 1.4 end to end: ``rllm-core tasks check --solve --noop`` over tasks
written for ``schema_version = "1.4"`` whose verifiers write named rewards to
``/logs/verifier/reward.json`` or ``rewards.json``, run by the ``harbor`` task source in the
real ``local`` sandbox backend (bubblewrap); and the same command refusing a task whose
verifier asks for its own environment."""

from __future__ import annotations

from pathlib import Path

import pytest

DOCKERFILE = "FROM debian:bookworm-slim\nWORKDIR /app\nRUN printf 'b\\na\\nb\\n' > words.txt\n"
SOLVE = "#!/bin/bash\nset -euo pipefail\nsort -u /app/words.txt > /app/sorted.txt\n"

# Each verifier scores the answer twice, exactness and a final newline, and writes named
# rewards (no field named "reward") to reward.json or rewards.json ($out, set per task).
CHECKS = """\
#!/bin/bash
mkdir -p /logs/verifier
exact=0; newline=0
if [ "$(cat /app/sorted.txt 2>/dev/null)" = "$(printf 'a\\nb')" ]; then exact=1; fi
if [ -s /app/sorted.txt ] && [ -z "$(tail -c1 /app/sorted.txt)" ]; then newline=1; fi
"""

TASKS = {
    # [verifier].reward_key names the reward trained on; "style" is recorded only.
    "keyed": (
        '[verifier]\ntimeout_sec = 30\nreward_key = "correctness"\n',
        CHECKS
        + "out=/logs/verifier/reward.json\n"
        + 'echo "{\\"correctness\\": $exact, \\"style\\": 0.25}" > $out\n',
    ),
    # No key and no field named "reward": the mean of the named rewards, from rewards.json.
    "mean": (
        "[verifier]\ntimeout_sec = 30\n",
        CHECKS
        + "out=/logs/verifier/rewards.json\n"
        + 'echo "{\\"exact\\": $exact, \\"newline\\": $newline}" > $out\n',
    ),
}


def write_task(root: Path, name: str, verifier: str, test_sh: str) -> None:
    files = {
        "task.toml": 'schema_version = "1.4"\n\n[task]\nname = "rllm/sort-words"\n\n'
        "[agent]\ntimeout_sec = 60\n\n"
        f"{verifier}\n"
        '[environment]\nnetwork_mode = "no-network"\n',
        "instruction.md": "Write the distinct lines of /app/words.txt, sorted, to"
        " /app/sorted.txt.\n",
        "environment/Dockerfile": DOCKERFILE,
        "solution/solve.sh": SOLVE,
        "tests/test.sh": test_sh,
    }
    for relative, text in files.items():
        path = root / name / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def require_local_sandbox() -> None:
    pytest.importorskip(
        "rllm_task_source_harbor", reason="rllm-task-source-harbor is not installed"
    )
    testing = pytest.importorskip(
        "rllm_sandbox_backend_local.testing", reason="rllm-sandbox-backend-local is not installed"
    )
    testing.require_bubblewrap()


def test_tasks_check_solves_1_4_tasks_with_named_rewards(tmp_path, run_cli):
    require_local_sandbox()
    root = tmp_path / "set"
    for name, (verifier, test_sh) in TASKS.items():
        write_task(root, name, verifier, test_sh)
    result = run_cli("tasks", "check", str(root), "--solve", "--noop", "--json")
    assert result.returncode == 0, result
    report = result.json()
    assert report["ok"] is True
    runs = {task["task_id"]: task["runs"] for task in report["tasks"]}
    for name in TASKS:
        assert runs[name]["solve"]["passed"] and runs[name]["noop"]["passed"], runs[name]
    assert runs["keyed"]["solve"]["reward"] == 1.0
    assert runs["keyed"]["solve"]["signals"] == {"correctness": 1.0, "style": 0.25}
    assert runs["keyed"]["noop"]["reward"] == 0.0
    assert runs["keyed"]["noop"]["signals"] == {"correctness": 0.0, "style": 0.25}
    assert runs["mean"]["solve"]["reward"] == 1.0
    assert runs["mean"]["solve"]["signals"] == {"exact": 1.0, "newline": 1.0}
    assert runs["mean"]["noop"]["reward"] == 0.0
    assert runs["mean"]["noop"]["signals"] == {"exact": 0.0, "newline": 0.0}


def test_tasks_check_refuses_a_separate_verifier_environment(tmp_path, run_cli):
    require_local_sandbox()
    root = tmp_path / "set"
    verifier, test_sh = TASKS["keyed"]
    write_task(root, "separate", verifier + 'environment_mode = "separate"\n', test_sh)
    (root / "separate" / "tests" / "Dockerfile").write_text("FROM python:3.12-slim\n")
    result = run_cli("tasks", "check", str(root), "--solve", "--json")
    assert result.returncode == 2, result
    [problem] = result.json()["problems"]
    assert problem["task"] == "separate"
    assert problem["field"] == "[verifier].environment_mode"
    dockerfile = (root / "separate" / "tests" / "Dockerfile").resolve()
    assert problem["message"] == (
        f"asks for a separate verifier environment (its image built from {dockerfile}), which"
        " this task source does not support: it runs tests/test.sh in the agent's sandbox only"
        " (environment_mode = 'shared'); remove the setting and install what the verifier"
        " needs in environment/Dockerfile"
    )
