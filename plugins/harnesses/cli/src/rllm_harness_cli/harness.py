"""The ``cli`` harness: install a command-line agent into the sandbox and run it once."""

from __future__ import annotations

import contextlib
import logging
import posixpath
import shlex
import time
from collections.abc import Callable, Iterator
from typing import Any

from rllm_core.errors import SandboxCommandTimeout, SandboxError, SandboxFileNotFound
from rllm_core.ports import Sandbox
from rllm_core.types import (
    ExecResult,
    HarnessOutcome,
    LLMEndpoint,
    NetworkPolicy,
    Task,
    Termination,
)

from rllm_harness_cli.outcome import OUTCOME_FILE, parse_outcome
from rllm_harness_cli.plugin import DEFAULT_ENV, CliConfig

__all__ = ["INSTALL_FILE", "INSTRUCTION_FILE", "CliHarness"]

log = logging.getLogger(__name__)

INSTRUCTION_FILE = "instruction.md"
INSTALL_FILE = "install.sh"
OUTPUT_TAIL_CHARS = 2000
_SETUP_TIMEOUT_S = 60.0
_NOT_STARTED = (126, 127)  # the shell could not execute or find the agent


class _Failed(Exception):
    """A step failed in a way that ends the episode with ``termination`` (a sandbox error
    unless said otherwise)."""

    def __init__(
        self,
        stage: str,
        message: str,
        *,
        termination: Termination = Termination.SANDBOX_ERROR,
        **details: Any,
    ) -> None:
        super().__init__(message)
        self.stage = stage
        self.termination = termination
        self.details = details


def _tail(result: ExecResult) -> str:
    text = result.stdout + result.stderr
    return text[-OUTPUT_TAIL_CHARS:]


class CliHarness:
    """Runs an agent that is a command-line program, once per episode.

    Steps, all in the task's sandbox:

    1. create ``agent_dir`` and remove a stale outcome file (as the agent user);
    2. upload the instruction to ``<agent_dir>/instruction.md``;
    3. when ``install`` is set, upload it to ``<agent_dir>/install.sh`` and run it with bash as
       ``install_user`` within ``install_timeout_s`` (this time is not part of the budget);
    4. run ``invocation`` as the task's agent user in its workdir, with the environment and
       the time budget ``min(task.agent_timeout_s, timeout_cap_s)``;
    5. read ``<agent_dir>/outcome.json`` (:mod:`rllm_harness_cli.outcome`).

    The termination: the outcome file's when the agent wrote a valid one (even when the
    invocation ran past the budget); otherwise ``TIMEOUT`` when the invocation ran past the
    budget, ``SANDBOX_ERROR`` when the agent could not be started (exit 126 or 127), else
    ``DONE``. A failed install (non-zero exit or past its timeout) and any sandbox failure are
    ``SANDBOX_ERROR`` with ``stage``, ``error`` and ``error_type`` in the metadata.

    The agent reaches the model over the network from inside the sandbox, so the harness
    declares ``sandbox_network`` (the ``network`` key): the rollout gives the sandbox at least
    that network and hands the harness the gateway URL as the sandbox reaches it.

    ``clock`` (seconds, monotonic) measures durations; tests pass a fake one.
    """

    def __init__(self, config: CliConfig, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.sandbox_network = NetworkPolicy(config.network)

    def time_budget(self, task: Task) -> float:
        """Seconds the invocation may run: the task's agent timeout, capped by
        ``timeout_cap_s`` when set."""
        cap = self.config.timeout_cap_s
        return task.agent_timeout_s if cap is None else min(task.agent_timeout_s, cap)

    def paths(self) -> dict[str, str]:
        agent_dir = self.config.agent_dir
        return {
            "agent_dir": agent_dir,
            "instruction_path": posixpath.join(agent_dir, INSTRUCTION_FILE),
            "install_path": posixpath.join(agent_dir, INSTALL_FILE),
            "outcome_path": posixpath.join(agent_dir, OUTCOME_FILE),
        }

    def values(self, task: Task, llm: LLMEndpoint) -> dict[str, str]:
        """The placeholder values of ``invocation`` and ``env`` for one episode."""
        paths = self.paths()
        return {
            "base_url": llm.base_url,
            "api_key": llm.api_key,
            "model": llm.model,
            "instruction_path": paths["instruction_path"],
            "outcome_path": paths["outcome_path"],
            "agent_dir": paths["agent_dir"],
            "workdir": task.environment.workdir if task.environment else "",
            "task_id": task.task_id,
            "timeout_s": f"{self.time_budget(task):g}",
        }

    def environment(self, task: Task, llm: LLMEndpoint) -> dict[str, str]:
        """The agent's environment variables: the defaults, then ``env``, filled in."""
        values = self.values(task, llm)
        templates = {**DEFAULT_ENV, **self.config.env}
        return {name: template.format(**values) for name, template in templates.items()}

    def command_line(self, task: Task, llm: LLMEndpoint) -> str:
        """``invocation`` with its placeholders replaced by shell-quoted values."""
        quoted = {name: shlex.quote(value) for name, value in self.values(task, llm).items()}
        return self.config.invocation.format(**quoted)

    async def run(self, task: Task, llm: LLMEndpoint, sandbox: Sandbox | None) -> HarnessOutcome:
        if sandbox is None:
            raise ValueError(
                f"the cli harness needs a sandbox for task {task.task_id!r}; give the task"
                " an environment and configure a sandbox backend"
            )
        budget = self.time_budget(task)
        metadata: dict[str, Any] = {"time_budget_s": budget}
        if sandbox.gateway_url is None and (
            task.environment is None or task.environment.network is NetworkPolicy.NONE
        ):
            warning = (
                f"the sandbox of task {task.task_id!r} was created without the network the"
                f" harness declares (sandbox_network = {self.sandbox_network.value!r}), so the"
                " agent may not reach the model; create it as the rollout does"
                " (rllm_core.rollout.network.sandbox_spec)"
            )
            log.warning(warning)
            metadata["warnings"] = [warning]
        try:
            return await self._run(task, llm, sandbox, budget, metadata)
        except _Failed as failed:
            metadata.update(stage=failed.stage, error=str(failed), **failed.details)
            return HarnessOutcome(termination=failed.termination, metadata=metadata)

    async def _run(
        self,
        task: Task,
        llm: LLMEndpoint,
        sandbox: Sandbox,
        budget: float,
        metadata: dict[str, Any],
    ) -> HarnessOutcome:
        paths = self.paths()
        env = self.environment(task, llm)
        workdir = task.environment.workdir if task.environment else None
        user = task.environment.user if task.environment else None

        with _stage("setup"):
            setup = await sandbox.exec(
                f"mkdir -p {shlex.quote(paths['agent_dir'])}"
                f" && rm -f {shlex.quote(paths['outcome_path'])}",
                timeout=_SETUP_TIMEOUT_S,
                user=user,
            )
            if setup.exit_code != 0:
                raise _Failed(
                    "setup",
                    f"could not prepare {paths['agent_dir']} in the sandbox"
                    f" (exit {setup.exit_code}): {_tail(setup).strip()}",
                    error_type="SetupFailed",
                )
            await sandbox.write_file(paths["instruction_path"], task.instruction.encode())

        if self.config.install is not None:
            metadata["install"] = await self._install(sandbox, paths, env, workdir)

        began = self.clock()
        timed_out = False
        result: ExecResult | None = None
        with _stage("invocation"):
            try:
                result = await sandbox.exec(
                    self.command_line(task, llm), timeout=budget, user=user, env=env, cwd=workdir
                )
            except SandboxCommandTimeout:
                timed_out = True
        metadata["duration_s"] = self.clock() - began
        metadata["timed_out"] = timed_out
        metadata["exit_code"] = result.exit_code if result is not None else None
        if result is not None:
            metadata["output_tail"] = _tail(result)

        with _stage("outcome"):
            try:
                data = await sandbox.read_file(paths["outcome_path"])
            except SandboxFileNotFound:
                data = None
        if data is not None:
            try:
                reported = parse_outcome(data)
            except ValueError as exc:
                metadata["outcome_file_error"] = f"{paths['outcome_path']}: {exc}"
            else:
                metadata["outcome_source"] = "file"
                if reported.metadata:
                    metadata["agent"] = reported.metadata
                return HarnessOutcome(
                    termination=reported.termination,
                    answer=reported.answer,
                    turns=reported.turns or 0,
                    metadata=metadata,
                )
        if timed_out:
            metadata["outcome_source"] = "elapsed"
            return HarnessOutcome(termination=Termination.TIMEOUT, metadata=metadata)
        assert result is not None
        metadata["outcome_source"] = "exit_code"
        if result.exit_code in _NOT_STARTED:
            metadata.update(
                stage="invocation",
                error=f"the agent could not be started (exit {result.exit_code});"
                " check that install puts it on the PATH and the invocation names it",
                error_type="AgentNotStarted",
            )
            return HarnessOutcome(termination=Termination.SANDBOX_ERROR, metadata=metadata)
        return HarnessOutcome(termination=Termination.DONE, metadata=metadata)

    async def _install(
        self,
        sandbox: Sandbox,
        paths: dict[str, str],
        env: dict[str, str],
        workdir: str | None,
    ) -> dict[str, Any]:
        assert self.config.install is not None
        timeout = self.config.install_timeout_s
        with _stage("install"):
            await sandbox.write_file(paths["install_path"], self.config.install.encode())
            began = self.clock()
            try:
                result = await sandbox.exec(
                    f"bash {shlex.quote(paths['install_path'])}",
                    timeout=timeout,
                    user=self.config.install_user,
                    env=env,
                    cwd=workdir,
                )
            except SandboxCommandTimeout as exc:
                raise _Failed(
                    "install",
                    f"the install script ran past its {timeout:g} s timeout;"
                    " raise install_timeout_s or make the script faster",
                    termination=Termination.AGENT_SETUP_TIMEOUT,
                    error_type=type(exc).__name__,
                ) from None
        record = {"exit_code": result.exit_code, "duration_s": self.clock() - began}
        if result.exit_code != 0:
            raise _Failed(
                "install",
                f"the install script failed with exit code {result.exit_code}",
                error_type="InstallFailed",
                install=record,
                output_tail=_tail(result),
            )
        return record


@contextlib.contextmanager
def _stage(stage: str) -> Iterator[None]:
    """Turns a ``SandboxError`` raised inside into :class:`_Failed` for ``stage``."""
    try:
        yield
    except SandboxError as exc:
        raise _Failed(stage, str(exc), error_type=type(exc).__name__) from exc
