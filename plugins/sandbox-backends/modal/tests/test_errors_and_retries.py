"""The SDK's exceptions become rllm-core sandbox errors; transient ones are retried, creations
are paced. Time is a fake clock, so no test waits."""

from __future__ import annotations

import asyncio
import time

import pytest
from modal import exception as mx
from rllm_core import errors
from rllm_core.types import SandboxSpec
from rllm_sandbox_backend_modal.backend import ModalBackend
from rllm_sandbox_backend_modal.errors import translate
from rllm_sandbox_backend_modal.plugin import ModalConfig
from rllm_sandbox_backend_modal_tests_fake import FakeModal


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(round(seconds, 6))
        self.now += seconds


def backend_over(fake: FakeModal, clock: FakeClock, **config) -> ModalBackend:
    return ModalBackend(
        ModalConfig(**{"create_interval_s": 0.0, **config}),
        client=fake,
        clock=clock,
        sleep=clock.sleep,
    )


@pytest.mark.parametrize(
    ("sdk_error", "ours"),
    [
        (mx.AuthError("bad token"), errors.SandboxAuthError),
        (mx.PermissionDeniedError("no"), errors.SandboxAuthError),
        (mx.ConnectionError("reset"), errors.SandboxTransientError),
        (mx.InternalError("500"), errors.SandboxTransientError),
        (mx.ServiceError("503"), errors.SandboxTransientError),
        (mx.ResourceExhaustedError("rate limited"), errors.SandboxTransientError),
        (ConnectionResetError("peer"), errors.SandboxTransientError),
        (mx.NotFoundError("no sandbox"), errors.SandboxGone),
        (mx.SandboxTerminatedError("gone"), errors.SandboxGone),
        (mx.SandboxTimeoutError("lifetime"), errors.SandboxGone),
        (mx.ClientClosed("closed"), errors.SandboxGone),
        (mx.SandboxFilesystemNotFoundError("/x"), errors.SandboxFileNotFound),
        (mx.ExecTimeoutError("deadline"), errors.SandboxCommandTimeout),
        (mx.SandboxFilesystemIsADirectoryError("/d"), errors.SandboxError),
        (mx.InvalidError("bad arg"), errors.SandboxError),
    ],
)
def test_translation_table(sdk_error, ours):
    error = translate(sdk_error, "read_file /x")
    assert type(error) is ours
    assert str(error).startswith(f"read_file /x: modal raised {type(sdk_error).__name__}: ")


def test_unclassified_errors_while_creating_are_create_errors():
    error = translate(mx.InvalidError("cpu too large"), "creating", creating=True)
    assert type(error) is errors.SandboxCreateError
    assert "cpu too large" in str(error)
    build = mx.ImageBuildError("apt failed", image_id="im-1")
    assert type(translate(build, "creating", creating=True)) is errors.SandboxCreateError
    assert type(translate(mx.AuthError("x"), "creating", creating=True)) is errors.SandboxAuthError


def test_create_retries_transient_errors_with_backoff(tmp_path):
    fake, clock = FakeModal(), FakeClock()
    first, second = mx.ResourceExhaustedError("slow down"), mx.ServiceError("unavailable")
    fake.fail("Sandbox.create", first, second)
    backend = backend_over(fake, clock, retry_backoff_s=1.0, retry_backoff_max_s=1.5)

    async def body():
        async with await backend.create(SandboxSpec(workdir=str(tmp_path))) as sb:
            assert (await sb.exec("echo up", timeout=10)).stdout == "up\n"

    asyncio.run(body())
    first, second = clock.sleeps
    assert 0.0 <= first <= 1.0 and 0.0 <= second <= 1.5, "full jitter under the capped backoff"
    assert len(fake.create_times) == 3


def test_create_gives_up_after_the_configured_retries(tmp_path):
    fake, clock = FakeModal(), FakeClock()
    failures = [mx.ConnectionError(f"down {i}") for i in range(3)]
    fake.fail("Sandbox.create", *failures)
    backend = backend_over(fake, clock, retries=2, retry_backoff_s=0.5)
    with pytest.raises(errors.SandboxTransientError, match="gave up after 3 attempts") as caught:
        asyncio.run(backend.create(SandboxSpec(workdir=str(tmp_path))))
    assert caught.value.__cause__ is failures[2]
    assert "raise `retries` in the [sandbox] config" in str(caught.value)
    first, second = clock.sleeps
    assert 0.0 <= first <= 0.5 and 0.0 <= second <= 1.0
    assert fake.sandboxes == []


@pytest.mark.parametrize(
    ("sdk_error", "ours"),
    [
        (mx.AuthError("token rejected"), errors.SandboxAuthError),
        (mx.InvalidError("memory must be positive"), errors.SandboxCreateError),
        (mx.ImageBuildError("build failed", image_id="im-9"), errors.SandboxCreateError),
    ],
)
def test_create_errors_are_not_retried_and_keep_the_cause(tmp_path, sdk_error, ours):
    fake, clock = FakeModal(), FakeClock()
    fake.fail("Sandbox.create", sdk_error)
    with pytest.raises(ours) as caught:
        asyncio.run(backend_over(fake, clock).create(SandboxSpec(workdir=str(tmp_path))))
    assert caught.value.__cause__ is sdk_error
    assert clock.sleeps == [] and len(fake.create_times) == 1


def test_app_lookup_auth_failure(tmp_path):
    fake, clock = FakeModal(), FakeClock()
    error = mx.AuthError("missing credentials")
    fake.fail("App.lookup", error)
    with pytest.raises(errors.SandboxAuthError, match="MODAL_TOKEN_ID") as caught:
        asyncio.run(backend_over(fake, clock).create(SandboxSpec(workdir=str(tmp_path))))
    assert caught.value.__cause__ is error


def test_file_calls_retry_but_commands_do_not(tmp_path):
    fake, clock = FakeModal(), FakeClock()
    backend = backend_over(fake, clock)
    lost = mx.ConnectionError("stream lost")
    exec_lost = mx.ConnectionError("exec stream lost")

    async def body():
        async with await backend.create(SandboxSpec(workdir=str(tmp_path))) as sb:
            fake.fail("write_bytes", lost)
            await sb.write_file("a.txt", b"abc")
            assert (tmp_path / "a.txt").read_bytes() == b"abc"
            fake.fail("exec", exec_lost)
            with pytest.raises(errors.SandboxTransientError) as caught:
                await sb.exec("touch ran", timeout=10)
            assert caught.value.__cause__ is exec_lost
            assert not (tmp_path / "ran").exists()

    asyncio.run(body())
    assert len(clock.sleeps) == 1 and 0.0 <= clock.sleeps[0] <= 1.0


def test_file_errors_keep_their_cause(tmp_path):
    fake, clock = FakeModal(), FakeClock()

    async def body():
        async with await backend_over(fake, clock).create(SandboxSpec(workdir=str(tmp_path))) as sb:
            with pytest.raises(errors.SandboxFileNotFound) as caught:
                await sb.read_file("missing.txt")
            assert isinstance(caught.value.__cause__, mx.SandboxFilesystemNotFoundError)
            (tmp_path / "d").mkdir()
            with pytest.raises(errors.SandboxError) as caught:
                await sb.read_file("d")
            assert isinstance(caught.value.__cause__, mx.SandboxFilesystemIsADirectoryError)
            denied = mx.SandboxFilesystemPermissionError("denied")
            fake.fail("list_files", denied)
            with pytest.raises(errors.SandboxError) as caught:
                await sb.list_files(".")
            assert caught.value.__cause__ is denied

    asyncio.run(body())


def test_creations_are_spaced_by_the_interval(tmp_path):
    fake, clock = FakeModal(), FakeClock()
    fake.clock = clock
    backend = backend_over(fake, clock, create_interval_s=0.25)
    spec = SandboxSpec(workdir=str(tmp_path))

    async def body():
        sandboxes = await asyncio.gather(*(backend.create(spec) for _ in range(4)))
        await backend.close()
        return sandboxes

    sandboxes = asyncio.run(body())
    assert len(sandboxes) == 4
    assert fake.create_times == [100.0, 100.25, 100.5, 100.75]


def test_is_alive_never_raises(tmp_path):
    fake, clock = FakeModal(), FakeClock()

    async def body():
        async with await backend_over(fake, clock).create(SandboxSpec(workdir=str(tmp_path))) as sb:
            fake.fail("poll", mx.ConnectionError("down"))
            assert await sb.is_alive() is False
            assert await sb.is_alive() is True

    asyncio.run(body())


def test_close_survives_a_failed_terminate(tmp_path):
    fake, clock = FakeModal(), FakeClock()
    backend = backend_over(fake, clock, retries=0)

    async def body():
        sb = await backend.create(SandboxSpec(workdir=str(tmp_path)))
        fake.fail("terminate", mx.InternalError("boom"))
        await sb.close()
        assert await sb.is_alive() is False
        with pytest.raises(errors.SandboxGone):
            await sb.exec("true", timeout=5)
        await fake.terminate_all()

    asyncio.run(body())


def test_cleanup_terminates_only_the_runs_sandboxes(tmp_path):
    fake, clock = FakeModal(), FakeClock()
    mine = backend_over(fake, clock, run_id="run-a")
    other = backend_over(fake, clock, run_id="run-b")
    spec = SandboxSpec(workdir=str(tmp_path), labels={"task": "t1"})

    async def body():
        a1, a2 = await mine.create(spec), await mine.create(spec)
        b1 = await other.create(spec)
        # a crashed run: a fresh backend with the same app finds the leaks by tag
        assert await backend_over(fake, clock).cleanup({"rllm-run": "run-a"}) == 2
        assert [await sb.is_alive() for sb in (a1, a2, b1)] == [False, False, True]
        assert await other.cleanup() == 1
        assert await b1.is_alive() is False
        assert await other.cleanup() == 0

    asyncio.run(body())


def test_guard_refuses_real_modal_calls_fast():
    import modal

    started = time.monotonic()
    with pytest.raises(AssertionError, match="tried to reach the Modal service"):
        modal.App.lookup("rllm-offline-check", create_if_missing=True)
    assert time.monotonic() - started < 2.0

    async def create_with_real_sdk():
        return await ModalBackend(ModalConfig()).create(SandboxSpec(workdir="/w"))

    started = time.monotonic()
    with pytest.raises((AssertionError, errors.SandboxError)):
        asyncio.run(create_with_real_sdk())
    assert time.monotonic() - started < 2.0
