"""The ``mini-swe-agent`` harness: mini-swe-agent's ``DefaultAgent`` on an rllm episode."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from rllm_core.errors import SandboxError
from rllm_core.ports import Sandbox
from rllm_core.types import HarnessOutcome, LLMEndpoint, Task, Termination

from rllm_harness_mini_swe_agent.bridge import LoopBridge, Stopped
from rllm_harness_mini_swe_agent.plugin import MiniSweAgentConfig

__all__ = ["MiniSweAgentHarness"]

_SETTLE_S = 3.0
"""How long a stopped episode waits for the sandbox to clean up a cancelled command: briefly,
as a cancelled run must end promptly."""
_UNAME = "uname -s; uname -r; uname -v; uname -m"
_UNAME_KEYS = ("system", "release", "version", "machine")


def _library() -> Any:
    """Import mini-swe-agent and litellm (seconds of CPU: in the agent's thread, never on
    the event loop) without their start-up banner and network fetch of a price list."""
    os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    from rllm_harness_mini_swe_agent import library

    return library


class MiniSweAgentHarness:
    """Runs one task with mini-swe-agent's ``DefaultAgent``, unchanged.

    The agent is built from the library's default config for the model class (``mini.yaml``
    or ``mini_textbased.yaml``, or ``config_file``), with the plugin's keys over it. Its model
    is the library's litellm model on ``openai/<llm.model>`` at ``llm.base_url``; its
    environment runs each command in ``sandbox`` as the task's agent user, in the task's
    workdir (:class:`~rllm_harness_mini_swe_agent.environment.SandboxEnvironment`). The agent's
    loop is synchronous and runs in a thread of its own per episode; sandbox calls go back to
    the event loop.

    ``model_class = "auto"`` starts with tool calls; when the gateway refuses the first
    request because its renderer cannot render tools, nothing was sampled, and the episode
    starts over with the text-based model. The choice is kept for the harness's later
    episodes.

    The episode ends as :mod:`rllm_harness_mini_swe_agent.termination` maps it. ``turns`` is
    the model calls the model answered. The time budget is ``min(task.agent_timeout_s,
    timeout_cap_s)``: the agent's own ``wall_time_limit_seconds`` (checked before each model
    call) and a hard stop at the budget, during a model call or a command, both end the
    episode with ``TIMEOUT``. Cancelling the run stops the agent's thread at its next call and
    cancels the sandbox command in flight.

    Metadata: ``model_class``, ``exit_status``, ``commands`` (``command``, ``returncode``
    (``None`` when killed), ``timed_out``, ``duration_s``, ``truncated``), ``format_errors``,
    ``time_budget_s``, ``elapsed_s``, ``limit`` after a ``LimitsExceeded``, and ``error`` /
    ``error_type`` / ``status`` after a failure.
    """

    def __init__(self, config: MiniSweAgentConfig | None = None) -> None:
        self.config = config or MiniSweAgentConfig()
        self.model_class: str | None = (
            None if self.config.model_class == "auto" else self.config.model_class
        )

    def time_budget(self, task: Task) -> float:
        """Seconds the episode may take: the task's agent timeout, capped by
        ``timeout_cap_s`` when set."""
        cap = self.config.timeout_cap_s
        return task.agent_timeout_s if cap is None else min(task.agent_timeout_s, cap)

    async def run(self, task: Task, llm: LLMEndpoint, sandbox: Sandbox | None) -> HarnessOutcome:
        if sandbox is None:
            raise ValueError(
                f"the mini-swe-agent harness needs a sandbox for task {task.task_id!r}; give"
                " the task an environment and configure a sandbox backend"
            )
        budget = self.time_budget(task)
        started = time.monotonic()
        user = task.environment.user if task.environment else None
        try:
            uname = await self._uname(sandbox, user)
        except SandboxError as exc:
            return HarnessOutcome(
                termination=Termination.SANDBOX_ERROR,
                metadata={"error": str(exc), "error_type": type(exc).__name__},
            )
        loop = asyncio.get_running_loop()
        bridge = LoopBridge(loop)
        episode = _Episode(self, task, llm, sandbox, bridge, user=user, uname=uname, budget=budget)
        finished: asyncio.Future[None] = loop.create_future()
        thread = threading.Thread(
            target=episode.play,
            args=(loop, finished),
            name=f"mini-swe-agent:{task.task_id}",
            daemon=True,
        )
        thread.start()
        try:
            async with asyncio.timeout(budget):
                await finished
        except TimeoutError:
            episode.timed_out = True
        finally:
            # Cancelled or out of time: the thread stops at its next model call or command,
            # and the sandbox finishes stopping the command in flight before the run ends.
            bridge.stop()
            await bridge.settle(_SETTLE_S)
        outcome = episode.outcome()
        outcome.metadata.update(time_budget_s=budget, elapsed_s=time.monotonic() - started)
        return outcome

    async def _uname(self, sandbox: Sandbox, user: str | None) -> dict[str, str]:
        """The sandbox's system for the agent's templates (``{{system}}``, ``{{machine}}``...):
        the library would describe the host. ``unknown`` when ``uname`` is missing."""
        result = await sandbox.exec(_UNAME, timeout=30.0, user=user)
        lines = result.stdout.splitlines() if result.exit_code == 0 else []
        if len(lines) != len(_UNAME_KEYS):
            lines = ["unknown"] * len(_UNAME_KEYS)
        return dict(zip(_UNAME_KEYS, lines, strict=True))


@dataclass
class _Episode:
    """One run of the agent in its thread, and what it left behind."""

    harness: MiniSweAgentHarness
    task: Task
    llm: LLMEndpoint
    sandbox: Sandbox
    bridge: LoopBridge
    user: str | None
    uname: dict[str, str]
    budget: float
    agent: Any = None
    model_class: str | None = None
    exit_info: dict[str, Any] | None = None
    error: BaseException | None = None
    timed_out: bool = False
    refused_tools: bool = False
    restarts: list[str] = field(default_factory=list)

    def play(self, loop: asyncio.AbstractEventLoop, finished: asyncio.Future[None]) -> None:
        """The thread's body: run the agent, then tell the loop it is done."""
        try:
            self._play()
        except BaseException as exc:
            self.error = exc
        # A closed loop: the run was cancelled and nobody waits any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_finish, finished)

    def _play(self) -> None:
        library = _library()
        harness = self.harness
        kind = harness.model_class or "toolcall"
        while True:
            self.model_class = kind
            self.agent = library.build_agent(
                harness.config,
                kind,
                llm=self.llm,
                sandbox=self.sandbox,
                bridge=self.bridge,
                user=self.user,
                uname=self.uname,
                wall_time_limit_s=max(1, math.floor(self.budget)),
            )
            try:
                self.exit_info = self.agent.run(self.task.instruction)
            except Exception as exc:
                deciding = harness.model_class is None and self.agent.model.answered == 0
                if deciding and kind == "toolcall" and library.is_tools_refusal(exc):
                    # Refused before sampling: nothing was recorded, the episode starts over.
                    harness.model_class = kind = "textbased"
                    self.refused_tools = True
                    continue
                raise
            finally:
                if harness.model_class is None and self.agent.model.answered > 0:
                    harness.model_class = kind
            return

    def outcome(self) -> HarnessOutcome:
        agent = self.agent
        turns = agent.model.answered if agent is not None else 0
        metadata: dict[str, Any] = {
            "model_class": self.model_class,
            "commands": list(agent.env.commands) if agent is not None else [],
            "format_errors": _format_errors(agent),
        }
        if self.refused_tools:
            metadata["tools_refused"] = True
        if self.timed_out:
            return HarnessOutcome(termination=Termination.TIMEOUT, turns=turns, metadata=metadata)
        if self.error is not None:
            error = self.error
            if isinstance(error, Stopped):
                raise RuntimeError(f"the agent's thread was stopped unexpectedly: {error}")
            mapped = _library().from_exception(error)
            if mapped is None:
                raise error
            termination, details = mapped
            metadata.update(details)
            return HarnessOutcome(termination=termination, turns=turns, metadata=metadata)
        exit_info = self.exit_info or {}
        status = exit_info.get("exit_status", "")
        termination = _library().EXIT_STATUSES.get(status)
        if termination is None:
            raise RuntimeError(
                f"mini-swe-agent ended task {self.task.task_id!r} with exit status {status!r},"
                " which the harness does not know; check the pinned mini-swe-agent version"
            )
        metadata["exit_status"] = status
        if status == "LimitsExceeded":
            steps = agent.config.step_limit
            metadata["limit"] = "steps" if 0 < steps <= agent.n_calls else "cost"
        answer = exit_info.get("submission") if termination is Termination.DONE else None
        return HarnessOutcome(
            termination=termination, answer=answer, turns=turns, metadata=metadata
        )


def _finish(finished: asyncio.Future[None]) -> None:
    if not finished.done():
        finished.set_result(None)


def _format_errors(agent: Any) -> int:
    if agent is None:
        return 0
    return sum(
        1
        for message in agent.messages
        if message.get("extra", {}).get("interrupt_type") == "FormatError"
    )
