"""The sandbox conformance suite passes a correct backend and catches broken ones."""

from __future__ import annotations

import asyncio
import contextlib
import os
import posixpath
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rllm_core.errors import SandboxCommandTimeout, SandboxFileNotFound, SandboxGone
from rllm_core.testing.suites.sandboxes import (
    SandboxConformance,
    expect_sandbox_error,
    run_with_deadline,
)
from rllm_core.types import ExecResult, SandboxSpec

sys.path.insert(0, str(Path(__file__).parent))

from reference.subprocess_sandbox import (
    SubprocessBackend,
    SubprocessSandbox,
)

LIMIT = 1 << 20


class TestSubprocessSandbox(SandboxConformance):
    output_limit_bytes = LIMIT
    sessions_escape_end_processes = True

    def verifier_root(self, spec: SandboxSpec) -> str:
        return posixpath.join(spec.workdir, "root")

    @pytest.fixture
    def sandbox_backend(self) -> SubprocessBackend:
        return SubprocessBackend(output_limit_bytes=LIMIT)


# -------------------------------------------------------------------- the reference itself


def test_reference_reports_duration_and_keeps_output_head(tmp_path: Path) -> None:
    async def body() -> None:
        backend = SubprocessBackend(output_limit_bytes=10)
        async with await backend.create(SandboxSpec(workdir=str(tmp_path))) as sb:
            r = await sb.exec("printf 0123456789abcdef; sleep 0.2", timeout=10)
            assert (r.stdout, r.truncated) == ("0123456789", True)
            assert 0.2 <= r.duration_s < 5
            r = await sb.exec("printf 0123456789", timeout=10)
            assert (r.stdout, r.truncated) == ("0123456789", False)

    run_with_deadline(body(), 30)


def test_reference_create_rejects_images(tmp_path: Path) -> None:
    from rllm_core.errors import SandboxCreateError

    async def body() -> None:
        spec = SandboxSpec(workdir=str(tmp_path), image="ubuntu:24.04")
        err = await expect_sandbox_error(SubprocessBackend().create(spec), SandboxCreateError, "c")
        assert "ubuntu:24.04" in str(err)

    run_with_deadline(body(), 30)


def test_expect_sandbox_error_names_foreign_exceptions() -> None:
    async def raises_os_error() -> None:
        raise FileNotFoundError("/x")

    async def returns() -> int:
        return 3

    with pytest.raises(AssertionError, match=r"FileNotFoundError, which is not a SandboxError"):
        asyncio.run(expect_sandbox_error(raises_os_error(), SandboxFileNotFound, "read_file"))
    with pytest.raises(AssertionError, match="returned 3 instead of raising SandboxGone"):
        asyncio.run(expect_sandbox_error(returns(), SandboxGone, "exec"))


def test_run_with_deadline_fails_a_hang() -> None:
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"did not finish within 0\.2 s"):
        run_with_deadline(asyncio.sleep(30), 0.2)
    assert time.monotonic() - started < 5


# -------------------------------------------------------------------- broken backends


class LeavesChildOnTimeout(SubprocessSandbox):
    """Kills only the shell on timeout; the background child keeps running."""

    def _kill_tree(self, pgid: int) -> None:
        os.kill(pgid, signal.SIGKILL)


class ReturnsOnTimeout(SubprocessSandbox):
    """Kills the command but reports a result instead of raising."""

    async def exec(self, command, timeout, user=None, env=None, cwd=None):
        try:
            return await super().exec(command, timeout, user, env, cwd)
        except SandboxCommandTimeout:
            return ExecResult(exit_code=137, stdout="", stderr="")


class RaisesRawErrors(SubprocessSandbox):
    """Lets the operating system's exceptions escape."""

    async def read_file(self, path: str) -> bytes:
        self._check_open("read_file")
        return Path(self._path(path)).read_bytes()


class RawSignalCodes(SubprocessSandbox):
    """Reports death by signal n as -n, the way ``Popen.returncode`` does."""

    async def exec(self, command, timeout, user=None, env=None, cwd=None):
        r = await super().exec(command, timeout, user, env, cwd)
        code = 128 - r.exit_code if 128 < r.exit_code < 160 else r.exit_code
        return ExecResult(exit_code=code, stdout=r.stdout, stderr=r.stderr)


class IgnoresCwd(SubprocessSandbox):
    async def exec(self, command, timeout, user=None, env=None, cwd=None):
        return await super().exec(command, timeout, user, env, None)


class ReplacesEnv(SubprocessSandbox):
    async def exec(self, command, timeout, user=None, env=None, cwd=None):
        if env:
            saved, self._env = self._env, {}
            try:
                return await super().exec(command, timeout, user, env, cwd)
            finally:
                self._env = saved
        return await super().exec(command, timeout, user, env, cwd)


class StrictDecoding(SubprocessSandbox):
    """Fails on undecodable output the way ``bytes.decode()`` without ``errors=`` does."""

    async def exec(self, command, timeout, user=None, env=None, cwd=None):
        r = await super().exec(command, timeout, user, env, cwd)
        if "\ufffd" in r.stdout + r.stderr:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        return r


class KeepsProcessesOnClose(SubprocessSandbox):
    """Marks itself closed without killing what its commands left running."""

    async def close(self) -> None:
        self._closed = True
        self._backend.forget(self)


class ReadsStdoutBeforeStderr(SubprocessSandbox):
    """Reads stderr only once stdout is closed: output that fills stderr first never ends."""

    async def exec(self, command, timeout, user=None, env=None, cwd=None):
        self._check_open("exec")
        loop = asyncio.get_running_loop()
        transport, _protocol = await loop.subprocess_exec(
            asyncio.SubprocessProtocol,
            "/bin/sh",
            "-c",
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=self.workdir,
            start_new_session=True,
        )
        self._groups.add(transport.get_pid())
        transport.get_pipe_transport(2).pause_reading()
        try:
            await asyncio.sleep(timeout + 30)
        finally:
            self._kill_tree(transport.get_pid())
            for _ in range(200):
                if transport.get_returncode() is not None:
                    break
                await asyncio.sleep(0.01)
            transport.close()
        raise AssertionError("unreachable: the sleep above is cancelled first")


class KeepsAgentProcesses(SubprocessSandbox):
    """Ends nothing: what the agent left in the background runs beside its verifier."""

    async def end_processes(self) -> int:
        return 0


class EndsMarkedProcessesToo(SubprocessSandbox):
    """Ignores the mark: the environment's own services die with the agent's processes."""

    async def mark_processes(self) -> None:
        pass


class BrokenBackend(SubprocessBackend):
    def __init__(self, sandbox_class: type[SubprocessSandbox], **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.sandbox_class = sandbox_class
        self.created: list[SubprocessSandbox] = []

    async def create(self, spec: SandboxSpec) -> SubprocessSandbox:
        sandbox = await super().create(spec)
        self.created.append(sandbox)
        return sandbox

    def kill_leftovers(self) -> None:
        for sandbox in self.created:
            for pgid in sandbox._groups:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, signal.SIGKILL)


class Suite(SandboxConformance):
    output_limit_bytes = LIMIT
    deadline_s = 8.0

    def verifier_root(self, spec: SandboxSpec) -> str:
        return posixpath.join(spec.workdir, "root")


BROKEN = [
    (LeavesChildOnTimeout, "test_timeout_kills_the_process_tree", "still run"),
    (ReturnsOnTimeout, "test_timeout_kills_the_process_tree", "instead of raising"),
    (RaisesRawErrors, "test_missing_files_raise_file_not_found", "not a SandboxError"),
    (RaisesRawErrors, "test_every_failure_is_a_sandbox_error", "not a SandboxError"),
    (RawSignalCodes, "test_exit_codes", "expected 137"),
    (IgnoresCwd, "test_cwd", "dir with space"),
    (ReplacesEnv, "test_env", "added to the sandbox env"),
    (StrictDecoding, "test_unicode_and_undecodable_output", "not a SandboxError"),
    (KeepsProcessesOnClose, "test_no_process_survives_close", "still run"),
    (ReadsStdoutBeforeStderr, "test_output_limit_truncates_without_deadlock", "never hang"),
    (
        KeepsAgentProcesses,
        "test_an_honest_agent_is_rewarded_and_the_environment_survives",
        "left running the process the agent started",
    ),
    (
        EndsMarkedProcessesToo,
        "test_an_honest_agent_is_rewarded_and_the_environment_survives",
        "killed a process started before mark_processes",
    ),
]


@pytest.mark.parametrize(
    ("sandbox_class", "method", "message"), BROKEN, ids=lambda x: getattr(x, "__name__", None)
)
def test_suite_catches_broken_sandbox(
    sandbox_class: type[SubprocessSandbox], method: str, message: str, tmp_path: Path
) -> None:
    backend = BrokenBackend(sandbox_class, output_limit_bytes=LIMIT)
    spec = SandboxSpec(workdir=str(tmp_path / "workdir"))
    try:
        with pytest.raises(AssertionError, match=message):
            getattr(Suite(), method)(sandbox_backend=backend, sandbox_spec=spec)
    finally:
        backend.kill_leftovers()
        run_with_deadline(backend.close(), 30)


class KeepsSandboxesOnClose(SubprocessBackend):
    async def close(self) -> None:
        pass


def test_suite_catches_a_backend_close_that_releases_nothing(tmp_path: Path) -> None:
    backend = KeepsSandboxesOnClose()
    spec = SandboxSpec(workdir=str(tmp_path / "workdir"))
    with pytest.raises(AssertionError, match=r"backend\.close\(\) left a sandbox alive"):
        Suite().test_backend_close_releases_its_sandboxes(backend, spec)
    run_with_deadline(SubprocessBackend.close(backend), 30)


def test_suite_catches_missing_output_cap(tmp_path: Path) -> None:
    backend = BrokenBackend(SubprocessSandbox, output_limit_bytes=1 << 40)
    spec = SandboxSpec(workdir=str(tmp_path / "workdir"))
    try:
        with pytest.raises(AssertionError, match="were not truncated"):
            Suite().test_output_limit_truncates_without_deadlock(backend, spec)
    finally:
        run_with_deadline(backend.close(), 30)


def test_suite_requires_a_declared_output_limit(tmp_path: Path) -> None:
    backend = SubprocessBackend()
    with pytest.raises(AssertionError, match="must declare output_limit_bytes"):
        SandboxConformance().test_output_limit_truncates_without_deadlock(
            backend, SandboxSpec(workdir=str(tmp_path))
        )
