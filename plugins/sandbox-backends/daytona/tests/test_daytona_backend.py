"""Parameter mapping, error taxonomy, retries, polling, cleanup and the network guard."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from daytona import (
    AsyncDaytona,
    CreateSandboxFromImageParams,
    CreateSandboxFromSnapshotParams,
    DaytonaAuthenticationError,
    DaytonaBadRequestError,
    DaytonaConfig,
    DaytonaConnectionError,
    DaytonaError,
    DaytonaFileAccessDeniedError,
    DaytonaFileNotFoundError,
    DaytonaForbiddenError,
    DaytonaGoneError,
    DaytonaInternalServerError,
    DaytonaNotFoundError,
    DaytonaProcessExecutionTimeoutError,
    DaytonaRateLimitError,
    DaytonaServiceUnavailableError,
    DaytonaTimeoutError,
    Resources,
)
from fake_daytona import FakeDaytona, fast_config
from rllm_core import errors
from rllm_core.types import NetworkPolicy, SandboxSpec
from rllm_sandbox_backend_daytona.backend import DaytonaBackend, cleanup
from rllm_sandbox_backend_daytona.errors import retry_after_s, translate
from rllm_sandbox_backend_daytona.plugin import DaytonaSandboxConfig


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


# ------------------------------------------------------------------ parameter mapping


def test_image_spec_maps_to_image_params_with_resources_rounded_up_to_gib() -> None:
    backend = DaytonaBackend(fast_config(labels={"team": "a", "rllm-run": "ignored"}))
    spec = SandboxSpec(
        image="python:3.12-slim",
        cpu=1.5,
        memory_mb=2049,
        disk_mb=10240,
        lifetime_s=3601,
        env={"K": "v"},
        labels={"task": "t1"},
    )
    params = backend.create_params(spec)
    assert isinstance(params, CreateSandboxFromImageParams)
    assert params.image == "python:3.12-slim"
    assert params.resources == Resources(cpu=2, memory=3, disk=10)
    assert params.ttl_minutes == 61
    assert params.auto_stop_interval == 15
    assert params.auto_delete_interval == 0
    assert params.network_block_all is True
    assert params.env_vars == {"K": "v"}
    assert params.labels == {
        "rllm-managed": "true",
        "rllm-run": "ignored",
        "team": "a",
        "task": "t1",
    }


def test_small_resources_round_up_to_one_and_full_network_is_open() -> None:
    backend = DaytonaBackend(fast_config(auto_stop_minutes=0))
    spec = SandboxSpec(
        image="alpine",
        cpu=0.25,
        memory_mb=500,
        disk_mb=1,
        lifetime_s=30,
        network=NetworkPolicy.FULL,
    )
    params = backend.create_params(spec)
    assert params.resources == Resources(cpu=1, memory=1, disk=1)
    assert (params.ttl_minutes, params.auto_stop_interval) == (1, 0)
    assert params.network_block_all is False
    assert params.labels == {"rllm-managed": "true", "rllm-run": "testrun"}


def test_gateway_network_allows_only_the_gateway_address() -> None:
    backend = DaytonaBackend(fast_config())
    url = "http://203.0.113.7:8000/sessions/s-1/v1"
    spec = SandboxSpec(image="alpine", network=NetworkPolicy.GATEWAY, gateway_url=url)
    params = backend.create_params(spec)
    assert isinstance(params, CreateSandboxFromImageParams)
    assert (params.network_block_all, params.network_allow_list) == (False, "203.0.113.7/32")
    assert params.domain_allow_list is None
    blocked = backend.create_params(SandboxSpec(image="alpine", network=NetworkPolicy.GATEWAY))
    assert (blocked.network_block_all, blocked.network_allow_list) == (True, None)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://127.0.0.1:8000/v1", "daytona sandboxes run on daytona's machines"),
        ("http://gw.example.org:8000/v1", "names its host by name"),
    ],
)
def test_a_gateway_daytona_cannot_allow_is_refused(url: str, message: str) -> None:
    backend = DaytonaBackend(fast_config())
    spec = SandboxSpec(image="alpine", network=NetworkPolicy.GATEWAY, gateway_url=url)
    with pytest.raises(errors.SandboxCreateError, match=message):
        backend.create_params(spec)


def test_mapped_image_and_no_image_use_snapshots_without_resources() -> None:
    config = fast_config(snapshot="base-snap", snapshots={"python:3.12-slim": "py-snap"})
    backend = DaytonaBackend(config)
    mapped = backend.create_params(SandboxSpec(image="python:3.12-slim"))
    assert isinstance(mapped, CreateSandboxFromSnapshotParams)
    assert mapped.snapshot == "py-snap"
    default = backend.create_params(SandboxSpec())
    assert isinstance(default, CreateSandboxFromSnapshotParams)
    assert default.snapshot == "base-snap"
    assert "resources" not in CreateSandboxFromSnapshotParams.model_fields


def test_a_bad_user_cannot_be_created() -> None:
    backend = DaytonaBackend(fast_config())
    with pytest.raises(errors.SandboxCreateError, match="not a valid account name"):
        backend.create_params(SandboxSpec(image="alpine", user="bad user;"))


DOCKERFILE = "FROM alpine:3.20\nCOPY app/ /app/\nCOPY run.sh /run.sh\nRUN chmod +x /run.sh\n"


def task_environment(folder: Path) -> Path:
    """A task's environment folder: its Dockerfile and the files it copies."""
    (folder / "app").mkdir(parents=True)
    (folder / "app" / "main.py").write_text("print('hi')\n")
    (folder / "run.sh").write_text("#!/bin/sh\n")
    (folder / "Dockerfile").write_text(DOCKERFILE)
    return folder


def test_a_dockerfile_is_built_with_its_build_context(fake_client: FakeDaytona, tmp_path) -> None:
    context = task_environment(tmp_path / "environment")
    backend = DaytonaBackend(fast_config(), client=fake_client)
    spec = SandboxSpec(
        dockerfile=DOCKERFILE, context_dir=str(context), workdir=str(tmp_path / "w"), cpu=1.5
    )

    async def body() -> None:
        async with await backend.create(spec):
            pass

    run(body())
    (params,) = fake_client.created
    assert isinstance(params, CreateSandboxFromImageParams)
    assert params.resources == Resources(cpu=2, memory=2, disk=10)
    ((dockerfile, files),) = fake_client.builds
    assert dockerfile == DOCKERFILE
    assert files == {"app/main.py": b"print('hi')\n", "run.sh": b"#!/bin/sh\n"}


def test_another_dockerfile_is_built_from_a_copy_of_its_context(
    fake_client: FakeDaytona, tmp_path
) -> None:
    context = task_environment(tmp_path / "environment")
    replaced = DOCKERFILE.replace("RUN chmod", "RUN echo built && chmod")
    backend = DaytonaBackend(fast_config(), client=fake_client)
    spec = SandboxSpec(dockerfile=replaced, context_dir=str(context), workdir=str(tmp_path / "w"))

    async def body() -> None:
        async with await backend.create(spec):
            pass

    run(body())
    ((dockerfile, files),) = fake_client.builds
    assert dockerfile == replaced and sorted(files) == ["app/main.py", "run.sh"]
    assert (context / "Dockerfile").read_text() == DOCKERFILE
    no_context = SandboxSpec(dockerfile="FROM alpine\nRUN true\n", workdir=str(tmp_path / "w"))
    run(backend.create(no_context))
    assert fake_client.builds[1] == ("FROM alpine\nRUN true\n", {})


def test_a_dockerfile_copying_from_outside_its_context_or_a_missing_context_is_refused(
    tmp_path,
) -> None:
    backend = DaytonaBackend(fast_config())
    context = task_environment(tmp_path / "environment")
    escaping = SandboxSpec(dockerfile="FROM alpine\nCOPY ../secret /s\n", context_dir=str(context))
    with pytest.raises(errors.SandboxCreateError, match=r"build context .*environment"):
        backend.create_params(escaping, tmp_path / "scratch")
    missing = SandboxSpec(dockerfile=DOCKERFILE, context_dir=str(tmp_path / "nowhere"))
    with pytest.raises(errors.SandboxCreateError, match="nowhere is not a directory"):
        backend.create_params(missing, tmp_path / "scratch2")


def test_run_label_is_fresh_per_backend_unless_configured() -> None:
    first, second = DaytonaBackend(), DaytonaBackend()
    assert first.run_label != second.run_label and len(first.run_label) == 12
    assert DaytonaBackend(DaytonaSandboxConfig(run_label="r7")).run_label == "r7"


def test_create_sends_the_params_and_prepares_the_workdir(
    fake_client: FakeDaytona, tmp_path
) -> None:
    backend = DaytonaBackend(fast_config(create_timeout_s=123), client=fake_client)
    workdir = tmp_path / "deep" / "work"
    spec = SandboxSpec(image="alpine", workdir=str(workdir), memory_mb=4096)

    async def body() -> None:
        async with await backend.create(spec) as sb:
            assert (await sb.exec("pwd -P", timeout=10)).stdout == f"{workdir}\n"

    run(body())
    assert fake_client.created[0].resources == Resources(cpu=1, memory=4, disk=10)
    assert fake_client.create_timeouts == [123]
    assert workdir.is_dir()


@pytest.mark.skipif(
    os.geteuid() != 0,
    reason="the fake runs commands as local processes: switching users needs root",
)
def test_spec_env_is_exported_even_through_a_user_switch(
    fake_client: FakeDaytona, tmp_path
) -> None:
    backend = DaytonaBackend(fast_config(), client=fake_client)
    spec = SandboxSpec(workdir=str(tmp_path / "w"), env={"TASK_VAR": "a b"}, user="nobody")

    async def body() -> None:
        async with await backend.create(spec) as sb:
            r = await sb.exec('printf "%s|%s" "$(id -un)" "$TASK_VAR"', timeout=10)
            assert r.stdout == "nobody|a b"
            r = await sb.exec("id -un", timeout=10, user="root")
            assert r.stdout == "root\n"

    run(body())
    assert (tmp_path / "w").owner() == "nobody"


def test_invalid_env_name_and_nul_are_sandbox_errors(backend: DaytonaBackend, tmp_path) -> None:
    async def body() -> None:
        async with await backend.create(SandboxSpec(workdir=str(tmp_path / "w"))) as sb:
            with pytest.raises(errors.SandboxError, match="'A=B'"):
                await sb.exec("true", timeout=5, env={"A=B": "x"})
            with pytest.raises(errors.SandboxError, match="NUL"):
                await sb.exec("echo a\0b", timeout=5)

    run(body())


# ------------------------------------------------------------------ error taxonomy

TAXONOMY = [
    (DaytonaAuthenticationError("no key", status_code=401), "create", errors.SandboxAuthError),
    (DaytonaForbiddenError("denied", status_code=403), "other", errors.SandboxAuthError),
    (DaytonaFileAccessDeniedError("perm", status_code=403), "file", errors.SandboxError),
    (DaytonaRateLimitError("slow down", status_code=429), "create", errors.SandboxTransientError),
    (DaytonaConnectionError("reset"), "exec", errors.SandboxTransientError),
    (DaytonaInternalServerError("oops", status_code=500), "file", errors.SandboxTransientError),
    (
        DaytonaServiceUnavailableError("busy", status_code=503),
        "other",
        errors.SandboxTransientError,
    ),
    (DaytonaFileNotFoundError("no file", status_code=404), "file", errors.SandboxFileNotFound),
    (DaytonaNotFoundError("not found", status_code=404), "file", errors.SandboxFileNotFound),
    (DaytonaNotFoundError("Sandbox x not found", status_code=404), "file", errors.SandboxGone),
    (DaytonaNotFoundError("not found", status_code=404), "exec", errors.SandboxGone),
    (DaytonaGoneError("gone", status_code=410), "exec", errors.SandboxGone),
    (
        DaytonaProcessExecutionTimeoutError("slow", status_code=408),
        "exec",
        errors.SandboxCommandTimeout,
    ),
    (DaytonaTimeoutError("did not start"), "create", errors.SandboxStartTimeout),
    (DaytonaTimeoutError("gateway", status_code=504), "file", errors.SandboxTransientError),
    (DaytonaBadRequestError("bad image", status_code=400), "create", errors.SandboxCreateError),
    (DaytonaBadRequestError("is a directory", status_code=400), "file", errors.SandboxError),
    (DaytonaError("other"), "other", errors.SandboxError),
    (ConnectionResetError("reset"), "exec", errors.SandboxTransientError),
]


@pytest.mark.parametrize(("exc", "context", "expected"), TAXONOMY)
def test_sdk_errors_translate_to_the_taxonomy(exc: Exception, context: Any, expected: type) -> None:
    error = translate(exc, context=context, what="the call")
    assert type(error) is expected
    assert str(error).startswith(f"the call: daytona raised {type(exc).__name__}: {exc}")


def test_retry_after_header_is_read() -> None:
    limited = DaytonaRateLimitError("slow", status_code=429, headers={"Retry-After": "2.5"})
    assert retry_after_s(limited) == 2.5
    assert retry_after_s(DaytonaRateLimitError("slow", headers={"Retry-After": "soon"})) is None
    assert retry_after_s(DaytonaError("x")) is None


def test_file_errors_keep_the_sdk_exception_as_cause(
    backend: DaytonaBackend, fake_client, tmp_path
) -> None:
    denied = DaytonaAuthenticationError("token expired", status_code=401)

    async def body() -> None:
        async with await backend.create(SandboxSpec(workdir=str(tmp_path / "w"))) as sb:
            fake_client.faults["download_file"].append(denied)
            with pytest.raises(errors.SandboxAuthError) as caught:
                await sb.read_file("x")
            assert caught.value.__cause__ is denied
            with pytest.raises(errors.SandboxFileNotFound) as missing:
                await sb.read_file("x")
            assert isinstance(missing.value.__cause__, DaytonaFileNotFoundError)
            assert await sb.is_alive() is True

    run(body())


def test_a_sandbox_deleted_behind_our_back_is_gone(
    backend: DaytonaBackend, fake_client, tmp_path
) -> None:
    async def body() -> None:
        sb = await backend.create(SandboxSpec(workdir=str(tmp_path / "w")))
        await fake_client.sandboxes[sb.id].destroy()
        with pytest.raises(errors.SandboxGone) as caught:
            await sb.exec("true", timeout=5)
        assert isinstance(caught.value.__cause__, DaytonaNotFoundError)
        assert await sb.is_alive() is False
        await sb.close()

    run(body())


# ------------------------------------------------------------------ retries and rate limits


def test_creation_retries_transient_errors_then_succeeds(
    backend: DaytonaBackend, fake_client, tmp_path
) -> None:
    fake_client.faults["create"] += [
        DaytonaRateLimitError("slow down", status_code=429),
        DaytonaServiceUnavailableError("busy", status_code=503),
    ]

    async def body() -> None:
        async with await backend.create(SandboxSpec(workdir=str(tmp_path / "w"))) as sb:
            assert (await sb.exec("echo ok", timeout=5)).stdout == "ok\n"

    run(body())
    assert len(fake_client.calls_to("create")) == 3


def test_creation_gives_up_after_the_configured_retries(fake_client: FakeDaytona) -> None:
    backend = DaytonaBackend(fast_config(retries=1), client=fake_client)
    last = DaytonaConnectionError("reset again")
    fake_client.faults["create"] += [DaytonaConnectionError("reset"), last]
    with pytest.raises(errors.SandboxTransientError, match="gave up after 2 attempts") as caught:
        run(backend.create(SandboxSpec()))
    assert caught.value.__cause__ is last
    assert "raise `retries` in the [sandbox] config" in str(caught.value)
    assert len(fake_client.calls_to("create")) == 2


def test_auth_errors_are_not_retried(fake_client: FakeDaytona) -> None:
    backend = DaytonaBackend(fast_config(), client=fake_client)
    fake_client.faults["create"].append(DaytonaAuthenticationError("bad key", status_code=401))
    with pytest.raises(errors.SandboxAuthError):
        run(backend.create(SandboxSpec()))
    assert len(fake_client.calls_to("create")) == 1


def test_backoff_is_jittered_and_honours_retry_after(fake_client: FakeDaytona) -> None:
    slept: list[float] = []

    async def no_sleep(delay: float) -> None:
        slept.append(delay)

    config = fast_config(retries=3, retry_backoff_s=0.5, retry_backoff_max_s=4.0)
    backend = DaytonaBackend(config, client=fake_client, sleep=no_sleep)
    fake_client.faults["create"] += [
        DaytonaInternalServerError("e1", status_code=500),
        DaytonaRateLimitError("e2", status_code=429, headers={"retry-after": "3"}),
        DaytonaBadRequestError("e3", status_code=400),
    ]
    with pytest.raises(errors.SandboxCreateError):
        run(backend.create(SandboxSpec()))
    assert len(slept) == 2 and 0.0 <= slept[0] <= 0.5 and slept[1] == 3.0


def test_a_timed_out_start_deletes_the_half_created_sandbox(fake_client: FakeDaytona) -> None:
    backend = DaytonaBackend(fast_config(), client=fake_client)

    async def body() -> None:
        stale = await fake_client.create(CreateSandboxFromSnapshotParams(labels={}))
        timeout = DaytonaTimeoutError("did not start")
        timeout._attach_sandbox_id(stale.id)
        fake_client.faults["create"].append(timeout)
        with pytest.raises(errors.SandboxStartTimeout) as caught:
            await backend.create(SandboxSpec())
        assert caught.value.__cause__ is timeout
        assert stale.state == "destroyed"

    run(body())


def test_creations_are_paced(fake_client: FakeDaytona, tmp_path) -> None:
    backend = DaytonaBackend(fast_config(create_interval_s=0.1), client=fake_client)

    async def body() -> float:
        started = time.monotonic()
        made = await asyncio.gather(
            *(backend.create(SandboxSpec(workdir=str(tmp_path / f"w{i}"))) for i in range(4))
        )
        elapsed = time.monotonic() - started
        await backend.close()
        assert [await sb.is_alive() for sb in made] == [False] * 4
        return elapsed

    assert run(body()) >= 0.3 - 0.02


def test_exec_is_not_retried(backend: DaytonaBackend, fake_client, tmp_path) -> None:
    async def body() -> None:
        async with await backend.create(SandboxSpec(workdir=str(tmp_path / "w"))) as sb:
            before = len(fake_client.calls_to("exec"))
            fake_client.faults["exec"].append(DaytonaConnectionError("dropped"))
            with pytest.raises(errors.SandboxTransientError):
                await sb.exec("touch once", timeout=5)
            assert len(fake_client.calls_to("exec")) == before + 1

    run(body())


# ------------------------------------------------------------------ the session path


def session_backend(fake_client: FakeDaytona) -> DaytonaBackend:
    return DaytonaBackend(fast_config(session_threshold_s=0.5), client=fake_client)


def test_polling_survives_dropped_connections(fake_client: FakeDaytona, tmp_path) -> None:
    backend = session_backend(fake_client)

    async def body() -> None:
        async with await backend.create(SandboxSpec(workdir=str(tmp_path / "w"))) as sb:
            fake_client.faults["get_session_command"] += [
                DaytonaConnectionError("idle connection dropped"),
                DaytonaBadGatewayErrorLike(),
            ]
            r = await sb.exec("sleep 0.2; echo done; exit 3", timeout=10)
            assert (r.exit_code, r.stdout) == (3, "done\n")

    run(body())


class DaytonaBadGatewayErrorLike(DaytonaInternalServerError):
    def __init__(self) -> None:
        super().__init__("upstream reset", status_code=502)


def test_session_timeout_kills_the_group_and_deletes_the_session(
    fake_client: FakeDaytona, tmp_path
) -> None:
    backend = session_backend(fake_client)
    workdir = tmp_path / "w"

    async def body() -> None:
        async with await backend.create(SandboxSpec(workdir=str(workdir))) as sb:
            started = time.monotonic()
            with pytest.raises(errors.SandboxCommandTimeout) as caught:
                await sb.exec("echo $$ > pid; sleep 30", timeout=1.0)
            assert 0.9 <= time.monotonic() - started <= 4.0
            assert caught.value.timeout_s == 1.0
            pid = (workdir / "pid").read_text().strip()
            # A killed process whose parent died too may linger as a zombie until PID 1 reaps it.
            probe = f"grep -s ^State: /proc/{pid}/status | grep -qv Z && echo alive || echo gone"
            assert (await sb.exec(probe, timeout=5)).stdout == "gone\n"

    run(body())
    kills = [c for c in fake_client.calls_to("exec")]
    assert len(kills) == 1  # the kill; every command went through a session
    executed = len(fake_client.calls_to("execute_session_command"))
    assert len(fake_client.calls_to("delete_session")) == executed == 3


def test_direct_exec_daemon_timeout_maps_to_command_timeout(
    backend: DaytonaBackend, fake_client, tmp_path
) -> None:
    async def body() -> None:
        async with await backend.create(SandboxSpec(workdir=str(tmp_path / "w"))) as sb:
            fake_client.faults["exec"].append(
                DaytonaProcessExecutionTimeoutError("timed out", status_code=408)
            )
            with pytest.raises(errors.SandboxCommandTimeout):
                await sb.exec("sleep 1", timeout=5)

    run(body())


# ------------------------------------------------------------------ cleanup


def test_cleanup_deletes_only_the_runs_sandboxes(fake_client: FakeDaytona, tmp_path) -> None:
    ours = DaytonaBackend(fast_config(run_label="ours"), client=fake_client)
    theirs = DaytonaBackend(fast_config(run_label="theirs"), client=fake_client)

    async def body() -> None:
        kept = await theirs.create(SandboxSpec(workdir=str(tmp_path / "t")))
        leaked = [await ours.create(SandboxSpec(workdir=str(tmp_path / f"o{i}"))) for i in range(2)]
        deleted = await ours.cleanup()
        assert sorted(deleted) == sorted(sb.id for sb in leaked)
        assert list(fake_client.sandboxes) == [kept.id]
        assert await cleanup({"rllm-run": "theirs"}, client=fake_client) == [kept.id]
        assert fake_client.sandboxes == {}
        with pytest.raises(ValueError, match="at least one label"):
            await cleanup({}, client=fake_client)

    run(body())


# ------------------------------------------------------------------ the real SDK, offline


@pytest.fixture
def no_daytona_env(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    for name in ("DAYTONA_API_KEY", "DAYTONA_JWT_TOKEN", "DAYTONA_API_URL", "DAYTONA_TARGET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def test_missing_credentials_are_an_auth_error(no_daytona_env: None) -> None:
    with pytest.raises(errors.SandboxAuthError) as caught:
        run(DaytonaBackend(DaytonaSandboxConfig()).create(SandboxSpec()))
    assert isinstance(caught.value.__cause__, DaytonaAuthenticationError)


def test_the_guard_makes_real_sdk_calls_fail_in_milliseconds(no_daytona_env: None) -> None:
    async def direct() -> None:
        client = AsyncDaytona(
            DaytonaConfig(api_key="k", api_url="https://api.daytona.invalid/api", target="us")
        )
        try:
            with pytest.raises(DaytonaError):
                await client.get("some-sandbox")
        finally:
            await client.close()

    started = time.monotonic()
    with pytest.raises(OSError, match="blocked"):
        socket.create_connection(("203.0.113.9", 443), timeout=30)
    assert time.monotonic() - started < 0.05

    # The SDK retries a failed connection a few times with short pauses of its own.
    started = time.monotonic()
    run(direct())
    assert time.monotonic() - started < 3.0

    config = DaytonaSandboxConfig(api_key="k", api_url="https://api.daytona.invalid/api", retries=0)
    started = time.monotonic()
    with pytest.raises(errors.SandboxTransientError):
        run(DaytonaBackend(config).create(SandboxSpec(image="alpine")))
    assert time.monotonic() - started < 3.0
