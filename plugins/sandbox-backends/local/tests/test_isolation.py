"""What bubblewrap isolation guarantees: private files, no host processes, no network."""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from rllm_core.errors import (
    SandboxCommandTimeout,
    SandboxCreateError,
    SandboxError,
    SandboxFileNotFound,
    SandboxGone,
)
from rllm_core.testing.suites.sandboxes import run_with_deadline
from rllm_core.types import NetworkPolicy, SandboxSpec
from rllm_sandbox_backend_local.backend import LocalBackend
from rllm_sandbox_backend_local.plugin import LocalSandboxConfig
from rllm_sandbox_backend_local.testing import bubblewrap_problem

PROBLEM = bubblewrap_problem("test the bubblewrap isolation")
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=PROBLEM or "")
SPEC = SandboxSpec(workdir="/app")


def run(coro):  # type: ignore[no-untyped-def]
    return run_with_deadline(coro, 60)


@pytest.fixture
def host_marker() -> Iterator[Path]:
    """A file in the host's real temporary directory that sandboxes must not see."""
    fd, name = tempfile.mkstemp(prefix="rllm-host-marker-", dir="/tmp")
    os.write(fd, b"host")
    os.close(fd)
    yield Path(name)
    os.unlink(name)


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP port on the host's loopback that accepts connections."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join()
    server.close()


def test_system_directories_and_host_files_are_out_of_reach(
    bwrap_backend: LocalBackend, host_marker: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("host file")

    async def body() -> None:
        async with await bwrap_backend.create(SPEC) as sb:
            assert sb.isolation == "bwrap"
            for target in ("/usr/rllm-probe", "/etc/passwd", "/bin/rllm-probe"):
                r = await sb.exec(f"echo x > {target}", timeout=10)
                assert r.exit_code != 0, f"the sandbox wrote {target}"
                assert "Read-only file system" in r.stderr, r.stderr
            r = await sb.exec("mount -o remount,rw /usr", timeout=10)
            assert r.exit_code != 0, "root inside the sandbox remounted /usr read-write"
            r = await sb.exec(f"cat {host_marker}; cat {outside}", timeout=10)
            assert (r.exit_code, r.stdout) == (1, ""), "the sandbox read a host file"
            r = await sb.exec(f"echo mine > {host_marker} && cat {host_marker}", timeout=10)
            assert r.stdout == "mine\n", "the sandbox's /tmp is its own"
            r = await sb.exec("echo w > /app/w.txt && echo t > /srv.txt && cat /app/w.txt", 10)
            assert r.stdout == "w\n"
        assert host_marker.read_text() == "host"
        assert outside.read_text() == "host file"
        assert not Path("/usr/rllm-probe").exists()
        assert not Path("/srv.txt").exists()

    run(body())


def test_host_processes_are_invisible(bwrap_backend: LocalBackend) -> None:
    async def body() -> None:
        async with await bwrap_backend.create(SPEC) as sb:
            r = await sb.exec(
                "for p in /proc/[0-9]*; do cat $p/comm; done | sort -u | tr '\\n' ' '", 10
            )
            assert set(r.stdout.split()) <= {"bwrap", "sleep", "bash", "sh", "sort", "tr", "cat"}
            assert "bwrap" in r.stdout.split()
            r = await sb.exec(
                f"test -e /proc/{os.getpid()}/comm && cat /proc/{os.getpid()}/comm", 10
            )
            assert r.stdout != "python\n" and "python" not in r.stdout
            r = await sb.exec("ls /proc | grep -c '^[0-9]'", timeout=10)
            assert int(r.stdout) < 10, f"the sandbox sees {r.stdout.strip()} processes"
            assert (await sb.exec("hostname", timeout=10)).stdout == "sandbox\n"

    run(body())


def test_no_network_unless_asked(bwrap_backend: LocalBackend, listener: int) -> None:
    connect = f"exec 3<>/dev/tcp/127.0.0.1/{listener} && echo connected"

    async def body() -> None:
        async with await bwrap_backend.create(SPEC) as sb:
            r = await sb.exec(connect, timeout=10)
            assert r.exit_code != 0 and r.stdout == "", "reached the host without network"
        full = msgspec.structs.replace(SPEC, network=NetworkPolicy.FULL)
        async with await bwrap_backend.create(full) as sb:
            r = await sb.exec(connect, timeout=10)
            assert (r.exit_code, r.stdout) == (0, "connected\n"), r.stderr

    run(body())


def test_timeout_leaves_no_process_on_the_host(
    bwrap_backend: LocalBackend, host_processes_with
) -> None:
    marker = "317.25"

    async def body() -> None:
        async with await bwrap_backend.create(SPEC) as sb:
            command = f"(sleep {marker} & sleep {marker}) & sleep {marker}"
            started = time.monotonic()
            with pytest.raises(SandboxCommandTimeout) as caught:
                await sb.exec(command, timeout=1.0)
            assert time.monotonic() - started < 6
            assert caught.value.timeout_s == 1.0
            assert host_processes_with(f"sleep {marker}") == []
            assert (await sb.exec("echo still", timeout=10)).stdout == "still\n"

    run(body())


def test_close_kills_processes_that_left_the_group(
    bwrap_backend: LocalBackend, host_processes_with
) -> None:
    marker = "318.5"

    async def body() -> None:
        sb = await bwrap_backend.create(SPEC)
        r = await sb.exec(f"setsid sleep {marker} >/dev/null 2>&1 < /dev/null & echo ok", 10)
        assert r.stdout == "ok\n"
        deadline = time.monotonic() + 5
        while not host_processes_with(f"sleep {marker}") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert host_processes_with(f"sleep {marker}"), "the detached process never started"
        root = sb.private_root
        await sb.close()
        assert host_processes_with(f"sleep {marker}") == []
        assert not os.path.exists(root), "close left the private root behind"

    run(body())


def test_sandboxes_do_not_see_each_other(bwrap_backend: LocalBackend) -> None:
    async def body() -> None:
        first = await bwrap_backend.create(SPEC)
        second = await bwrap_backend.create(SPEC)
        try:
            await first.write_file("/tests/check.sh", b"echo first")
            await second.write_file("/app/own.txt", b"second")
            r = await first.exec("sh /tests/check.sh; cat /app/own.txt", timeout=10)
            assert (r.stdout, r.exit_code) == ("first\n", 1)
            r = await second.exec("test -e /tests/check.sh || echo absent", timeout=10)
            assert r.stdout == "absent\n"
            await first.exec("sleep 30 >/dev/null 2>&1 &", timeout=10)
            r = await second.exec("cat /proc/[0-9]*/cmdline | tr '\\0' ' '", timeout=10)
            assert "sleep 30" not in r.stdout
            with pytest.raises(SandboxFileNotFound):
                await first.read_file("/app/own.txt")
        finally:
            await first.close()
            await second.close()

    run(body())


def test_file_api_sees_what_commands_see(bwrap_backend: LocalBackend, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")

    async def body() -> None:
        async with await bwrap_backend.create(SPEC) as sb:
            await sb.write_file("/logs/verifier/reward.txt", b"1\n")
            r = await sb.exec("cat /logs/verifier/reward.txt && echo 0.5 > /logs/x", timeout=10)
            assert r.stdout == "1\n"
            assert await sb.read_file("/logs/x") == b"0.5\n"
            assert (await sb.read_file("/etc/passwd")).startswith(b"root:")
            with pytest.raises(SandboxError, match="read-only"):
                await sb.write_file("/usr/rllm-probe", b"x")
            # A link a command plants is followed inside the sandbox, never on the host.
            await sb.exec(f"ln -s {secret} /app/escape && ln -s /logs/x /app/inner", 10)
            with pytest.raises(SandboxFileNotFound):
                await sb.read_file("/app/escape")
            assert await sb.read_file("/app/inner") == b"0.5\n"
            with pytest.raises(SandboxError, match="kernel file system"):
                await sb.read_file("/proc/1/cmdline")
        assert secret.read_text() == "host secret"

    run(body())


def test_extra_read_only_binds(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "tool.sh").write_text("echo from tool\n")
    config = LocalSandboxConfig(
        isolation="bwrap", root_dir=tmp_path / "roots", extra_ro_binds=[str(tools)]
    )

    async def body() -> None:
        backend = LocalBackend(config)
        try:
            async with await backend.create(SPEC) as sb:
                r = await sb.exec(f"sh {tools}/tool.sh; echo x > {tools}/new", timeout=10)
                assert r.stdout == "from tool\n"
                assert "Read-only file system" in r.stderr
                assert await sb.read_file(f"{tools}/tool.sh") == b"echo from tool\n"
        finally:
            await backend.close()
        assert sorted(p.name for p in tools.iterdir()) == ["tool.sh"]

    run(body())


def test_resource_limits_map_to_rlimits(bwrap_backend: LocalBackend, tmp_path: Path) -> None:
    spec = msgspec.structs.replace(SPEC, memory_mb=256, disk_mb=1)

    async def body() -> None:
        async with await bwrap_backend.create(spec) as sb:
            r = await sb.exec("ulimit -v; ulimit -f; ulimit -c", timeout=10)
            assert r.stdout.split() == [str(256 * 1024), "1024", "0"]
            r = await sb.exec("head -c 2000000 /dev/zero > big; wc -c < big", timeout=10)
            assert r.stdout.split()[-1] == str(1 << 20), "a file grew past disk_mb"
        unlimited = LocalBackend(
            LocalSandboxConfig(isolation="bwrap", rlimits=False, root_dir=tmp_path / "r2")
        )
        try:
            async with await unlimited.create(spec) as sb:
                r = await sb.exec("ulimit -v; ulimit -f", timeout=10)
                assert r.stdout.split() == ["unlimited", "unlimited"]
        finally:
            await unlimited.close()

    run(body())


def test_environment_and_home(bwrap_backend: LocalBackend) -> None:
    spec = msgspec.structs.replace(SPEC, env={"TASK_VAR": "t", "PATH": "/usr/bin:/bin"})

    async def body() -> None:
        async with await bwrap_backend.create(spec) as sb:
            r = await sb.exec('printf "%s|%s|%s" "$TASK_VAR" "$PATH" "$LANG"', timeout=10)
            assert r.stdout == "t|/usr/bin:/bin|C.UTF-8"
            home = pwd.getpwuid(os.geteuid()).pw_dir
            r = await sb.exec('printf %s "$HOME"; test -d "$HOME" && echo " exists"', 10)
            assert r.stdout == f"{home} exists\n"

    run(body())


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
def test_named_user_owns_its_workdir_and_uploads(bwrap_backend: LocalBackend) -> None:
    spec = msgspec.structs.replace(SPEC, user="nobody")

    async def body() -> None:
        async with await bwrap_backend.create(spec) as sb:
            await sb.write_file("/app/sub/uploaded.txt", b"u")
            r = await sb.exec(
                "id -un; echo more >> sub/uploaded.txt && touch made && stat -c %U made", 10
            )
            assert r.stdout == "nobody\nnobody\n", r.stderr
            r = await sb.exec("id -un; cat /proc/self/status | grep CapEff", 10, user="root")
            assert r.stdout == "root\nCapEff:\t0000000000000000\n"
            assert await sb.read_file("/app/sub/uploaded.txt") == b"umore\n"
            r = await sb.exec("id -u; id -g; id -G", timeout=10, user="12345")
            assert r.stdout == "12345\n12345\n12345\n"

    run(body())


def test_unknown_user_and_bad_workdir_fail_creation(bwrap_backend: LocalBackend) -> None:
    async def body() -> None:
        bad_user = msgspec.structs.replace(SPEC, user="rllm-no-such-user")
        with pytest.raises(SandboxCreateError, match="rllm-no-such-user"):
            await bwrap_backend.create(bad_user)
        for workdir in ("/usr/app", "relative/dir"):
            with pytest.raises(SandboxCreateError, match=workdir):
                await bwrap_backend.create(SandboxSpec(workdir=workdir))
        async with await bwrap_backend.create(SPEC) as sb:
            with pytest.raises(SandboxError, match="rllm-no-such-user"):
                await sb.exec("true", timeout=10, user="rllm-no-such-user")

    run(body())


def test_lifetime_ends_the_sandbox(bwrap_backend: LocalBackend) -> None:
    spec = msgspec.structs.replace(SPEC, lifetime_s=0.5)

    async def body() -> None:
        sb = await bwrap_backend.create(spec)
        assert await sb.is_alive() is True
        time.sleep(0.7)
        assert await sb.is_alive() is False
        with pytest.raises(SandboxGone, match="lifetime"):
            await sb.exec("true", timeout=10)
        assert not os.path.exists(sb.private_root)

    run(body())


def test_bwrap_mode_fails_loudly_when_bubblewrap_is_missing(tmp_path: Path) -> None:
    config = LocalSandboxConfig(isolation="bwrap", bwrap=str(tmp_path / "no-bwrap"))

    async def body() -> None:
        backend = LocalBackend(config)
        with pytest.raises(SandboxCreateError, match="apt-get install bubblewrap"):
            await backend.create(SPEC)

    run(body())


def test_a_crashed_owner_takes_its_sandboxes_along(tmp_path: Path, host_processes_with) -> None:
    roots = tmp_path / "roots"
    script = tmp_path / "owner.py"
    script.write_text(f"""
import asyncio, sys, time
from rllm_core.types import SandboxSpec
from rllm_sandbox_backend_local.backend import LocalBackend
from rllm_sandbox_backend_local.plugin import LocalSandboxConfig

async def main():
    backend = LocalBackend(LocalSandboxConfig(isolation="bwrap", root_dir={str(roots)!r}))
    sb = await backend.create(SandboxSpec(workdir="/app"))
    await sb.exec("sleep 321.5 >/dev/null 2>&1 &", timeout=10)
    print("ready", flush=True)
    time.sleep(300)

asyncio.run(main())
""")
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        assert owner.stdout.readline() == "ready\n"
        # The background job may not have become `sleep` yet when its shell returned.
        deadline = time.monotonic() + 3
        while not host_processes_with("sleep 321.5") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(host_processes_with("sleep 321.5")) == 1
        assert host_processes_with(str(roots)), "the sandbox's bwrap is not running"
    finally:
        owner.kill()
        owner.wait()
    # The kernel ends the sandbox's other processes after its bwrap, not with it: wait for both.
    deadline = time.monotonic() + 5
    while (
        host_processes_with(str(roots)) or host_processes_with("sleep 321.5")
    ) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert host_processes_with(str(roots)) == [], "bwrap outlived the process that owned it"
    assert host_processes_with("sleep 321.5") == []
