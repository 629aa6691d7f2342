"""The remote-exec wrapper run by a real local ``sh``: exit codes, output, caps, users, env,
and a timeout's kill, read back with parse_report as the sandbox backends do; and the choice
between running a wrapped script inline and uploading a long one."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from rllm_core.errors import SandboxError
from rllm_core.kit.remote_exec import (
    MAX_INLINE_SCRIPT,
    kill_script,
    launcher,
    parse_report,
    run_script_file,
    runnable,
    script_path,
    wrap,
)


def call_id() -> str:
    return uuid.uuid4().hex


def run(
    command: str,
    tmp_path: Path,
    *,
    merge: bool = False,
    limit: int = 1 << 16,
    login: bool = False,
    host_env: dict[str, str] | None = None,
    **kw,
):
    wrapped = wrap(
        command,
        call_id=call_id(),
        cwd=kw.pop("cwd", str(tmp_path)),
        env=kw.pop("env", {}),
        user=kw.pop("user", None),
        output_limit_bytes=limit,
        merge_output=merge,
        login_bash=login,
        root=str(tmp_path / "exec"),
    )
    done = subprocess.run(
        ["sh", "-c", wrapped.script],
        capture_output=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
        env=host_env,
    )
    report = parse_report(done.stdout.decode(), wrapped.marker)
    assert report is not None, done.stdout + done.stderr
    assert done.returncode == report.exit_code
    assert not (tmp_path / "exec" / wrapped.call_id).exists(), "the call directory is removed"
    return report


def test_exit_code_and_separate_streams(tmp_path):
    report = run("echo out; echo err >&2; printf 'no newline'; exit 7", tmp_path)
    assert report.exit_code == 7
    assert report.stdout == b"out\nno newline" and report.stderr == b"err\n"
    assert report.truncated is False


def test_merged_output_keeps_the_order(tmp_path):
    report = run("echo one; echo two >&2; echo three", tmp_path, merge=True)
    assert report.stdout == b"one\ntwo\nthree\n" and report.stderr == b""


def test_output_is_capped_in_the_sandbox(tmp_path):
    report = run("head -c 100000 /dev/zero | tr '\\0' a; echo small >&2", tmp_path, limit=1000)
    assert report.stdout == b"a" * 1000 and report.stderr == b"small\n"
    assert report.truncated is True
    assert run("printf 12345", tmp_path, limit=5).truncated is False


def test_env_cwd_and_quoting(tmp_path):
    (tmp_path / "sub dir").mkdir()
    report = run(
        'echo "$A|$B" && pwd',
        tmp_path,
        env={"A": "it's", "B": "$HOME `x`"},
        cwd=str(tmp_path / "sub dir"),
    )
    assert report.stdout == f"it's|$HOME `x`\n{tmp_path}/sub dir\n".encode()
    missing = run("echo never", tmp_path, cwd=str(tmp_path / "missing"))
    assert missing.exit_code == 1 and missing.stdout == b"" and b"missing" in missing.stderr


def test_a_signal_is_reported_as_128_plus_its_number(tmp_path):
    assert run("kill -TERM $$", tmp_path).exit_code == 143


def test_login_bash_runs_the_profile_first_and_keeps_env_and_cwd(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "work").mkdir()
    # A profile that resets PATH and changes directory, as some images' profiles do.
    (home / ".bash_profile").write_text("export FROM_PROFILE=yes\nexport PATH=/nowhere\ncd /\n")
    host_env = {"HOME": str(home), "PATH": os.environ["PATH"]}
    command = 'words=(a b); [[ ${#words[@]} == 2 ]] && echo "$FROM_PROFILE|$PATH|$(pwd)"'
    report = run(
        command,
        tmp_path,
        login=True,
        host_env=host_env,
        env={"PATH": "/task/bin:/usr/bin:/bin"},
        cwd=str(tmp_path / "work"),
    )
    assert report.exit_code == 0, report.stderr
    assert report.stdout == f"yes|/task/bin:/usr/bin:/bin|{tmp_path}/work\n".encode()
    assert run("kill -TERM $$", tmp_path, login=True).exit_code == 143


def test_a_long_script_runs_from_an_uploaded_file(tmp_path):
    root = str(tmp_path / "exec")
    cid = call_id()
    wrapped = wrap(
        "echo " + "x" * 200_000 + " | wc -c",
        call_id=cid,
        cwd=str(tmp_path),
        env={},
        user=None,
        output_limit_bytes=100,
        root=root,
    )
    path = Path(script_path(cid, root=root))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(wrapped.script)
    done = subprocess.run(["sh", "-c", run_script_file(str(path))], capture_output=True, timeout=30)
    report = parse_report(done.stdout.decode(), wrapped.marker)
    assert report is not None and report.stdout == b"200001\n"
    assert done.returncode == 0 and not path.exists(), "the uploaded script is removed"


def test_the_launcher_runs_the_script_through_a_shell_string(tmp_path):
    wrapped = wrap(
        "echo via launcher",
        call_id=call_id(),
        cwd=str(tmp_path),
        env={},
        user=None,
        output_limit_bytes=100,
        root=str(tmp_path / "exec"),
    )
    done = subprocess.run(launcher(wrapped.script), shell=True, capture_output=True, timeout=30)
    report = parse_report(done.stdout.decode(), wrapped.marker)
    assert report is not None and report.stdout == b"via launcher\n"


def test_a_timeout_kill_takes_the_whole_process_group(tmp_path):
    cid = call_id()
    root = str(tmp_path / "exec")
    command = f"sleep 60 & echo $! > {tmp_path}/child.pid; sleep 60"
    wrapped = wrap(
        command,
        call_id=cid,
        cwd=str(tmp_path),
        env={},
        user=None,
        output_limit_bytes=100,
        root=root,
    )
    proc = subprocess.Popen(["sh", "-c", wrapped.script], stdout=subprocess.PIPE)
    try:
        pid_file = tmp_path / "child.pid"
        deadline = time.monotonic() + 10
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.05)
        child = int(pid_file.read_text())
        subprocess.run(["sh", "-c", kill_script(cid, root=root)], check=True, timeout=30)
        out, _ = proc.communicate(timeout=10)
    finally:
        proc.kill()
    report = parse_report(out.decode(), wrapped.marker)
    assert report is not None and report.exit_code == 137
    assert not alive(child), f"process {child} outlived the kill"


def alive(pid: int) -> bool:
    """Whether ``pid`` runs; a killed process may stay a zombie until its parent reaps it."""
    for _ in range(50):
        try:
            os.kill(pid, 0)
            if "\nState:\tZ" in Path(f"/proc/{pid}/status").read_text():
                return False
        except (ProcessLookupError, FileNotFoundError):
            return False
        time.sleep(0.05)
    return True


def test_a_kill_before_the_start_keeps_the_command_from_running(tmp_path):
    cid = call_id()
    root = tmp_path / "exec"
    (root / cid).mkdir(parents=True)
    subprocess.run(["sh", "-c", kill_script(cid, root=str(root))], check=True, timeout=30)
    assert (root / cid / "killed").exists()


def test_bad_input_is_refused_and_a_missing_report_is_none(tmp_path):
    with pytest.raises(SandboxError, match="NUL"):
        wrap("a\0b", call_id="c1", cwd="/", env={}, user=None, output_limit_bytes=1)
    with pytest.raises(SandboxError, match=r"cannot run 'true': .*'1X'"):
        wrap("true", call_id="c1", cwd="/", env={"1X": ""}, user=None, output_limit_bytes=1)
    with pytest.raises(SandboxError, match="'bad user'"):
        wrap("true", call_id="c1", cwd="/", env={}, user="bad user", output_limit_bytes=1)
    with pytest.raises(ValueError, match="call id 'Up'"):
        kill_script("Up")
    assert parse_report("no report here", "@@rllm-x@@") is None


class Uploads:
    """Records each ``upload(path, data)`` a backend would make."""

    def __init__(self) -> None:
        self.files: list[tuple[str, bytes]] = []

    async def __call__(self, path: str, data: bytes) -> None:
        self.files.append((path, data))


def runnable_command(script: str, call_id: str, uploads: Uploads, **kw) -> str:
    return asyncio.run(runnable(script, call_id, uploads, **kw))


def test_a_script_that_fits_runs_inline_without_an_upload():
    uploads = Uploads()
    assert runnable_command("echo hi", "c1", uploads) == "echo hi"
    assert runnable_command("echo hi", "c1", uploads, inline=launcher) == launcher("echo hi")
    edge = "x" * MAX_INLINE_SCRIPT
    assert runnable_command(edge, "c1", uploads) == edge
    assert uploads.files == []


def test_a_script_too_long_to_inline_is_uploaded_and_run_from_its_file():
    uploads = Uploads()
    script = "é" + "x" * MAX_INLINE_SCRIPT
    command = runnable_command(script, "c2", uploads)
    assert uploads.files == [(script_path("c2"), script.encode("utf-8"))]
    assert command == run_script_file(script_path("c2"))


def test_the_limit_applies_to_the_inline_command_not_the_script():
    uploads = Uploads()
    # base64 makes the launcher's command about 4/3 of the script.
    script = "x" * (MAX_INLINE_SCRIPT * 9 // 10)
    assert runnable_command(script, "c3", uploads) == script
    assert runnable_command(script, "c3", uploads, inline=launcher) == run_script_file(
        script_path("c3")
    )
    assert [path for path, _ in uploads.files] == [script_path("c3")]


def test_a_long_script_of_a_bad_call_id_is_refused_before_the_upload():
    uploads = Uploads()
    with pytest.raises(ValueError, match="call id 'Bad'"):
        runnable_command("x" * (MAX_INLINE_SCRIPT + 1), "Bad", uploads)
    assert uploads.files == []
