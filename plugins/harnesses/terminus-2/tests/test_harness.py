"""The harness end to end: harbor's Terminus-2 in the side environment against the real
gateway (a scripted fake model over the toy renderer), its tmux session in the real local
sandbox (plain subprocesses in a folder). Each known pitfall of running the agent this way
has a test here."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from rllm_core.cache import CACHE_ENV
from rllm_core.errors import UpstreamError
from rllm_core.plugins import PluginManager
from rllm_core.sidevenvs import InterpreterNotFound
from rllm_core.types import HarnessOutcome, SandboxSpec, Task, Termination
from rllm_harness_terminus_2.harness import Terminus2Harness
from rllm_harness_terminus_2.plugin import Terminus2Config
from rllm_harness_terminus_2.testing import json_reply, xml_reply

pytestmark = pytest.mark.usefixtures("side_python")


def build(**config: Any) -> Terminus2Harness:
    config.setdefault("max_retries", 0)
    config.setdefault("request_timeout_s", 20.0)
    return Terminus2Harness(Terminus2Config(**config))


def make_task(workdir: Path, *, user: str | None = None, timeout_s: float = 60.0) -> Task:
    workdir.mkdir(parents=True, exist_ok=True)
    return Task(
        task_id="make-file",
        instruction="Create made.txt.",
        environment=SandboxSpec(workdir=str(workdir), user=user),
        agent_timeout_s=timeout_s,
    )


async def play_in(
    harness: Terminus2Harness,
    server: Any,
    task: Task,
    *,
    session: str = "episode-1",
    wrap: Callable[[Any], Any] | None = None,
) -> HarnessOutcome:
    backend = (
        PluginManager(disabled=()).get("sandbox_backend", "local").build({"isolation": "none"})
    )
    try:
        sandbox = await backend.create(task.environment)
        if wrap is not None:
            sandbox = wrap(sandbox)
        return await harness.run(task, server.endpoint(session), sandbox)
    finally:
        await backend.close()


def play(harness: Terminus2Harness, server: Any, task: Task, **options: Any) -> HarnessOutcome:
    # The harness is not closed: the process's driver serves the next test too.
    return asyncio.run(play_in(harness, server, task, **options))


def tmux_servers(tmux_dir: str, settle_s: float = 1.0) -> list[int]:
    """The tmux servers started with ``TMUX_TMPDIR=tmux_dir`` still alive ``settle_s`` after
    the call (a killed server takes a moment to exit)."""
    deadline = time.monotonic() + settle_s
    while (found := _tmux_servers(tmux_dir)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def _tmux_servers(tmux_dir: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != "tmux: server":
                continue
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"TMUX_TMPDIR={tmux_dir}".encode() in environ:
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize("reply", [json_reply, xml_reply], ids=["json", "xml"])
def test_the_agent_types_a_command_then_confirms_completion(gateway, store, tmp_path, reply):
    server, sampler = gateway(
        [reply("echo made > made.txt"), reply(complete=True), reply(complete=True)]
    )
    task = make_task(tmp_path / "w")
    outcome = play(build(parser="json" if reply is json_reply else "xml"), server, task)
    assert (outcome.termination, outcome.turns) == (Termination.DONE, 3)
    assert (tmp_path / "w" / "made.txt").read_text() == "made\n"
    assert outcome.metadata["commands"] == ["echo made > made.txt\n"]
    assert outcome.metadata["agent_turns"] == 3
    assert outcome.metadata["harbor"] == "0.26.0"
    # Every tmux probe and keystroke went through the sandbox.
    assert outcome.metadata["bridge_execs"] == outcome.metadata["environment_commands"] > 5
    assert len(store.session("episode-1")) == 3 and sampler.calls == 3


def test_after_the_episode_no_tmux_server_or_folder_is_left(gateway, tmp_path):
    server, _ = gateway(
        [json_reply("sleep 300"), json_reply(complete=True), json_reply(complete=True)]
    )
    outcome = play(build(), server, make_task(tmp_path / "w"))
    assert outcome.termination is Termination.DONE
    tmux_dir = outcome.metadata["tmux_tmpdir"]
    assert not Path(tmux_dir).exists()
    assert tmux_servers(tmux_dir) == []


def test_concurrent_episodes_share_one_driver_but_not_a_tmux_server(gateway, tmp_path):
    server, _ = gateway(
        lambda request: json_reply(f"echo {request.session_id} > mine.txt", complete=True)
    )
    harness = build()
    tasks = [make_task(tmp_path / f"w{i}") for i in range(3)]

    async def body() -> list[HarnessOutcome]:
        return await asyncio.gather(
            *(play_in(harness, server, t, session=f"s{i}") for i, t in enumerate(tasks))
        )

    outcomes = asyncio.run(body())
    assert [o.termination for o in outcomes] == [Termination.DONE] * 3
    for i in range(3):
        assert (tmp_path / f"w{i}" / "mine.txt").read_text() == f"s{i}\n"
    assert len({o.metadata["tmux_tmpdir"] for o in outcomes}) == 3
    assert len({o.metadata["driver_pid"] for o in outcomes}) == 1


def test_the_agent_shell_sees_the_plan_env_but_never_the_session_key(gateway, tmp_path):
    server, _ = gateway(
        [json_reply("env > env.txt"), json_reply(complete=True), json_reply(complete=True)]
    )
    outcome = play(build(env={"GREETING": "hello"}), server, make_task(tmp_path / "w"))
    assert outcome.termination is Termination.DONE
    shell_env = (tmp_path / "w" / "env.txt").read_text()
    assert "GREETING=hello" in shell_env.splitlines()
    assert server.token and server.token not in shell_env
    assert server.session_token("episode-1") not in shell_env


def test_replies_cut_at_max_tokens_end_at_the_cap_on_model_calls(gateway, toy, tmp_path):
    # A reply without its stop token is cut at max_tokens: the agent re-prompts it without
    # counting a turn, so only the cap on model calls ends the episode.
    cut = toy.encode('{"analysis": "Thinking about it for a long')
    server, sampler = gateway(lambda request: cut)
    began = time.monotonic()
    outcome = play(build(max_turns=3, max_model_calls=5), server, make_task(tmp_path / "w"))
    assert (outcome.termination, outcome.turns) == (Termination.MAX_TURNS, 5)
    assert outcome.metadata["limit"] == "model_calls"
    assert outcome.metadata["cut_replies"] == 5 and sampler.calls == 5
    assert time.monotonic() - began < 45


def test_unparsable_replies_in_a_row_end_with_format_error(gateway, tmp_path):
    server, _ = gateway(lambda request: "I will just talk, with no JSON at all.")
    outcome = play(build(max_consecutive_format_errors=2), server, make_task(tmp_path / "w"))
    assert (outcome.termination, outcome.turns) == (Termination.FORMAT_ERROR, 2)
    assert outcome.metadata["format_errors"] == 2


def test_without_a_format_error_limit_the_turn_limit_ends_it(gateway, tmp_path):
    server, _ = gateway(lambda request: "no JSON here")
    outcome = play(
        build(max_consecutive_format_errors=0, max_turns=3), server, make_task(tmp_path / "w")
    )
    assert (outcome.termination, outcome.turns) == (Termination.MAX_TURNS, 3)
    assert outcome.metadata["limit"] == "turns"


def test_the_gateways_prompt_too_long_ends_with_context_length_at_once(gateway, tmp_path):
    server, sampler = gateway([json_reply("ls")], max_prompt_tokens=50)
    began = time.monotonic()
    outcome = play(build(max_retries=2), server, make_task(tmp_path / "w"))
    assert (outcome.termination, outcome.turns) == (Termination.CONTEXT_LENGTH, 0)
    assert sampler.calls == 0 and outcome.metadata["retries"] == 0
    assert time.monotonic() - began < 30


def test_a_failing_model_server_is_retried_then_ends_with_model_error(gateway, tmp_path):
    server, sampler = gateway([UpstreamError("the worker fell over")] * 3)
    outcome = play(build(max_retries=2), server, make_task(tmp_path / "w"))
    assert (outcome.termination, outcome.turns) == (Termination.MODEL_ERROR, 0)
    assert outcome.metadata["status"] == 502 and outcome.metadata["retries"] == 2
    assert sampler.calls == 3


def test_the_time_budget_ends_with_timeout(gateway, tmp_path):
    server, _ = gateway([json_reply("sleep 30", duration=30)])
    began = time.monotonic()
    outcome = play(build(timeout_cap_s=2.0), server, make_task(tmp_path / "w"))
    assert time.monotonic() - began < 25
    assert outcome.termination is Termination.TIMEOUT
    assert outcome.metadata["time_budget_s"] == 2.0
    assert tmux_servers(outcome.metadata["tmux_tmpdir"]) == []


class _Recording:
    """A sandbox that records the user each command asked for and runs it as the caller."""

    def __init__(
        self,
        sandbox: Any,
        users: list[str | None],
        path: str | None = None,
        commands: list[str] | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.users = users
        self.path = path
        self.commands = [] if commands is None else commands

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sandbox, name)

    async def exec(self, command: str, timeout: float, user: str | None = None, **kw: Any):
        self.users.append(user)
        self.commands.append(command)
        if self.path is not None:
            kw["env"] = {**(kw.get("env") or {}), "PATH": self.path}
        return await self.sandbox.exec(command, timeout, None, **kw)


def test_every_command_runs_as_the_tasks_agent_user(gateway, tmp_path):
    # Terminus-2 asks for root to probe tmux; the sandbox must only see the task's user.
    server, _ = gateway([json_reply("true", complete=True), json_reply(complete=True)])
    users: list[str | None] = []
    task = make_task(tmp_path / "w", user="nobody")
    outcome = play(build(), server, task, wrap=lambda s: _Recording(s, users))
    assert outcome.termination is Termination.DONE
    assert len(users) > 5 and set(users) == {"nobody"}


def test_a_sandbox_without_tmux_fails_fast_before_the_agent_starts(gateway, tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()
    for program in ("mkdir", "rm"):
        (bare / program).symlink_to(f"/bin/{program}")
    server, sampler = gateway([json_reply("true")])
    users: list[str | None] = []
    commands: list[str] = []
    began = time.monotonic()
    outcome = play(
        build(),
        server,
        make_task(tmp_path / "w"),
        wrap=lambda s: _Recording(s, users, str(bare), commands),
    )
    assert time.monotonic() - began < 10
    assert outcome.termination is Termination.SANDBOX_ERROR
    assert "tmux is not installed" in outcome.metadata["error"]
    assert sampler.calls == 0 and "driver_pid" not in outcome.metadata
    made = commands[0].split()[2]
    assert made.startswith("/tmp/rllm-tmux-") and not Path(made).exists()


def test_a_driver_that_dies_is_a_sandbox_error_and_the_next_episode_starts_a_new_one(
    gateway, tmp_path
):
    server, sampler = gateway(
        [json_reply("true"), json_reply(complete=True), json_reply(complete=True)], delay_s=1.0
    )
    harness = build()

    async def body() -> tuple[HarnessOutcome, HarnessOutcome, int, int]:
        try:
            run = asyncio.ensure_future(play_in(harness, server, make_task(tmp_path / "a")))
            while sampler.calls < 1:
                await asyncio.sleep(0.05)
            first_pid = harness._driver.process.pid
            os.kill(first_pid, signal.SIGKILL)
            died = await run
            again = await play_in(harness, server, make_task(tmp_path / "b"), session="s2")
            return died, again, first_pid, harness._driver.process.pid
        finally:
            await harness.close()

    died, again, first_pid, second_pid = asyncio.run(body())
    assert died.termination is Termination.SANDBOX_ERROR and died.termination.is_infrastructure
    assert died.metadata["error_type"] == "DriverDied"
    assert "driver" in died.metadata["error"] and "exit code -9" in died.metadata["error"]
    assert again.termination is Termination.DONE and second_pid != first_pid


def test_a_plan_python_too_old_is_refused_with_the_key():
    with pytest.raises(ValidationError, match=r"/usr/bin/python3\.11, is Python 3\.11"):
        Terminus2Config(python="/usr/bin/python3.11")


def test_no_interpreter_new_enough_is_a_clear_error_naming_what_was_tried(
    gateway, tmp_path, monkeypatch
):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "no-pyenv"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    server, sampler = gateway([json_reply("true")])
    with pytest.raises(InterpreterNotFound) as raised:
        play(build(), server, make_task(tmp_path / "w"))
    message = str(raised.value)
    assert "python3.12 (not on PATH)" in message and "pyenv's versions folder" in message
    assert "pyenv install 3.12" in message and sampler.calls == 0
