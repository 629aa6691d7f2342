"""The ``shell`` harness: a terminal agent that runs one command per turn in the sandbox."""

from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import Callable
from typing import Any

from rllm_core.errors import SandboxCommandTimeout, SandboxError
from rllm_core.kit.chat import ModelCallError, chat, open_client
from rllm_core.ports import Sandbox
from rllm_core.types import HarnessOutcome, LLMEndpoint, Task, Termination

from rllm_harness_shell.observation import command_output, truncate_middle
from rllm_harness_shell.plugin import ShellConfig
from rllm_harness_shell.reply import parse_reply

__all__ = ["ShellHarness"]


class _Ended(Exception):
    """Ends the episode loop with a termination and extra metadata."""

    def __init__(self, termination: Termination, **details: Any) -> None:
        super().__init__(termination.value)
        self.termination = termination
        self.details = details


class ShellHarness:
    """Runs a Harbor-style task as a conversation of shell commands.

    Each turn the model's reply is parsed (:mod:`rllm_harness_shell.reply`); its command runs
    with ``sandbox.exec(command, timeout, cwd=<task workdir>, user=<task agent user>)`` and the
    exit code and output (cut to ``max_output_chars``) come back as the next user message. A
    reply without a command gets the format reminder; it counts as a turn.

    The episode ends with:

    - ``DONE``: a reply holds the done marker (a command in the same reply runs first);
    - ``MAX_TURNS``: ``max_turns`` model calls were made;
    - ``TIMEOUT``: the time budget, ``min(task.agent_timeout_s, timeout_cap_s)``, ran out,
      during a model call, a command or between turns;
    - ``CONTEXT_LENGTH``: the endpoint refused the prompt as too long;
    - ``MODEL_ERROR``: a model call failed, or every reply of the episode was empty (this
      replaces ``MAX_TURNS`` and ``TIMEOUT``);
    - ``SANDBOX_ERROR``: the sandbox failed (any ``SandboxError`` other than a command passing
      ``command_timeout_s``, which the model is told about and the episode goes on);
      ``error`` and ``error_type`` in the metadata.

    Metadata: ``commands`` (one entry per command run: ``command``, ``exit_code`` (``None``
    when killed at its timeout), ``timed_out``, ``duration_s``, ``output_chars``,
    ``cut_chars``, ``sandbox_truncated``), ``format_reminders``, ``empty_replies``,
    ``time_budget_s``, ``elapsed_s``, and the error details of a failed model call or sandbox.

    ``clock`` (seconds, monotonic) measures the budget; tests pass a fake one.
    """

    def __init__(
        self, config: ShellConfig | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.config = config or ShellConfig()
        self.clock = clock

    def time_budget(self, task: Task) -> float:
        """Seconds the episode may take: the task's agent timeout, capped by
        ``timeout_cap_s`` when set."""
        cap = self.config.timeout_cap_s
        return task.agent_timeout_s if cap is None else min(task.agent_timeout_s, cap)

    def first_messages(self, task: Task) -> list[dict[str, Any]]:
        """The system prompt (when configured) and the instruction message."""
        config = self.config
        workdir = task.environment.workdir if task.environment else "the working directory"
        messages: list[dict[str, Any]] = []
        if config.system_prompt is not None:
            system = config.system_prompt.format(
                workdir=workdir,
                done_marker=config.done_marker,
                max_turns=config.max_turns,
                command_timeout_s=config.command_timeout_s,
            )
            messages.append({"role": "system", "content": system})
        instruction = config.instruction_template.format(
            instruction=task.instruction, task_id=task.task_id, workdir=workdir
        )
        messages.append({"role": "user", "content": instruction})
        return messages

    async def run(self, task: Task, llm: LLMEndpoint, sandbox: Sandbox | None) -> HarnessOutcome:
        if sandbox is None:
            raise ValueError(
                f"the shell harness needs a sandbox for task {task.task_id!r}; give the task"
                " an environment and configure a sandbox backend"
            )
        budget = self.time_budget(task)
        started = self.clock()
        episode = _Episode(self, task, llm, sandbox, deadline=started + budget)
        client = open_client(
            llm, timeout_s=self.config.request_timeout_s, max_retries=self.config.max_retries
        )
        try:
            termination, details = await episode.play(client)
        finally:
            await client.close()
        if (
            termination in (Termination.MAX_TURNS, Termination.TIMEOUT)
            and episode.turns > 0
            and episode.empty_replies == episode.turns
        ):
            details = {**details, "error": f"all {episode.turns} replies were empty"}
            termination = Termination.MODEL_ERROR
        metadata = {
            "commands": episode.commands,
            "format_reminders": episode.format_reminders,
            "empty_replies": episode.empty_replies,
            "time_budget_s": budget,
            "elapsed_s": self.clock() - started,
            **details,
        }
        return HarnessOutcome(termination=termination, turns=episode.turns, metadata=metadata)


class _Episode:
    """The state of one run: the conversation and what has happened so far."""

    def __init__(
        self,
        harness: ShellHarness,
        task: Task,
        llm: LLMEndpoint,
        sandbox: Sandbox,
        *,
        deadline: float,
    ) -> None:
        self.config = harness.config
        self.clock = harness.clock
        self.llm = llm
        self.sandbox = sandbox
        self.deadline = deadline
        self.workdir = task.environment.workdir if task.environment else None
        self.user = task.environment.user if task.environment else None
        self.messages = harness.first_messages(task)
        self.turns = 0
        self.empty_replies = 0
        self.format_reminders = 0
        self.commands: list[dict[str, Any]] = []

    def remaining(self) -> float:
        return self.deadline - self.clock()

    async def play(self, client: Any) -> tuple[Termination, dict[str, Any]]:
        try:
            while True:
                await self.turn(client)
        except _Ended as ended:
            return ended.termination, ended.details

    async def turn(self, client: Any) -> None:
        config = self.config
        if self.turns >= config.max_turns:
            raise _Ended(Termination.MAX_TURNS)
        remaining = self.remaining()
        if remaining <= 0:
            raise _Ended(Termination.TIMEOUT)
        try:
            reply = await asyncio.wait_for(
                chat(client, self.llm.model, self.messages, max_tokens=config.max_tokens),
                timeout=remaining,
            )
        except TimeoutError:
            raise _Ended(Termination.TIMEOUT) from None
        except ModelCallError as exc:
            raise _Ended(exc.termination, **exc.details) from None
        self.turns += 1
        self.messages.append(reply.as_message())
        if not reply.content.strip():
            self.empty_replies += 1
        parsed = parse_reply(reply.content, config.done_marker)
        if parsed.command is None:
            if parsed.done:
                raise _Ended(Termination.DONE)
            self.format_reminders += 1
            self.say(config.format_reminder.format(done_marker=config.done_marker))
            return
        observation = await self.execute(parsed.command)
        if parsed.done:
            raise _Ended(Termination.DONE)
        self.say(observation)

    def say(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    async def execute(self, command: str) -> str:
        """Run one command; return what the model is told about it."""
        config = self.config
        remaining = self.remaining()
        if remaining <= 0:
            raise _Ended(Termination.TIMEOUT)
        limited_by_budget = remaining < config.command_timeout_s
        timeout = remaining if limited_by_budget else config.command_timeout_s
        record: dict[str, Any] = {"command": command}
        self.commands.append(record)
        line = command if config.shell is None else f"{config.shell} -c {shlex.quote(command)}"
        began = self.clock()
        try:
            result = await self.sandbox.exec(
                line, timeout=timeout, cwd=self.workdir, user=self.user
            )
        except SandboxCommandTimeout:
            record.update(exit_code=None, timed_out=True, duration_s=self.clock() - began)
            if limited_by_budget:
                raise _Ended(Termination.TIMEOUT) from None
            return config.command_timeout_template.format(timeout_s=timeout, command=command)
        except SandboxError as exc:
            record.update(exit_code=None, timed_out=False, duration_s=self.clock() - began)
            raise _Ended(
                Termination.SANDBOX_ERROR, error=str(exc), error_type=type(exc).__name__
            ) from None
        text = command_output(result)
        shown, cut = truncate_middle(text, config.max_output_chars, config.truncation_marker)
        record.update(
            exit_code=result.exit_code,
            timed_out=False,
            duration_s=result.duration_s,
            output_chars=len(text),
            cut_chars=cut,
            sandbox_truncated=result.truncated,
        )
        return config.observation_template.format(
            exit_code=result.exit_code, output=shown or config.empty_output, command=command
        )
