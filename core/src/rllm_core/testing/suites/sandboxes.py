"""Conformance suite for sandbox backends (:class:`rllm_core.ports.SandboxBackend`).

A sandbox plugin's test module subclasses :class:`SandboxConformance`, provides a
``sandbox_backend`` fixture and declares what its limits are::

    from rllm_core.testing.suites.sandboxes import SandboxConformance

    class TestLocalSandbox(SandboxConformance):
        output_limit_bytes = 1 << 20

        @pytest.fixture
        def sandbox_backend(self):
            return LocalBackend(LocalConfig())

The tests are plain synchronous test methods that drive the backend with :func:`asyncio.run`,
so no async pytest plugin is needed. Each test creates its own sandboxes and closes them; the
fixture's backend is closed after the test. Commands use only POSIX ``sh`` and coreutils
(``head``, ``yes``, ``wc``, ``kill``, ``sleep``), and the process checks read ``/proc``, so any
Linux image works.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import random
import shlex
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import msgspec
import pytest

from rllm_core.errors import (
    SandboxCommandTimeout,
    SandboxError,
    SandboxFileNotFound,
    SandboxGone,
)
from rllm_core.ports import EndsProcesses, Sandbox, SandboxBackend
from rllm_core.types import ExecResult, FileInfo, SandboxSpec

__all__ = ["SandboxConformance", "expect_sandbox_error", "run_with_deadline"]

T = TypeVar("T")

# Shell function `alive FILE`: succeeds while the pid written in FILE runs. A zombie counts as
# gone, since a container whose PID 1 never reaps leaves killed processes as zombies.
_ALIVE = (
    'alive() { p=$(cat "$1") || return 2; kill -0 "$p" 2>/dev/null || return 1;'
    ' ! grep -qs "^State:[[:space:]]*Z" "/proc/$p/status"; }'
)


# Hostile agents: each runs in the workdir with LOGS (the verifier's log folder), TESTS (where
# the test script will be uploaded) and ROOT (their parent) in its environment, and tries to
# make the verifier below report 1 without solving the task. `bg FILE` runs a script that
# outlives the command, in its own session where setsid exists; its loop gives up after about
# 20 s, so that a backend failing the check does not keep it forever.
_BG = r"""bg() {
  if command -v setsid >/dev/null; then (setsid sh "$1" </dev/null >/dev/null 2>&1 &)
  else (sh "$1" </dev/null >/dev/null 2>&1 &); fi
}
"""
_FORGE = r"""mkdir -p "$LOGS"
echo 1 > "$LOGS/reward.txt" && echo '{"reward": 1}' > "$LOGS/reward.json"
"""
HOSTILE_AGENTS: dict[str, str] = {
    "prewrites-the-reward": _FORGE,
    "rewrites-the-reward-in-the-background": _BG
    + r"""cat > forge.sh <<'EOF'
i=0; while [ $i -lt 2000 ]; do i=$((i + 1))
  mkdir -p "$LOGS" 2>/dev/null; echo 1 > "$LOGS/reward.txt"
  echo '{"reward": 1}' > "$LOGS/reward.json"
  sleep 0.01
done 2>/dev/null
EOF
bg forge.sh
""",
    "replaces-the-test-script": _BG
    + r"""mkdir -p "$TESTS" && echo 'echo 1 > "$LOGS/reward.txt"' > "$TESTS/test.sh"
cat > replace.sh <<'EOF'
i=0; while [ $i -lt 4000 ]; do i=$((i + 1))
  if [ -f "$TESTS/test.sh" ]; then echo 'echo 1 > "$LOGS/reward.txt"' > "$TESTS/test.sh"; fi
  sleep 0.005
done 2>/dev/null
EOF
bg replace.sh
""",
    "links-the-verifier-folders": r"""mkdir -p mine/logs/verifier mine/tests "$ROOT"
rm -rf "$ROOT/logs" "$TESTS"
echo 1 > mine/logs/verifier/reward.txt && echo 'echo 1 > "$LOGS/reward.txt"' > mine/tests/test.sh
ln -s "$PWD/mine/logs" "$ROOT/logs" && ln -s "$PWD/mine/tests" "$TESTS"
""",
}
"""Agents that try to forge the reward, by name, as shell scripts (see the hostile checks of
:class:`SandboxConformance`)."""
# Those that leave a process running in a session of its own.
_LEAVES_A_SESSION = frozenset(name for name, script in HOSTILE_AGENTS.items() if "\nbg " in script)

# The verifier of the hostile checks, as a task source runs one: a link or file put where a
# verifier folder goes is removed, the folders are emptied, the test script is uploaded only
# now and run, and the reward is read. The task is solved when the workdir holds `solved`.
_RESET = r"""set -e
if [ -L "$ROOT/logs" ] || { [ -e "$ROOT/logs" ] && [ ! -d "$ROOT/logs" ]; }; then
  rm -f "$ROOT/logs"
fi
rm -rf "$TESTS" "$LOGS"; mkdir -p "$TESTS" "$LOGS"
"""
_TEST_SH = (
    b'if [ -f solved ]; then echo 1 > "$LOGS/reward.txt"; else echo 0 > "$LOGS/reward.txt"; fi\n'
)


def run_with_deadline(coro: Coroutine[Any, Any, T], deadline_s: float) -> T:
    """Run ``coro`` in a fresh event loop; fail with AssertionError when it takes longer than
    ``deadline_s`` seconds (a backend must never hang, for example on a full pipe)."""

    async def guarded() -> T:
        task = asyncio.ensure_future(coro)
        done, _ = await asyncio.wait({task}, timeout=deadline_s)
        if not done:
            task.cancel()
            await asyncio.wait({task}, timeout=5.0)
            raise AssertionError(
                f"the sandbox did not finish within {deadline_s:g} s; a backend must never"
                " hang (is a full output pipe left unread?)"
            )
        return task.result()

    return asyncio.run(guarded())


async def expect_sandbox_error(
    awaitable: Awaitable[Any], expected: type[SandboxError], what: str
) -> SandboxError:
    """Await ``awaitable`` and return the ``expected`` error it raises.

    Raises AssertionError naming ``what`` when it returns instead, raises another
    ``SandboxError`` subclass, or raises an exception outside the ``SandboxError`` taxonomy.
    """
    try:
        value = await awaitable
    except expected as exc:
        return exc
    except SandboxError as exc:
        raise AssertionError(
            f"{what} raised {type(exc).__name__}, expected {expected.__name__}: {exc}"
        ) from exc
    except Exception as exc:
        raise AssertionError(
            f"{what} raised {type(exc).__module__}.{type(exc).__qualname__}, which is not a"
            f" SandboxError; raise {expected.__name__} with the backend's error as __cause__"
        ) from exc
    raise AssertionError(f"{what} returned {value!r} instead of raising {expected.__name__}")


async def _outcome(awaitable: Awaitable[T], what: str) -> T | SandboxError:
    """The result, or the SandboxError raised; any other exception fails the test."""
    try:
        return await awaitable
    except SandboxError as exc:
        return exc
    except Exception as exc:
        raise AssertionError(
            f"{what} raised {type(exc).__module__}.{type(exc).__qualname__}, which is not a"
            f" SandboxError subclass: {exc}"
        ) from exc


def _lines(text: str) -> list[str]:
    """The complete lines strictly inside ``text`` (a cut may split the first and last)."""
    return text.split("\n")[1:-1]


class SandboxConformance:
    """Abstract tests for a :class:`~rllm_core.ports.SandboxBackend` and its sandboxes.

    Fixtures the subclass provides:

    - ``sandbox_backend`` (required): a backend instance. The suite closes it after each test
      (once more after the test of ``close`` itself, so a second ``close`` must be harmless).
    - ``sandbox_spec`` (optional): a spec the backend can create. Defaults to
      ``SandboxSpec(workdir=<a fresh path under pytest's tmp_path>)``, which does not exist
      yet, so the backend must create its workdir. Override it to set an image.

    Class attributes the subclass declares:

    - ``output_limit_bytes`` (required): how many bytes of each stream the backend keeps
      before it cuts output with ``truncated=True``.
    - ``supports_signals``: a command can kill its own shell, which reports ``128+n``.
    - ``exec_user``: a user other than the default that exists in the sandbox, to check
      ``exec(user=...)``; ``None`` skips that check.
    - ``large_output_bytes``: bytes each stream prints in the no-deadlock test (50 MB).
    - ``timeout_slack_s``: how long past its timeout a command may take to be killed and
      reported.
    - ``deadline_s``: the most any single test may take before it counts as hung.

    Hostile agents: each script of :data:`HOSTILE_AGENTS` (a forged reward file, a background
    loop rewriting it, one replacing the test script, links in place of the verifier's
    folders) is played as the rollout plays an agent, between ``mark_processes`` and
    ``end_processes`` (see :class:`~rllm_core.ports.EndsProcesses`), then graded by a verifier
    that clears its folders and uploads its test script only then; each must end with reward
    0, while an honest agent gets 1, the process it left in the background is gone and a
    process started before the mark survives. Override :meth:`verifier_root` when the sandbox
    shares the host's filesystem, and declare ``sessions_escape_end_processes`` when its
    sandboxes are plain host processes whose ``end_processes`` finds only the process groups
    of the sandbox's own commands: the agents that leave a process in a session of their own
    are then skipped rather than played, since that process would outlive the test.

    Helpers for a plugin's own extra tests: :meth:`run_async`, :meth:`open_sandbox`,
    :meth:`exec_ok`, :meth:`assert_processes_gone` and :meth:`play_and_verify`.

    The contract's ``__cause__`` chaining and ``SandboxTransientError`` retries depend on the
    backend's own failure modes, so the suite cannot provoke them; test them in the plugin.
    """

    pytestmark: ClassVar[list[pytest.MarkDecorator]] = [pytest.mark.rllm_conformance]

    output_limit_bytes: ClassVar[int | None] = None
    supports_signals: ClassVar[bool] = True
    exec_user: ClassVar[str | None] = None
    large_output_bytes: ClassVar[int] = 50_000_000
    timeout_slack_s: ClassVar[float] = 5.0
    deadline_s: ClassVar[float] = 60.0
    sessions_escape_end_processes: ClassVar[bool] = False

    @pytest.fixture
    def sandbox_spec(self, tmp_path: Path) -> SandboxSpec:
        return SandboxSpec(workdir=str(tmp_path / "workdir"))

    @pytest.fixture(autouse=True)
    def _close_backend_after_test(self, sandbox_backend: SandboxBackend) -> Iterator[None]:
        yield
        run_with_deadline(sandbox_backend.close(), self.deadline_s)

    # ------------------------------------------------------------------ helpers

    def run_async(self, coro: Coroutine[Any, Any, T]) -> T:
        return run_with_deadline(coro, self.deadline_s)

    @contextlib.asynccontextmanager
    async def open_sandbox(
        self, backend: SandboxBackend, spec: SandboxSpec
    ) -> AsyncIterator[Sandbox]:
        sb = await backend.create(spec)
        try:
            yield sb
        finally:
            await sb.close()

    async def exec_ok(self, sb: Sandbox, command: str, **kwargs: Any) -> ExecResult:
        """Run ``command`` and require exit code 0."""
        try:
            result = await sb.exec(command, timeout=kwargs.pop("timeout", 30.0), **kwargs)
        except SandboxError:
            raise
        except Exception as exc:
            raise AssertionError(
                f"exec({command[:80]!r}) raised {type(exc).__module__}.{type(exc).__qualname__},"
                f" which is not a SandboxError subclass: {exc}"
            ) from exc
        assert isinstance(result, ExecResult), f"exec returned {type(result).__name__}"
        assert result.exit_code == 0, (
            f"{command!r} exited {result.exit_code}: stdout={result.stdout[-500:]!r}"
            f" stderr={result.stderr[-500:]!r}"
        )
        return result

    async def assert_processes_gone(
        self, sb: Sandbox, pid_files: list[str], within_s: float = 3.0
    ) -> None:
        """Require that the process whose pid each file holds stops running."""
        checks = "; ".join(
            f"if [ ! -s {q} ]; then echo missing:{q}; elif alive {q}; then echo {q}; fi"
            for q in map(shlex.quote, pid_files)
        )
        deadline = time.monotonic() + within_s
        while True:
            result = await sb.exec(f"{_ALIVE}; {checks}", timeout=30.0)
            running = result.stdout.split()
            missing = [r.removeprefix("missing:") for r in running if r.startswith("missing:")]
            assert not missing, f"pid files {missing} were never written: did the command run?"
            if not running:
                return
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"processes still run {within_s:g} s after their command ended:"
                    f" pids from {running}"
                )
            await asyncio.sleep(0.1)

    # ------------------------------------------------------------------ lifecycle

    def test_create_returns_a_live_sandbox(
        self, sandbox_backend: SandboxBackend, sandbox_spec: SandboxSpec
    ) -> None:
        assert isinstance(sandbox_backend, SandboxBackend), (
            f"{type(sandbox_backend).__name__} lacks a method of SandboxBackend"
        )

        async def body() -> None:
            async with self.open_sandbox(sandbox_backend, sandbox_spec) as sb:
                assert isinstance(sb, Sandbox), f"{type(sb).__name__} lacks a Sandbox method"
                assert isinstance(sb.merges_output, bool), "merges_output must be a bool"
                assert await sb.is_alive() is True
                result = await self.exec_ok(sb, "echo ready")
                assert result.stdout.strip() == "ready"

        self.run_async(body())

    def test_close_is_idempotent_and_later_calls_raise_gone(
        self, sandbox_backend: SandboxBackend, sandbox_spec: SandboxSpec
    ) -> None:
        async def body() -> None:
            sb = await sandbox_backend.create(sandbox_spec)
            path = posixpath.join(sandbox_spec.workdir, "f.txt")
            await sb.write_file(path, b"x")
            await sb.close()
            await sb.close()
            assert await sb.is_alive() is False, "is_alive() is true after close()"
            await expect_sandbox_error(sb.exec("true", timeout=10), SandboxGone, "exec")
            await expect_sandbox_error(sb.write_file(path, b"y"), SandboxGone, "write_file")
            await expect_sandbox_error(sb.read_file(path), SandboxGone, "read_file")
            await expect_sandbox_error(
                sb.list_files(sandbox_spec.workdir), SandboxGone, "list_files"
            )
            assert await sb.is_alive() is False

        self.run_async(body())

    def test_async_context_manager_closes(
        self, sandbox_backend: SandboxBackend, sandbox_spec: SandboxSpec
    ) -> None:
        async def body() -> None:
            sb = await sandbox_backend.create(sandbox_spec)
            async with sb as entered:
                assert (await self.exec_ok(entered, "echo in")).stdout == "in\n"
            assert await sb.is_alive() is False, "leaving `async with` did not close it"

            sb = await sandbox_backend.create(sandbox_spec)
            with contextlib.suppress(KeyError):
                async with sb:
                    raise KeyError("boom")
            assert await sb.is_alive() is False, "an exception in `async with` left it open"

        self.run_async(body())

    def test_backend_close_releases_its_sandboxes(
        self, sandbox_backend: SandboxBackend, sandbox_spec: SandboxSpec
    ) -> None:
        async def body() -> None:
            first = await sandbox_backend.create(sandbox_spec)
            second = await sandbox_backend.create(sandbox_spec)
            await sandbox_backend.close()
            for sb in (first, second):
                assert await sb.is_alive() is False, "backend.close() left a sandbox alive"
                await expect_sandbox_error(sb.exec("true", timeout=10), SandboxGone, "exec")

        self.run_async(body())

    def test_no_process_survives_close(
        self, sandbox_backend: SandboxBackend, sandbox_spec: SandboxSpec
    ) -> None:
        async def body() -> None:
            marker = posixpath.join(sandbox_spec.workdir, "bg.pid")
            async with self.open_sandbox(sandbox_backend, sandbox_spec) as sb:
                await self.exec_ok(sb, "sleep 100 >/dev/null 2>&1 & echo $! > bg.pid")
                pid = (await sb.read_file(marker)).decode()
            # A second sandbox checks: an isolated one cannot see the pid at all, a shared
            # host sees whether the background process outlived the first sandbox.
            async with self.open_sandbox(sandbox_backend, sandbox_spec) as checker:
                await checker.write_file(marker, pid.encode())
                await self.assert_processes_gone(checker, ["bg.pid"])

        self.run_async(body())

    # ------------------------------------------------------------------ hostile agents

    def verifier_root(self, spec: SandboxSpec) -> str:
        """The folder the hostile checks put the verifier's ``logs/verifier`` and ``tests``
        in: ``/``, where a task's verifier has them. A backend whose sandboxes share the
        host's filesystem returns a folder under ``spec.workdir`` instead."""
        return "/"

    async def play_and_verify(
        self, backend: SandboxBackend, spec: SandboxSpec, agent: str, *, setup: str = "true"
    ) -> tuple[str, list[str], ExecResult]:
        """Play one graded episode as the rollout does: ``setup``, ``mark_processes``, the
        ``agent`` script (its exit code is ignored), ``end_processes``, then a verifier that
        clears its folders, uploads its test script and runs it. Returns the text of
        ``reward.txt``, the names in the verifier's log folder, and, after a short wait, the
        result of checking that a process ``setup`` left (its pid in ``service.pid``) runs
        (exit 0; 1 when it is gone, 2 without the file) and that one the agent left (its pid
        in ``agent.pid``, when written) does not (exit 3)."""
        root = self.verifier_root(spec)
        env = {
            "ROOT": root,
            "LOGS": posixpath.join(root, "logs", "verifier"),
            "TESTS": posixpath.join(root, "tests"),
        }
        async with self.open_sandbox(backend, spec) as sb:
            assert isinstance(sb, EndsProcesses), (
                f"{type(sb).__name__} has no mark_processes / end_processes, so what an agent"
                " leaves running would run beside its verifier; implement"
                " rllm_core.ports.EndsProcesses"
            )
            await self.exec_ok(sb, setup)
            await sb.mark_processes()
            await sb.exec(agent, timeout=30.0, env=env)
            await asyncio.sleep(0.2)  # its background loops get going
            await sb.end_processes()
            await self.exec_ok(sb, _RESET, env=env, cwd="/")
            await sb.write_file(posixpath.join(env["TESTS"], "test.sh"), _TEST_SH)
            await self.exec_ok(sb, 'sh "$TESTS/test.sh"', env=env)
            await asyncio.sleep(0.2)  # a survivor would rewrite the reward by now
            reward = (await sb.read_file(posixpath.join(env["LOGS"], "reward.txt"))).decode()
            found = sorted(posixpath.basename(f.path) for f in await sb.list_files(env["LOGS"]))
            service = await sb.exec(
                f"{_ALIVE}; alive service.pid || exit; ! {{ [ -s agent.pid ] && alive agent.pid; }}"
                " || exit 3",
                timeout=30.0,
            )
        return reward.strip(), found, service

    @pytest.mark.parametrize("agent", sorted(HOSTILE_AGENTS))
    def test_a_hostile_agent_cannot_forge_the_reward(
        self, sandbox_backend: SandboxBackend, sandbox_spec: SandboxSpec, agent: str
    ) -> None:
        if self.sessions_escape_end_processes and agent in _LEAVES_A_SESSION:
            pytest.skip(
                f"the agent that {agent.replace('-', ' ')} leaves a process in a session of its"
                " own, which end_processes of these sandboxes cannot tell from the host's"
                " (sessions_escape_end_processes); played here, it would outlive the test"
            )

        async def body() -> None:
            reward, found, _ = await self.play_and_verify(
                sandbox_backend, sandbox_spec, HOSTILE_AGENTS[agent]
            )
            assert reward == "0", (
                f"the agent that {agent.replace('-', ' ')} made the verifier read {reward!r};"
                " expected 0 (see HOSTILE_AGENTS)"
            )
            assert found == ["reward.txt"], (
                f"after the agent that {agent.replace('-', ' ')}, the verifier's folder holds"
                f" {found}, not only the verifier's reward.txt"
            )

        self.run_async(body())

    def test_an_honest_agent_is_rewarded_and_the_environment_survives(
        self, sandbox_backend: SandboxBackend, sandbox_spec: SandboxSpec
    ) -> None:
        async def body() -> None:
            reward, found, service = await self.play_and_verify(
                sandbox_backend,
                sandbox_spec,
                "touch solved; sleep 100 >/dev/null 2>&1 & echo $! > agent.pid",
                setup="sleep 100 >/dev/null 2>&1 & echo $! > service.pid",
            )
            assert reward == "1", f"the honest agent's verifier wrote {reward!r}, expected 1"
            assert found == ["reward.txt"], f"the verifier's folder holds {found}"
            assert service.exit_code != 3, (
                "end_processes left running the process the agent started in the background"
                " (its pid in agent.pid)"
            )
            assert service.exit_code == 0, (
                "end_processes killed a process started before mark_processes (exit"
                f" {service.exit_code} from the liveness check: {service.stdout!r})"
            )

        self.run_async(body())

    # ------------------------------------------------------------------ exit codes and output

    def test_exit_codes(self, sandbox_backend: SandboxBackend, sandbox_spec: SandboxSpec) -> None:
        cases = {"exit 0": 0, "true": 0, "false": 1, "exit 42": 42, "exit 255": 255}
        cases["rllm_no_such_command_xyz"] = 127
        if self.supports_signals:
            cases["kill -9 $$"] = 137
            cases["kill -TERM $$"] = 143

        async def body() -> None:
            async with self.open_sandbox(sandbox_backend, sandbox_spec) as sb:
                for command, code in cases.items():
                    result = await sb.exec(command, timeout=30)
                    assert result.exit_code == code, (
                        f"{command!r} reported exit code {result.exit_code}, expected {code}"
                    )

        self.run_async(body())

    def test_stdout_and_stderr(
        self, sandbox_backend: SandboxBackend, sandbox_spec: SandboxSpec
    ) -> None:
        async def body() -> None:
            async with self.open_sandbox(sandbox_backend, sandbox_spec) as sb:
                result = await self.exec_ok(sb, "echo out; echo err >&2")
                if sb.merges_output:
                    assert result.stderr == "", "merged output must leave stderr empty"
                    assert sorted(result.stdout.split()) == ["err", "out"]
                else:
                    assert (result.stdout, result.stderr) == ("out\n", "err\n")
                assert result.truncated is False

        self.run_async(body())

    def test_unicode_and_undecodable_output(
        self, sandbox_backend: SandboxBackend, sandbox_spec: SandboxSpec
    ) -> None:
        async def body() -> None:
            async with self.open_sandbox(sandbox_backend, sandbox_spec) as sb:
                text = "héllo 世界 🙂"
                result = await self.exec_ok(sb, f"printf '%s' {shlex.quote(text)}")
                assert result.stdout == text
                result = await self.exec_ok(sb, r"printf 'ok\303\251\n'")
                assert result.stdout == "oké\n"
                result = await self.exec_ok(sb, r"printf 'a\377\376b'; printf 'c\200d' >&2")
                both = result.stdout + result.stderr
                assert "a" in both and "b" in both and "c" in both and "d" in both
                assert "\ufffd" in both, f"undecodable bytes were not replaced: {both!r}"
                if not sb.merges_output:
                    assert result.stdout == "a\ufffd\ufffdb"
                    assert result.stderr == "c\ufffdd"

        self.run_async(body())

    def test_output_limit_truncates_without_deadlock(
        self, sandbox_backend: SandboxBackend, sandbox_spec: SandboxSpec
    ) -> None:
        limit = self.output_limit_bytes
        assert limit, (
            f"{type(self).__name__} must declare output_limit_bytes: the number of bytes of each"
            " stream the backend keeps"
        )
        big = self.large_output_bytes
        assert big > 2 * limit, f"large_output_bytes={big} must exceed twice the limit {limit}"
        small_lines = max(1, min(10_000, limit // 22))

        async def body() -> None:
            async with self.open_sandbox(sandbox_backend, sandbox_spec) as sb:
                # stderr fills first: a backend that drains stdout to the end before reading
                # stderr blocks forever here.
                command = f"yes EEEE | head -c {big} >&2; yes 0123456789 | head -c {big}"
                result = await sb.exec(command, timeout=120)
                assert result.exit_code == 0
                assert result.truncated is True, f"{2 * big} bytes of output were not truncated"
                for name, text, line in (
                    ("stdout", result.stdout, "0123456789"),
                    ("stderr", result.stderr, "EEEE"),
                ):
                    size = len(text.encode())
                    assert size <= limit + 4096, f"{name} kept {size} bytes over limit {limit}"
                    if not sb.merges_output:
                        assert text, f"truncated {name} kept nothing"
                        assert set(_lines(text)) <= {line}, f"{name} is not a cut of the output"

                expected = "0123456789\n" * small_lines
                result = await self.exec_ok(sb, f"yes 0123456789 | head -n {small_lines}")
                assert result.stdout == expected, "output under the limit was altered"
                assert result.truncated is False

        self.run_async(body())

    # ------------------------------------------------------------------ shell, cwd, env, user

    def test_runs_through_a_shell_with_exact_quoting(
        self, sandbox_backend: SandboxBackend, sandbox_spec: SandboxSpec
    ) -> None:
        script = "cat <<'EOF'\nline $HOME `x`\nEOF\nx=1\necho \"x=$x\""

        async def body() -> None:
            async with self.open_sandbox(sandbox_backend, sandbox_spec) as sb:
                r = await self.exec_ok(
                    sb, "printf '%s|' \"two  words\" 'a $b' \"$((6*7))\" && echo"
                )
                assert r.stdout == "two  words|a $b|42|\n"
                r = await self.exec_ok(sb, "printf 'a\\nb\\nc\\n' | grep -v b | wc -l")
                assert r.stdout.strip() == "2"
                r = await self.exec_ok(sb, "x='it'\"'\"'s'; echo \"$x\" && false || echo fallback")
                assert r.stdout == "it's\nfallback\n"
                r = await self.exec_ok(sb, script)
                assert r.stdout == "line $HOME `x`\nx=1\n"
                awkward = "a b 'c' \"d\" $e `f` \\g\nh é; rm -rf /nothing"
                r = await self.exec_ok(sb, f"printf '%s' {shlex.quote(awkward)}")
                assert r.stdout == awkward

        self.run_async(body())

    def test_cwd(self, sandbox_backend: SandboxBackend, sandbox_spec: SandboxSpec) -> None:
        workdir = sandbox_spec.workdir

        async def body() -> None:
            async with self.open_sandbox(sandbox_backend, sandbox_spec) as sb:
                default = (await self.exec_ok(sb, "pwd -P")).stdout
                resolved = (await self.exec_ok(sb, f"cd {shlex.quote(workdir)} && pwd -P")).stdout
                assert default == resolved, (
                    f"commands run in {default.strip()!r}, not the spec's workdir {workdir!r}"
                )
                await self.exec_ok(sb, "printf rel > rel.txt && mkdir -p 'dir with space'")
                assert await sb.read_file(posixpath.join(workdir, "rel.txt")) == b"rel"
                sub = posixpath.join(workdir, "dir with space")
                r = await self.exec_ok(sb, "pwd -P; printf here > here.txt", cwd=sub)
                assert r.stdout.rstrip("\n").endswith("/dir with space")
                assert await sb.read_file(posixpath.join(sub, "here.txt")) == b"here"
                assert (await self.exec_ok(sb, "pwd -P")).stdout == default, (
                    "cwd leaked into later calls"
                )

        self.run_async(body())

    def test_env(self, sandbox_backend: SandboxBackend, sandbox_spec: SandboxSpec) -> None:
        spec = msgspec.structs.replace(
            sandbox_spec,
            env={**sandbox_spec.env, "RLLM_SPEC_VAR": "from spec", "RLLM_SHARED": "spec"},
        )
        awkward = "a b 'c' \"d\" $e `f` \\g\nh é"

        async def body() -> None:
            async with self.open_sandbox(sandbox_backend, spec) as sb:
                show = 'printf \'%s|%s|%s\' "$RLLM_SPEC_VAR" "$RLLM_SHARED" "$RLLM_CALL"'
                assert (await self.exec_ok(sb, show)).stdout == "from spec|spec|"
                r = await self.exec_ok(sb, show, env={"RLLM_SHARED": "call", "RLLM_CALL": awkward})
                assert r.stdout == f"from spec|call|{awkward}", (
                    f"env must be added to the sandbox env (spec env, call env wins): {r.stdout!r}"
                )
                assert (await self.exec_ok(sb, show)).stdout == "from spec|spec|", (
                    "env of one call leaked into the next"
                )
                path = (await self.exec_ok(sb, 'printf %s "$PATH"')).stdout
                with_env = (await self.exec_ok(sb, 'printf %s "$PATH"', env={"X": "1"})).stdout
                assert with_env == path, "env must be added to the sandbox env, not replace it"

        self.run_async(body())

    def test_exec_as_user(self, sandbox_backend: SandboxBackend, sandbox_spec: SandboxSpec) -> None:
        if self.exec_user is None:
            pytest.skip("exec_user is not declared: the suite knows no second user")
        user = self.exec_user

        async def body() -> None:
            async with self.open_sandbox(sandbox_backend, sandbox_spec) as sb:
                assert (await self.exec_ok(sb, "id -un", user=user)).stdout.strip() == user

        self.run_async(body())

    # ------------------------------------------------------------------ timeouts

    def test_timeout_kills_the_process_tree(
        self, sandbox_backend: SandboxBackend, sandbox_spec: SandboxSpec
    ) -> None:
        timeout = 2.0
        command = "echo $$ > shell.pid; sleep 100 & echo $! > child.pid; sleep 100"

        async def body() -> None:
            async with self.open_sandbox(sandbox_backend, sandbox_spec) as sb:
                started = time.monotonic()
                exc = await expect_sandbox_error(
                    sb.exec(command, timeout=timeout), SandboxCommandTimeout, "exec past timeout"
                )
                elapsed = time.monotonic() - started
                assert elapsed >= timeout * 0.9, f"timed out after {elapsed:.2f} s < {timeout} s"
                assert elapsed <= timeout + self.timeout_slack_s, (
                    f"a {timeout} s timeout took {elapsed:.1f} s to report"
                )
                assert str(exc), "SandboxCommandTimeout has an empty message"
                assert await sb.is_alive() is True, "a timeout must not end the sandbox"
                await self.assert_processes_gone(sb, ["shell.pid", "child.pid"])
                assert (await self.exec_ok(sb, "echo after")).stdout == "after\n"

        self.run_async(body())

    def test_timeout_with_endless_output(
        self, sandbox_backend: SandboxBackend, sandbox_spec: SandboxSpec
    ) -> None:
        async def body() -> None:
            async with self.open_sandbox(sandbox_backend, sandbox_spec) as sb:
                started = time.monotonic()
                await expect_sandbox_error(
                    sb.exec("yes; yes >&2", timeout=1.0), SandboxCommandTimeout, "endless `yes`"
                )
                assert time.monotonic() - started <= 1.0 + self.timeout_slack_s
                r = await self.exec_ok(sb, "sleep 0.2; echo done", timeout=20)
                assert r.stdout == "done\n", "a command shorter than its timeout must complete"

        self.run_async(body())

    # ------------------------------------------------------------------ files

    def test_binary_files_round_trip_exactly(
        self, sandbox_backend: SandboxBackend, sandbox_spec: SandboxSpec
    ) -> None:
        every_byte = bytes(range(256)) * 4
        large = random.Random(7).randbytes(3 * 1024 * 1024 + 11)
        workdir = sandbox_spec.workdir

        async def body() -> None:
            async with self.open_sandbox(sandbox_backend, sandbox_spec) as sb:
                for name, data in (("bytes.bin", every_byte), ("large.bin", large), ("e", b"")):
                    path = posixpath.join(workdir, name)
                    await sb.write_file(path, data)
                    back = await sb.read_file(path)
                    assert back == data, f"{name}: wrote {len(data)} bytes, read {len(back)}"
                    size = await self.exec_ok(sb, f"wc -c < {shlex.quote(name)}")
                    assert int(size.stdout) == len(data), "exec sees another file than write_file"
                path = posixpath.join(workdir, "large.bin")
                await sb.write_file(path, b"short")
                assert await sb.read_file(path) == b"short", "overwriting kept old bytes"
                await self.exec_ok(sb, r"printf '\000\001\377\n' > made.bin")
                made = await sb.read_file(posixpath.join(workdir, "made.bin"))
                assert made == b"\x00\x01\xff\n"

        self.run_async(body())

    def test_missing_files_raise_file_not_found(
        self, sandbox_backend: SandboxBackend, sandbox_spec: SandboxSpec
    ) -> None:
        missing = posixpath.join(sandbox_spec.workdir, "no", "such", "file.txt")

        async def body() -> None:
            async with self.open_sandbox(sandbox_backend, sandbox_spec) as sb:
                await expect_sandbox_error(sb.read_file(missing), SandboxFileNotFound, "read_file")
                await expect_sandbox_error(
                    sb.list_files(posixpath.dirname(missing)), SandboxFileNotFound, "list_files"
                )

        self.run_async(body())

    def test_relative_paths_and_parent_directories(
        self, sandbox_backend: SandboxBackend, sandbox_spec: SandboxSpec
    ) -> None:
        workdir = sandbox_spec.workdir

        async def body() -> None:
            async with self.open_sandbox(sandbox_backend, sandbox_spec) as sb:
                await sb.write_file("made/on/demand.txt", b"relative")
                absolute = posixpath.join(workdir, "made", "on", "demand.txt")
                assert await sb.read_file(absolute) == b"relative"
                shown = await self.exec_ok(sb, "cat made/on/demand.txt")
                assert shown.stdout == "relative"
                await sb.write_file(posixpath.join(workdir, "abs.txt"), b"absolute")
                assert await sb.read_file("abs.txt") == b"absolute"

        self.run_async(body())

    def test_list_files(self, sandbox_backend: SandboxBackend, sandbox_spec: SandboxSpec) -> None:
        workdir = sandbox_spec.workdir

        async def body() -> None:
            async with self.open_sandbox(sandbox_backend, sandbox_spec) as sb:
                await self.exec_ok(sb, "mkdir -p listed/sub && printf abc > listed/a.txt")
                listed = posixpath.join(workdir, "listed")
                await sb.write_file(posixpath.join(listed, "b.bin"), b"\x00" * 1000)
                await sb.write_file(posixpath.join(listed, "sub", "deep.txt"), b"deep")
                entries = await sb.list_files(listed)
                assert all(isinstance(e, FileInfo) for e in entries)
                assert all(
                    e.path == posixpath.join(listed, posixpath.basename(e.path)) for e in entries
                ), f"list_files paths must be absolute: {entries}"
                by_name = {posixpath.basename(e.path.rstrip("/")): e for e in entries}
                assert sorted(by_name) == ["a.txt", "b.bin", "sub"], (
                    f"list_files({listed!r}) gave {sorted(by_name)}"
                )
                assert (by_name["a.txt"].size, by_name["a.txt"].is_dir) == (3, False)
                assert (by_name["b.bin"].size, by_name["b.bin"].is_dir) == (1000, False)
                assert by_name["sub"].is_dir is True
                empty = posixpath.join(workdir, "empty")
                await self.exec_ok(sb, f"mkdir {shlex.quote(empty)}")
                assert await sb.list_files(empty) == []

        self.run_async(body())

    # ------------------------------------------------------------------ concurrency

    def test_parallel_execs_in_one_sandbox(
        self, sandbox_backend: SandboxBackend, sandbox_spec: SandboxSpec
    ) -> None:
        async def body() -> None:
            async with self.open_sandbox(sandbox_backend, sandbox_spec) as sb:
                commands = [f"sleep 0.{i % 3}; echo out{i}; echo err{i} >&2" for i in range(20)]
                results = await asyncio.gather(*(self.exec_ok(sb, c) for c in commands))
                for i, r in enumerate(results):
                    if sb.merges_output:
                        assert sorted(r.stdout.split()) == [f"err{i}", f"out{i}"]
                    else:
                        assert (r.stdout, r.stderr) == (f"out{i}\n", f"err{i}\n"), (
                            f"call {i} got another call's output: {r.stdout!r} {r.stderr!r}"
                        )

        self.run_async(body())

    def test_parallel_sandboxes(
        self, sandbox_backend: SandboxBackend, sandbox_spec: SandboxSpec
    ) -> None:
        workdir = sandbox_spec.workdir

        async def one(sb: Sandbox, k: int) -> None:
            payload = bytes([k]) * (1000 + k)
            path = posixpath.join(workdir, f"sandbox{k}.bin")
            await sb.write_file(path, payload)
            results = await asyncio.gather(
                *(self.exec_ok(sb, f"sleep 0.1; echo {k}-{i}") for i in range(5))
            )
            assert [r.stdout for r in results] == [f"{k}-{i}\n" for i in range(5)]
            assert await sb.read_file(path) == payload

        async def body() -> None:
            sandboxes = await asyncio.gather(
                *(sandbox_backend.create(sandbox_spec) for _ in range(4))
            )
            try:
                await asyncio.gather(*(one(sb, k) for k, sb in enumerate(sandboxes)))
            finally:
                await asyncio.gather(*(sb.close() for sb in sandboxes))

        self.run_async(body())

    # ------------------------------------------------------------------ error taxonomy

    def test_every_failure_is_a_sandbox_error(
        self, sandbox_backend: SandboxBackend, sandbox_spec: SandboxSpec
    ) -> None:
        workdir = sandbox_spec.workdir

        async def body() -> None:
            async with self.open_sandbox(sandbox_backend, sandbox_spec) as sb:
                await self.exec_ok(sb, "mkdir -p adir && printf x > afile")
                afile = posixpath.join(workdir, "afile")
                adir = posixpath.join(workdir, "adir")
                nowhere = posixpath.join(workdir, "nowhere")
                probes: dict[str, Callable[[], Awaitable[Any]]] = {
                    "read_file(<directory>)": lambda: sb.read_file(adir),
                    "write_file(<file>/child)": lambda: sb.write_file(afile + "/child", b"x"),
                    "list_files(<file>)": lambda: sb.list_files(afile),
                    "exec(cwd=<missing dir>)": lambda: sb.exec("true", timeout=10, cwd=nowhere),
                    "exec(<command with NUL>)": lambda: sb.exec("echo a\0b", timeout=10),
                    "exec(env with '=' in a name)": lambda: sb.exec(
                        "true", timeout=10, env={"A=B": "x"}
                    ),
                }
                for what, probe in probes.items():
                    outcome = await _outcome(probe(), what)
                    if what == "read_file(<directory>)":
                        assert isinstance(outcome, SandboxError), (
                            f"{what} returned {outcome!r} instead of raising a SandboxError"
                        )
                    if what == "exec(cwd=<missing dir>)" and isinstance(outcome, ExecResult):
                        assert outcome.exit_code != 0, "exec in a missing cwd reported success"
                assert await sb.is_alive() is True, "a failed call must not end the sandbox"
                assert await sb.read_file(afile) == b"x"

        self.run_async(body())
