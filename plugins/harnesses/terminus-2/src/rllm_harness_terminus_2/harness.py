"""The ``terminus-2`` harness: harbor's ``Terminus2`` on an rllm episode, through a driver
process in the side environment."""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import time
import uuid
from typing import Any

from rllm_core.errors import SandboxError
from rllm_core.ports import Sandbox
from rllm_core.types import HarnessOutcome, LLMEndpoint, Task, Termination

from rllm_harness_terminus_2.bridge import Driver, DriverDied, Episode, forget, shared
from rllm_harness_terminus_2.plugin import Terminus2Config

__all__ = ["TERMINATIONS", "Terminus2Harness"]

TERMINATIONS: dict[str, Termination] = {
    "done": Termination.DONE,
    "max_turns": Termination.MAX_TURNS,
    "timeout": Termination.TIMEOUT,
    "context_length": Termination.CONTEXT_LENGTH,
    "format_error": Termination.FORMAT_ERROR,
    "model_error": Termination.MODEL_ERROR,
    "sandbox_error": Termination.SANDBOX_ERROR,
    "driver_error": Termination.SANDBOX_ERROR,
}
"""The driver's endings and the termination each stands for (``driver_error``: an exception
in the driver or harbor, an infrastructure failure)."""

_GRACE_S = 10.0
"""How long past the episode's budget the harness waits for the driver's own timeout."""
_CANCEL_WAIT_S = 2.0
_CLEANUP_TIMEOUT_S = 10.0
_CLEAN = (
    "pid=$(tmux display-message -p '#{{pid}}' 2>/dev/null); tmux kill-server 2>/dev/null;"
    # The client returns before the server has exited, and the server leaves its socket
    # behind, so wait on the server's process; a zombie has exited (its reaper may be slow).
    ' i=0; while [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null'
    " && ! grep -qs '^State:.*Z' \"/proc/$pid/status\" && [ $i -lt 50 ];"
    " do sleep 0.05; i=$((i + 1)); done;"
    " rm -rf {folder}"
)


class Terminus2Harness:
    """Runs one task with harbor's ``Terminus2`` agent, unchanged, in a driver process of the
    side environment (:mod:`rllm_harness_terminus_2.sideenv`).

    One driver per interpreter serves every episode of the process at once
    (:func:`~rllm_harness_terminus_2.bridge.shared`: importing harbor costs seconds of CPU
    and 200 MB, so not one process per episode); it starts with the first episode and ends
    with :meth:`close` or when an episode is cancelled, each only when no other episode runs
    on it, else at the process's exit. Its model client is pointed at ``llm.base_url`` as
    ``openai/<llm.model>`` with ``llm.api_key``; its environment forwards every command
    to ``sandbox`` (:mod:`rllm_harness_terminus_2.bridge`).

    Each episode gets a tmux socket folder of its own (``TMUX_TMPDIR``, in the sandbox's
    ``/tmp``), so that episodes sharing a host (``isolation = "none"``) never share a tmux
    server; every command runs as the task's agent user (the agent asks for root to probe
    tmux). Before the agent starts, the harness checks that ``tmux`` is in the sandbox (the
    agent would spend minutes trying to install it); after it ends, however it ends, the
    harness runs ``tmux kill-server`` there, so the verifier grades a quiet sandbox and no
    process outlives the episode.

    ``turns`` is the model calls the model answered (the agent's turns, its re-prompts of
    a cut reply and its summarization calls). Ends: ``done`` when the agent confirmed the
    task complete (or closed its terminal), ``max_turns`` at ``max_turns`` agent turns or
    the cap on model calls (``limit`` in the metadata: ``turns`` or ``model_calls``),
    ``format_error`` after ``max_consecutive_format_errors`` unparsable replies in a row,
    ``context_length`` when the gateway refuses the prompt, ``model_error`` for any other
    failed call (after ``max_retries``), ``timeout`` at the budget
    (``min(task.agent_timeout_s, timeout_cap_s)``), and ``sandbox_error`` when the sandbox,
    tmux or the driver fails (the driver's output tail in ``error``: an infrastructure
    failure, retried and never trained on).
    """

    def __init__(self, config: Terminus2Config | None = None) -> None:
        self.config = config or Terminus2Config()
        self._driver: Driver | None = None

    def time_budget(self, task: Task) -> float:
        """Seconds the episode may take: the task's agent timeout, capped by
        ``timeout_cap_s`` when set."""
        cap = self.config.timeout_cap_s
        return task.agent_timeout_s if cap is None else min(task.agent_timeout_s, cap)

    async def driver(self) -> Driver:
        """The process's driver, started (and the side environment built) when needed."""
        from rllm_harness_terminus_2.sideenv import side_python

        python = await asyncio.to_thread(side_python, self.config.python)
        self._driver = await asyncio.to_thread(
            shared, python, timeout_s=self.config.driver_start_timeout_s
        )
        return self._driver

    async def run(self, task: Task, llm: LLMEndpoint, sandbox: Sandbox | None) -> HarnessOutcome:
        if sandbox is None:
            raise ValueError(
                f"the terminus-2 harness needs a sandbox for task {task.task_id!r}; give the"
                " task an environment and configure a sandbox backend"
            )
        started = time.monotonic()
        budget = self.time_budget(task)
        user = task.environment.user if task.environment else None
        episode_id = uuid.uuid4().hex[:16]
        tmux_dir = f"/tmp/rllm-tmux-{episode_id}"
        env = {"TMUX_TMPDIR": tmux_dir}
        try:
            missing = await self._prepare(sandbox, user, tmux_dir)
        except SandboxError as exc:
            return _failed(str(exc), type(exc).__name__)
        if missing is not None:
            await self._clean(sandbox, user, env, tmux_dir)
            return _failed(missing, "TmuxMissing")
        try:
            driver = await self.driver()
        except DriverDied as exc:
            await self._clean(sandbox, user, env, tmux_dir)
            return _failed(str(exc), "DriverDied")
        loop = asyncio.get_running_loop()
        episode = Episode(
            episode_id=episode_id,
            sandbox=sandbox,
            user=user,
            env=env,
            command_timeout_s=self.config.command_timeout_s,
            loop=loop,
            done=loop.create_future(),
        )
        cancelled = False
        timed_out = False
        try:
            driver.open(episode, self._start_message(task, llm, budget))
            async with asyncio.timeout(budget + _GRACE_S):
                done = await asyncio.shield(episode.done)
        except TimeoutError:
            timed_out = True
        except DriverDied as exc:
            return _failed(str(exc), "DriverDied")
        except asyncio.CancelledError:
            cancelled = True
            raise
        finally:
            await asyncio.shield(
                self._finish(driver, episode, sandbox, user, env, tmux_dir, cancelled)
            )
        elapsed = time.monotonic() - started
        extra = {
            "time_budget_s": budget,
            "elapsed_s": elapsed,
            "bridge_execs": episode.exec_count,
            "bridge_exec_s": round(episode.exec_seconds, 3),
            "harbor": driver.harbor_version,
            "driver_pid": driver.process.pid,
            "tmux_tmpdir": tmux_dir,
        }
        if timed_out:
            return HarnessOutcome(termination=Termination.TIMEOUT, metadata=extra)
        termination = TERMINATIONS.get(done["termination"])
        if termination is None:
            raise RuntimeError(
                f"the Terminus-2 driver ended task {task.task_id!r} with"
                f" {done['termination']!r}, which the harness does not know"
            )
        metadata = {**done.get("metadata", {}), **extra}
        return HarnessOutcome(termination=termination, turns=int(done["turns"]), metadata=metadata)

    def _start_message(self, task: Task, llm: LLMEndpoint, budget: float) -> dict[str, Any]:
        config = self.config
        agent: dict[str, Any] = {
            "parser_name": config.parser,
            "max_turns": config.max_turns,
            "enable_summarize": config.enable_summarize,
            "proactive_summarization_threshold": config.proactive_summarization_threshold,
            "tmux_pane_width": config.tmux_pane_width,
            "tmux_pane_height": config.tmux_pane_height,
        }
        if config.temperature is not None:
            agent["temperature"] = config.temperature
        if config.env:
            agent["extra_env"] = dict(config.env)
        return {
            "instruction": task.instruction,
            "base_url": llm.base_url,
            "api_key": llm.api_key,
            "model": llm.model,
            "budget_s": budget,
            "agent": agent,
            "max_model_calls": config.model_calls,
            "max_consecutive_format_errors": config.max_consecutive_format_errors,
            "max_retries": config.max_retries,
            "request_timeout_s": config.request_timeout_s,
            "max_tokens": config.max_tokens,
            "context_window": config.context_window,
        }

    async def time_bridge(
        self, sandbox: Sandbox, *, command: str = "true", count: int = 100, user: str | None = None
    ) -> list[float]:
        """Seconds of each of ``count`` runs of ``command`` issued by the driver's environment
        object, through the bridge, in ``sandbox``: what one command of the agent costs,
        to compare with ``sandbox.exec`` alone."""
        driver = await self.driver()
        episode = Episode(
            episode_id=uuid.uuid4().hex[:16],
            sandbox=sandbox,
            user=user,
            env={},
            command_timeout_s=self.config.command_timeout_s,
            loop=asyncio.get_running_loop(),
            done=asyncio.get_running_loop().create_future(),
        )
        try:
            driver.probe(episode, command, count)
            result = await episode.done
        finally:
            await driver.close_episode(episode.episode_id)
        return [float(s) for s in result["seconds"]]

    async def _prepare(self, sandbox: Sandbox, user: str | None, tmux_dir: str) -> str | None:
        """Make the episode's tmux folder; ``None``, or why tmux cannot run there."""
        folder = shlex.quote(tmux_dir)
        result = await sandbox.exec(
            f"mkdir -p {folder} || exit 2; command -v tmux || exit 3",
            timeout=_CLEANUP_TIMEOUT_S,
            user=user,
        )
        if result.exit_code == 0:
            return None
        if result.exit_code == 2:
            return (
                f"could not create the episode's tmux folder {tmux_dir} in the sandbox:"
                f" {result.stderr.strip()}"
            )
        return (
            "tmux is not installed in the sandbox, and Terminus-2 types its commands into a"
            " tmux session: install it in the task's image (Debian: apt-get install tmux);"
            " with the local sandbox backend the host's tmux is used"
            f" ({result.stderr.strip() or 'command -v tmux found nothing'})"
        )

    async def _finish(
        self,
        driver: Driver,
        episode: Episode,
        sandbox: Sandbox,
        user: str | None,
        env: dict[str, str],
        tmux_dir: str,
        cancelled: bool,
    ) -> None:
        """End the episode in the driver (cancelling it when it still runs), its commands
        in flight and its tmux server; a cancelled episode with no other running also
        ends the driver."""
        if not episode.done.done():
            driver.cancel(episode.episode_id)
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(episode.done), _CANCEL_WAIT_S)
        if episode.done.done() and not episode.done.cancelled():
            episode.done.exception()  # retrieved, so an unawaited failure is not logged
        await driver.close_episode(episode.episode_id)
        await self._clean(sandbox, user, env, tmux_dir)
        if cancelled:
            await asyncio.to_thread(forget, driver)

    async def _clean(
        self, sandbox: Sandbox, user: str | None, env: dict[str, str], tmux_dir: str
    ) -> None:
        with contextlib.suppress(SandboxError, OSError):
            await sandbox.exec(
                _CLEAN.format(folder=shlex.quote(tmux_dir)),
                timeout=_CLEANUP_TIMEOUT_S,
                user=user,
                env=env,
            )

    async def close(self) -> None:
        """Stop the driver unless another episode still runs on it."""
        driver, self._driver = self._driver, None
        if driver is not None:
            await asyncio.to_thread(forget, driver)


def _failed(error: str, error_type: str) -> HarnessOutcome:
    return HarnessOutcome(
        termination=Termination.SANDBOX_ERROR,
        metadata={"error": error, "error_type": error_type},
    )
