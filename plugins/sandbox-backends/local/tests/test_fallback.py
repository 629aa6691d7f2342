"""Fallback mode: said loudly, and what it does with paths, processes and users."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import msgspec
import pytest
from rllm_core.errors import SandboxCommandTimeout, SandboxCreateError
from rllm_core.testing.suites.sandboxes import run_with_deadline
from rllm_core.types import SandboxSpec
from rllm_sandbox_backend_local.backend import LocalBackend
from rllm_sandbox_backend_local.plugin import LocalSandboxConfig


def run(coro):  # type: ignore[no-untyped-def]
    return run_with_deadline(coro, 60)


def test_auto_falls_back_with_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    missing = str(tmp_path / "no-bwrap")
    backend = LocalBackend(
        LocalSandboxConfig(isolation="auto", bwrap=missing, root_dir=tmp_path / "roots")
    )
    spec = SandboxSpec(workdir=str(tmp_path / "work"))

    async def body() -> None:
        with caplog.at_level(logging.WARNING, logger="rllm_sandbox_backend_local"):
            first = await backend.create(spec)
            second = await backend.create(spec)
        assert (first.isolation, second.isolation, backend.isolation) == ("none",) * 3
        assert (
            backend.fallback_reason == f"the bubblewrap program {missing!r} was not found on PATH"
        )
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, "the fallback must be announced once per backend"
        message = warnings[0].getMessage()
        assert "NOT isolated" in message
        assert missing in message
        assert "apt-get install bubblewrap" in message
        await backend.close()

    run(body())


def test_explicit_none_does_not_warn(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    backend = LocalBackend(LocalSandboxConfig(isolation="none", root_dir=tmp_path / "roots"))

    async def body() -> None:
        with caplog.at_level(logging.WARNING, logger="rllm_sandbox_backend_local"):
            sb = await backend.create(SandboxSpec(workdir=str(tmp_path / "work")))
        assert sb.isolation == "none"
        assert backend.fallback_reason == "isolation = 'none' is configured"
        assert caplog.records == []
        await backend.close()

    run(body())


def test_paths_outside_the_workdir_live_in_the_private_root(
    plain_backend: LocalBackend, tmp_path: Path
) -> None:
    workdir = tmp_path / "work"

    async def body() -> None:
        sb = await plain_backend.create(SandboxSpec(workdir=str(workdir)))
        await sb.write_file("/tests/rllm-fallback-probe.sh", b"echo hi")
        await sb.write_file("in-workdir.txt", b"w")
        assert not os.path.exists("/tests/rllm-fallback-probe.sh")
        private = Path(sb.private_root)
        assert (private / "tests" / "rllm-fallback-probe.sh").read_bytes() == b"echo hi"
        assert (workdir / "in-workdir.txt").read_bytes() == b"w"
        assert await sb.read_file("/tests/rllm-fallback-probe.sh") == b"echo hi"
        r = await sb.exec('printf %s "$HOME"; pwd -P', timeout=10)
        assert r.stdout == f"{workdir}{workdir}\n"
        await sb.close()
        assert not private.exists(), "close left the private root behind"
        assert (workdir / "in-workdir.txt").exists(), "the workdir is the caller's directory"

    run(body())


def test_timeout_and_close_leave_no_process(
    plain_backend: LocalBackend, tmp_path: Path, host_processes_with
) -> None:
    async def body() -> None:
        sb = await plain_backend.create(SandboxSpec(workdir=str(tmp_path / "work")))
        with pytest.raises(SandboxCommandTimeout):
            await sb.exec("(sleep 319.5 & sleep 319.5) & sleep 319.5", timeout=1.0)
        assert host_processes_with("sleep 319.5") == []
        await sb.exec("sleep 320.5 >/dev/null 2>&1 &", timeout=10)
        # The shell returns once it has forked the background job, which may not have
        # become `sleep` yet on a loaded machine.
        deadline = time.monotonic() + 3
        while not host_processes_with("sleep 320.5") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(host_processes_with("sleep 320.5")) == 1
        await sb.close()
        deadline = time.monotonic() + 3
        while host_processes_with("sleep 320.5") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host_processes_with("sleep 320.5") == []

    run(body())


def test_rlimits_apply_without_bubblewrap(plain_backend: LocalBackend, tmp_path: Path) -> None:
    spec = SandboxSpec(workdir=str(tmp_path / "work"), memory_mb=512, disk_mb=2)

    async def body() -> None:
        async with await plain_backend.create(spec) as sb:
            r = await sb.exec("ulimit -v; ulimit -f", timeout=10)
            assert r.stdout.split() == [str(512 * 1024), "2048"]

    run(body())


@pytest.mark.skipif(os.geteuid() == 0, reason="root can switch users without namespaces")
def test_other_users_need_root(plain_backend: LocalBackend, tmp_path: Path) -> None:
    spec = msgspec.structs.replace(SandboxSpec(workdir=str(tmp_path / "w")), user="root")

    async def body() -> None:
        with pytest.raises(SandboxCreateError, match="not root"):
            await plain_backend.create(spec)

    run(body())
