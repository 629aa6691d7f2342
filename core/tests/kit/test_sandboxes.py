"""The sandbox kit: closing on ``async with`` exit, the SDK error map, transient retries, a
timed-out command's error and a directory listing."""

from __future__ import annotations

import asyncio

import pytest
from rllm_core import errors
from rllm_core.kit.retry import RetrySettings
from rllm_core.kit.sandboxes import (
    ClosesOnExit,
    ErrorMap,
    command_timed_out,
    listing,
    retry_transient,
)
from rllm_core.types import FileInfo


class Closable(ClosesOnExit):
    def __init__(self) -> None:
        self.closed = 0

    async def close(self) -> None:
        self.closed += 1


def test_async_with_gives_the_object_and_closes_it_even_on_error():
    async def body() -> Closable:
        thing = Closable()
        with pytest.raises(RuntimeError):
            async with thing as entered:
                assert entered is thing
                raise RuntimeError("boom")
        return thing

    assert asyncio.run(body()).closed == 1


class AuthFailed(Exception):
    pass


class Missing(Exception):
    pass


class FileMissing(Missing):
    pass


class Deadline(Exception):
    pass


ERRORS = ErrorMap(
    service="svc",
    auth_hint="set SVC_TOKEN",
    create_hint="check the image",
    auth=(AuthFailed,),
    file_not_found=(FileMissing,),
    gone=(Missing,),
    command_timeout=(Deadline,),
    transient=(ConnectionError, OSError),
)


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (AuthFailed("401"), errors.SandboxAuthError),
        (FileMissing("/x"), errors.SandboxFileNotFound),
        (Missing("sandbox"), errors.SandboxGone),
        (Deadline("late"), errors.SandboxCommandTimeout),
        (ConnectionResetError("reset"), errors.SandboxTransientError),
        (ValueError("odd"), errors.SandboxError),
    ],
)
def test_the_first_matching_class_decides_the_error(exc, expected):
    error = ERRORS.translate(exc, "read_file /x")
    assert type(error) is expected
    assert str(error).startswith(f"read_file /x: svc raised {type(exc).__name__}: {exc}")


def test_auth_and_create_hints_and_errors_passed_through():
    assert str(ERRORS.translate(AuthFailed("no"), "create")).endswith("; set SVC_TOKEN")
    created = ERRORS.translate(ValueError("cpu"), "create", creating=True)
    assert type(created) is errors.SandboxCreateError and str(created).endswith("; check the image")
    assert type(ERRORS.translate(Missing("x"), "create", creating=True)) is errors.SandboxGone
    ours = errors.SandboxGone("already ours")
    assert ERRORS.translate(ours, "anything") is ours


def settings(retries: int) -> RetrySettings:
    return RetrySettings(retries=retries, retry_backoff_s=0.0, retry_backoff_max_s=0.0)


async def no_sleep(seconds: float) -> None:
    return None


def test_transient_errors_are_retried_until_the_call_succeeds():
    attempts = []

    async def call() -> str:
        attempts.append(1)
        if len(attempts) < 3:
            raise errors.SandboxTransientError("flaky")
        return "ok"

    result = asyncio.run(retry_transient(call, settings(3), what="x", sleep=no_sleep))
    assert result == "ok" and len(attempts) == 3


def test_spent_retries_say_how_many_attempts_and_keep_the_cause():
    cause = ConnectionResetError("peer")

    async def call() -> None:
        try:
            raise cause
        except OSError as exc:
            raise errors.SandboxTransientError("lost") from exc

    with pytest.raises(errors.SandboxTransientError, match="gave up after 3 attempts") as caught:
        asyncio.run(retry_transient(call, settings(2), what="x", sleep=no_sleep))
    assert caught.value.__cause__ is cause
    with pytest.raises(errors.SandboxTransientError) as once:
        asyncio.run(retry_transient(call, settings(0), what="x", sleep=no_sleep))
    assert str(once.value) == "lost"


def test_other_errors_are_raised_at_once():
    attempts = []

    async def call() -> None:
        attempts.append(1)
        raise errors.SandboxGone("gone")

    with pytest.raises(errors.SandboxGone):
        asyncio.run(retry_transient(call, settings(3), what="x", sleep=no_sleep))
    assert len(attempts) == 1


def test_a_timed_out_command_names_itself_its_timeout_and_its_place():
    error = command_timed_out("sleep 100", 30.0, "in svc sandbox sb-1")
    assert type(error) is errors.SandboxCommandTimeout
    assert str(error) == (
        "'sleep 100' ran past its 30 s timeout in svc sandbox sb-1 and its process group was"
        " killed; raise the timeout or make the command finish sooner"
    )
    assert (error.command, error.timeout_s) == ("sleep 100", 30.0)
    assert "0.5 s timeout and its process group" in str(command_timed_out("true", 0.5))


def test_a_long_command_is_cut_in_the_message_but_kept_whole_on_the_error():
    command = "echo " + "x" * 500
    error = command_timed_out(command, 1.0)
    assert repr(command[:200]) in str(error) and "x" * 196 not in str(error)
    assert error.command == command


def test_a_listing_puts_each_entry_under_the_directory_sorted_by_path():
    entries = [("b.txt", 3, False), ("a", 0, True), ("C", "12", 0)]
    assert listing("/app", entries) == [
        FileInfo(path="/app/C", size=12, is_dir=False),
        FileInfo(path="/app/a", size=0, is_dir=True),
        FileInfo(path="/app/b.txt", size=3, is_dir=False),
    ]
    assert listing("/app/", [("x", 1, 1)]) == [FileInfo(path="/app/x", size=1, is_dir=True)]
    assert listing("/empty", iter(())) == []
