"""Preparing sandboxes, running solutions and verifiers against a sandbox with private paths.

Every verifier case of the contract: the reward files in order, each bad reward file, a
timeout, a crash, stale rewards left by the agent, the upload of tests/ and the user, env,
cwd and timeout each command runs with.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from rllm_core.errors import (
    RewardFileInvalid,
    RewardFileMissing,
    TaskFormatError,
    TaskSetupError,
    TaskSetupTimeout,
    VerifierCrashed,
    VerifierError,
    VerifierTimeout,
)
from rllm_core.types import Grade, Task
from rllm_task_source_harbor.prepare import prepare_sandbox
from rllm_task_source_harbor.reader import load_task
from rllm_task_source_harbor.solution import run_solution
from rllm_task_source_harbor.verifier import run_verifier
from task_sandbox import GOOD_TOML, RootedBackend, RootedSandbox, write_task

LOGS = '"$SANDBOX_ROOT/logs/verifier"'
TMP_LOGS = '"$SANDBOX_ROOT/tmp/rllm/logs/verifier"'
TMP_JSON = '"$SANDBOX_ROOT/tmp/rllm/reward.json"'


def run(coro):
    return asyncio.run(coro)


async def in_sandbox(tmp_path: Path, task: Task, body):
    backend = RootedBackend(tmp_path / "sandboxes")
    async with await backend.create(task.environment) as sandbox:
        return await body(sandbox)


def verify(tmp_path: Path, test_sh: str, *, toml: str = GOOD_TOML, before: str | None = None):
    """Load a task with ``test_sh``, optionally run ``before`` as the agent, and verify."""
    task = load_task(write_task(tmp_path / "tasks", "t", toml=toml, test_sh=test_sh))

    async def body(sandbox: RootedSandbox):
        await prepare_sandbox(task, sandbox)
        if before is not None:
            result = await sandbox.exec(before, timeout=10)
            assert result.exit_code == 0, result
        return await run_verifier(task, sandbox)

    return run(in_sandbox(tmp_path, task, body))


# ---------------------------------------------------------------- reward files


def test_reward_txt(tmp_path):
    assert verify(tmp_path, f"mkdir -p {LOGS}; echo 0.5 > {LOGS}/reward.txt\n") == Grade(reward=0.5)


def test_reward_json_beats_reward_txt_and_gives_signals(tmp_path):
    script = (
        f"mkdir -p {LOGS}; echo 0 > {LOGS}/reward.txt\n"
        f"""echo '{{"reward": 1, "passed": 4}}' > {LOGS}/reward.json\n"""
    )
    assert verify(tmp_path, script) == Grade(reward=1.0, signals={"passed": 4.0})


def test_rewards_json_is_read_as_named_rewards_and_beats_reward_txt(tmp_path):
    script = (
        f"mkdir -p {LOGS}; echo 0 > {LOGS}/reward.txt\n"
        f"""echo '{{"correctness": 1, "style": 0.5}}' > {LOGS}/rewards.json\n"""
    )
    assert verify(tmp_path, script) == Grade(
        reward=0.75, signals={"correctness": 1.0, "style": 0.5}
    )


def test_reward_json_beats_rewards_json(tmp_path):
    script = (
        f"""mkdir -p {LOGS}; echo '{{"reward": 0.25}}' > {LOGS}/rewards.json\n"""
        f"""echo '{{"reward": 1}}' > {LOGS}/reward.json\n"""
    )
    assert verify(tmp_path, script) == Grade(reward=1.0)


def test_a_bad_rewards_json_is_invalid_naming_it(tmp_path):
    script = f"echo 1 > {LOGS}/reward.txt; echo '{{oops' > {LOGS}/rewards.json\n"
    with pytest.raises(RewardFileInvalid, match=r"rewards\.json is not valid JSON") as info:
        verify(tmp_path, script)
    assert info.value.path == "/logs/verifier/rewards.json"


def test_tmp_rllm_fallback_json_then_txt(tmp_path):
    script = (
        f"mkdir -p {TMP_LOGS}; echo 0.25 > {TMP_LOGS}/reward.txt\n"
        f"""echo '{{"reward": 0.5}}' > {TMP_LOGS}/reward.json\n"""
    )
    assert verify(tmp_path, script) == Grade(reward=0.5)
    assert verify(tmp_path / "2", f"mkdir -p {TMP_LOGS}; echo 0.25 > {TMP_LOGS}/reward.txt\n") == (
        Grade(reward=0.25)
    )


def test_logs_verifier_beats_tmp_rllm(tmp_path):
    script = (
        f"mkdir -p {TMP_LOGS} {LOGS}; echo 0.25 > {TMP_LOGS}/reward.txt\n"
        f"echo 0.75 > {LOGS}/reward.txt\n"
    )
    assert verify(tmp_path, script) == Grade(reward=0.75)


def test_tmp_rllm_reward_json_is_the_last_resort(tmp_path):
    fallback = f"""mkdir -p "$SANDBOX_ROOT/tmp/rllm"; echo '{{"reward": 0.5}}' > {TMP_JSON}\n"""
    assert verify(tmp_path, fallback) == Grade(reward=0.5)
    beaten = fallback + f"mkdir -p {TMP_LOGS}; echo 0.25 > {TMP_LOGS}/reward.txt\n"
    assert verify(tmp_path / "2", beaten) == Grade(reward=0.25)


def test_failing_tests_with_a_reward_file_give_that_reward(tmp_path):
    assert verify(tmp_path, f"echo 0 > {LOGS}/reward.txt; exit 3\n") == Grade(reward=0.0)


def test_missing_reward_file_after_exit_0(tmp_path):
    with pytest.raises(RewardFileMissing) as info:
        verify(tmp_path, "echo all good\n")
    assert info.value.task_id == "t"
    assert info.value.searched == [
        "/logs/verifier/reward.json",
        "/logs/verifier/rewards.json",
        "/logs/verifier/reward.txt",
        "/tmp/rllm/logs/verifier/reward.json",
        "/tmp/rllm/logs/verifier/rewards.json",
        "/tmp/rllm/logs/verifier/reward.txt",
        "/tmp/rllm/reward.json",
    ]
    assert "task t: tests/test.sh exited 0 but wrote none of" in str(info.value)


@pytest.mark.parametrize(
    ("write", "reason"),
    [
        (f": > {LOGS}/reward.txt", "reward.txt is empty"),
        (f"echo yes > {LOGS}/reward.txt", "must hold one number, got 'yes'"),
        (f"echo nan > {LOGS}/reward.txt", "non-finite"),
        (f"echo '{{}}' > {LOGS}/reward.json", "holds no numeric reward"),
        (f"echo '{{oops' > {LOGS}/reward.json", "is not valid JSON"),
    ],
)
def test_bad_reward_file_is_invalid_not_zero(tmp_path, write, reason):
    with pytest.raises(RewardFileInvalid) as info:
        verify(tmp_path, write + "\n")
    assert reason in str(info.value)
    assert info.value.path.startswith("/logs/verifier/reward.")


def test_invalid_json_does_not_fall_back_to_txt(tmp_path):
    script = f"echo 1 > {LOGS}/reward.txt; echo '[]' > {LOGS}/reward.json\n"
    with pytest.raises(RewardFileInvalid, match=r"reward\.json must hold a JSON object"):
        verify(tmp_path, script)


def test_crash_without_reward_file(tmp_path):
    with pytest.raises(VerifierCrashed) as info:
        verify(tmp_path, "echo starting\necho 'boom: no such thing' >&2\nexit 7\n")
    error = info.value
    assert error.exit_code == 7
    assert error.output == "starting\nboom: no such thing"
    assert "task t: tests/test.sh exited 7 without writing a reward file" in str(error)
    assert "boom: no such thing" in str(error)


def test_crash_output_is_only_the_tail(tmp_path):
    with pytest.raises(VerifierCrashed) as info:
        verify(tmp_path, "i=0; while [ $i -lt 3000 ]; do echo line$i; i=$((i+1)); done; exit 1\n")
    assert len(info.value.output) == 2000
    assert info.value.output.endswith("line2999")


def test_timeout(tmp_path):
    toml = "[verifier]\ntimeout_sec = 0.5\n"
    with pytest.raises(VerifierTimeout) as info:
        verify(tmp_path, f"sleep 30; echo 1 > {LOGS}/reward.txt\n", toml=toml)
    assert info.value.timeout_s == 0.5
    assert "ran past the 0.5 s verifier timeout" in str(info.value)


def test_every_verifier_error_is_a_verifier_error():
    for error in (RewardFileMissing, RewardFileInvalid, VerifierTimeout, VerifierCrashed):
        assert issubclass(error, VerifierError)


def test_stale_reward_written_by_the_agent_is_removed(tmp_path):
    agent = (
        f"mkdir -p {LOGS} {TMP_LOGS}; echo 1 > {LOGS}/reward.txt; echo 1 > {TMP_LOGS}/reward.txt;"
        f""" echo '{{"reward": 1}}' > {TMP_JSON}"""
    )
    with pytest.raises(RewardFileMissing):
        verify(tmp_path, "true\n", before=agent)


def test_files_the_agent_put_in_tests_are_removed(tmp_path):
    agent = 'mkdir -p "$SANDBOX_ROOT/tests"; echo planted > "$SANDBOX_ROOT/tests/extra.txt"'
    script = (
        'if [ -e "$SANDBOX_ROOT/tests/extra.txt" ]; then r=0; else r=1; fi\n'
        f"echo $r > {LOGS}/reward.txt\n"
    )
    assert verify(tmp_path, script, before=agent) == Grade(reward=1.0)


# ---------------------------------------------------------------- how commands run


def test_tests_are_uploaded_byte_exact_with_exec_bits(tmp_path):
    blob = bytes(range(256)) * 9000
    task_dir = write_task(
        tmp_path / "tasks",
        "t",
        test_sh=f'"$SANDBOX_ROOT/tests/helper.sh" && echo 1 > {LOGS}/reward.txt\n',
        extra={"tests/helper.sh": "#!/bin/sh\nexit 0\n"},
    )
    (task_dir / "tests" / "data").mkdir()
    (task_dir / "tests" / "data" / "blob.bin").write_bytes(blob)
    os.chmod(task_dir / "tests" / "helper.sh", 0o755)
    task = load_task(task_dir)

    async def body(sandbox: RootedSandbox):
        grade = await run_verifier(task, sandbox)
        copied = await sandbox.read_file("/tests/data/blob.bin")
        mode = os.stat(sandbox.host_path("/tests/helper.sh")).st_mode
        return grade, copied, mode

    grade, copied, mode = run(in_sandbox(tmp_path, task, body))
    assert grade == Grade(reward=1.0)
    assert copied == blob
    assert mode & 0o111


def test_verifier_runs_as_its_user_with_env_timeout_and_cwd(tmp_path):
    toml = (
        "[verifier]\ntimeout_sec = 12\nuser = 'checker'\nenv = { STRICT = '1' }\n"
        "[environment]\nworkdir = '/workspace'\n"
    )
    script = (
        '[ "$STRICT" = 1 ] && [ "$(pwd)" = "$SANDBOX_ROOT/workspace" ]'
        f" && echo 1 > {LOGS}/reward.txt\n"
    )
    task = load_task(write_task(tmp_path / "tasks", "t", toml=toml, test_sh=script))

    async def body(sandbox: RootedSandbox):
        return await run_verifier(task, sandbox), sandbox.calls

    grade, calls = run(in_sandbox(tmp_path, task, body))
    assert grade == Grade(reward=1.0)
    assert calls[-1] == ("bash /tests/test.sh", 12.0, "checker", {"STRICT": "1"}, "/workspace")


def test_prepare_creates_workdir_and_replays_steps_in_order(tmp_path):
    dockerfile = (
        "FROM debian:bookworm-slim\n"
        'RUN mkdir -p "$SANDBOX_ROOT/app" && echo first > "$SANDBOX_ROOT/app/log"\n'
        "WORKDIR /app\n"
        "COPY x /app/x\n"
        "RUN cat x >> log && echo second >> log && \\\n    pwd > where\n"
        "ENV GREETING=hello\n"
        'RUN ["sh", "-c", "echo $GREETING >> log"]\n'
    )
    task_dir = write_task(
        tmp_path / "tasks", "t", dockerfile=dockerfile, extra={"environment/x": "copied\n"}
    )
    task = load_task(task_dir)

    async def body(sandbox: RootedSandbox):
        await prepare_sandbox(task, sandbox)
        return (
            await sandbox.read_file("/app/log"),
            await sandbox.read_file("/app/where"),
            sandbox.root,
            sandbox.calls,
        )

    log, where, root, calls = run(in_sandbox(tmp_path, task, body))
    assert log == b"first\ncopied\nsecond\nhello\n"
    assert where.decode().strip() == f"{root}/app"
    runs = [step["run"] for step in task.data["setup_steps"] if "run" in step]
    assert (
        [c[0] for c in calls]
        == [
            "mkdir -p /app",
            runs[0],
            "test -d /app/x",  # a file copied to a path without '/' lands inside a directory
            *runs[1:],
        ]
    )
    assert calls[0] == ("mkdir -p /app", 60.0, None, None, "/")
    assert all(c[2] is None for c in calls)


def test_copy_places_files_as_docker_does(tmp_path):
    dockerfile = (
        'FROM x\nWORKDIR /app\nRUN mkdir -p "$SANDBOX_ROOT/app/existing"\n'
        "COPY tool.sh existing\nCOPY src lib/\nCOPY a.txt b.txt /workspace/in/\n"
        "COPY a.txt renamed.txt\n"
    )
    extra = {
        "environment/tool.sh": "#!/bin/sh\necho tool\n",
        "environment/src/m.py": "x = 1\n",
        "environment/src/pkg/__init__.py": "",
        "environment/a.txt": "A",
        "environment/b.txt": "B",
    }
    task_dir = write_task(tmp_path / "tasks", "t", dockerfile=dockerfile, extra=extra)
    (task_dir / "environment" / "tool.sh").chmod(0o755)
    (task_dir / "environment" / "src" / "empty").mkdir()
    task = load_task(task_dir)

    async def body(sandbox: RootedSandbox):
        await prepare_sandbox(task, sandbox)
        tool = await sandbox.exec("./existing/tool.sh", timeout=10)
        found = await sandbox.exec(
            'cd "$SANDBOX_ROOT" && find app workspace | sort', timeout=10, cwd="/"
        )
        return tool, found.stdout.split()

    tool, found = run(in_sandbox(tmp_path, task, body))
    assert (tool.exit_code, tool.stdout) == (0, "tool\n")
    assert found == [
        "app",
        "app/existing",
        "app/existing/tool.sh",
        "app/lib",
        "app/lib/empty",
        "app/lib/m.py",
        "app/lib/pkg",
        "app/lib/pkg/__init__.py",
        "app/renamed.txt",
        "workspace",
        "workspace/in",
        "workspace/in/a.txt",
        "workspace/in/b.txt",
    ]


def test_a_context_file_gone_since_reading_is_a_setup_error(tmp_path):
    task_dir = write_task(
        tmp_path / "tasks",
        "t",
        dockerfile="FROM x\nCOPY a.txt /app/\n",
        extra={"environment/a.txt": "A"},
    )
    task = load_task(task_dir)
    (task_dir / "environment" / "a.txt").unlink()
    with pytest.raises(TaskSetupError, match=r"task t: Dockerfile line 2: COPY a.txt /app cannot"):
        run(in_sandbox(tmp_path, task, lambda sb: prepare_sandbox(task, sb)))


def test_failing_setup_step_is_a_setup_error(tmp_path):
    dockerfile = "FROM x\nRUN echo ok\nRUN echo 'no apt here' >&2; exit 100\nRUN echo never\n"
    task = load_task(write_task(tmp_path / "tasks", "t", dockerfile=dockerfile))
    with pytest.raises(TaskSetupError) as info:
        run(in_sandbox(tmp_path, task, lambda sb: prepare_sandbox(task, sb)))
    error = info.value
    assert (error.task_id, error.exit_code, error.output) == ("t", 100, "no apt here")
    assert "task t: setup step 2/3 exited 100" in str(error)


def test_setup_past_the_build_timeout_is_a_setup_error(tmp_path):
    toml = "[environment]\nbuild_timeout_sec = 0.5\n"
    dockerfile = "FROM x\nRUN sleep 20\n"
    task = load_task(write_task(tmp_path / "tasks", "t", toml=toml, dockerfile=dockerfile))
    with pytest.raises(TaskSetupTimeout, match=r"setup step 1/1 ran past the 0.5 s build timeout"):
        run(in_sandbox(tmp_path, task, lambda sb: prepare_sandbox(task, sb)))


def test_solution_then_verifier_and_noop(tmp_path):
    task = load_task(write_task(tmp_path / "tasks", "t"))

    async def solved(sandbox: RootedSandbox):
        await prepare_sandbox(task, sandbox)
        result = await run_solution(task, sandbox)
        return result, await run_verifier(task, sandbox), sandbox.calls

    async def noop(sandbox: RootedSandbox):
        await prepare_sandbox(task, sandbox)
        return await run_verifier(task, sandbox)

    result, grade, calls = run(in_sandbox(tmp_path / "a", task, solved))
    assert result.exit_code == 0
    assert grade == Grade(reward=1.0)
    assert ("bash /solution/solve.sh", 30.0, None, None, "/app") in calls
    assert run(in_sandbox(tmp_path / "b", task, noop)) == Grade(reward=0.0)


def test_solution_runs_as_the_agent_user_with_solution_env(tmp_path):
    toml = "[agent]\ntimeout_sec = 9\nuser = 'agent'\n[solution]\nenv = { HINT = 'x' }\n"
    task = load_task(write_task(tmp_path / "tasks", "t", toml=toml))

    async def body(sandbox: RootedSandbox):
        await run_solution(task, sandbox)
        return sandbox.calls[-1]

    assert run(in_sandbox(tmp_path, task, body)) == (
        "bash /solution/solve.sh",
        9.0,
        "agent",
        {"HINT": "x"},
        "/app",
    )


def test_solution_exit_code_is_returned(tmp_path):
    task = load_task(write_task(tmp_path / "tasks", "t", solve_sh="echo half; exit 4\n"))
    result = run(in_sandbox(tmp_path, task, lambda sb: run_solution(task, sb)))
    assert (result.exit_code, result.stdout) == (4, "half\n")


def test_missing_solution_is_a_format_error(tmp_path):
    task = load_task(write_task(tmp_path / "tasks", "t", solve_sh=None))
    with pytest.raises(TaskFormatError, match=r"t: solution/solve.sh: missing"):
        run(in_sandbox(tmp_path, task, lambda sb: run_solution(task, sb)))
