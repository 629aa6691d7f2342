"""mini-swe-agent's environment, with every command run in the episode's rllm sandbox.

:class:`SandboxEnvironment` is the library's ``LocalEnvironment`` with one change: a command
runs through :meth:`rllm_core.ports.Sandbox.exec` (local bubblewrap, Modal, Daytona, any
backend) instead of a host subprocess. Everything else is the library's: the config keys
(``cwd``, ``env``, ``timeout``), the output dict the model's observation template reads, and
the submit check (``_check_finished``), which raises ``Submitted`` when a command's output
starts with the submit marker and it exited 0.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

from minisweagent.environments.local import LocalEnvironment, LocalEnvironmentConfig
from minisweagent.utils.serialize import recursive_merge
from pydantic import Field
from rllm_core.errors import SandboxCommandTimeout, SandboxError
from rllm_core.ports import Sandbox
from rllm_core.types import ExecResult

from rllm_harness_mini_swe_agent.bridge import LoopBridge

__all__ = ["SandboxEnvironment", "SandboxEnvironmentConfig", "SandboxFailed"]


class SandboxFailed(Exception):
    """The sandbox failed (anything but a command passing its timeout); ends the episode
    with ``sandbox_error``. ``error`` is the sandbox's exception."""

    def __init__(self, error: SandboxError) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.error = error


class SandboxEnvironmentConfig(LocalEnvironmentConfig):
    """The library's local config plus who runs the commands and what the templates learn
    about the sandbox's system (``uname``: system, release, version, machine)."""

    user: str | None = None
    uname: dict[str, str] = Field(default_factory=dict)


def joined_output(result: ExecResult) -> str:
    """stdout then stderr, as one stream (the library merges them into one pipe)."""
    if not result.stderr:
        return result.stdout
    if result.stdout and not result.stdout.endswith("\n"):
        return f"{result.stdout}\n{result.stderr}"
    return result.stdout + result.stderr


class SandboxEnvironment(LocalEnvironment):
    """``LocalEnvironment`` whose commands run in ``sandbox``, reached through ``bridge``
    from the agent's thread. ``commands`` records each command run (``command``,
    ``returncode``, ``timed_out``, ``duration_s``, ``truncated``) for the outcome."""

    def __init__(self, *, sandbox: Sandbox, bridge: LoopBridge, **kwargs: Any) -> None:
        super().__init__(config_class=SandboxEnvironmentConfig, **kwargs)
        self.sandbox = sandbox
        self.bridge = bridge
        self.commands: list[dict[str, Any]] = []

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        command = action.get("command", "")
        timeout = timeout or self.config.timeout
        record: dict[str, Any] = {"command": command}
        self.commands.append(record)
        began = time.monotonic()
        try:
            result = self.bridge.run(
                lambda: self.sandbox.exec(
                    command,
                    timeout=timeout,
                    user=self.config.user,
                    env=self.config.env or None,
                    cwd=cwd or self.config.cwd or None,
                )
            )
        except SandboxCommandTimeout:
            # What the library reports for a command killed at its timeout: no exit code,
            # the timeout as the exception, and the episode goes on.
            expired = subprocess.TimeoutExpired(command, timeout)
            output: dict[str, Any] = {
                "output": "",
                "returncode": -1,
                "exception_info": f"An error occurred while executing the command: {expired}",
                "extra": {"exception_type": type(expired).__name__, "exception": str(expired)},
            }
            record.update(returncode=None, timed_out=True, duration_s=time.monotonic() - began)
        except SandboxError as exc:
            record.update(returncode=None, timed_out=False, duration_s=time.monotonic() - began)
            raise SandboxFailed(exc) from exc
        else:
            output = {
                "output": joined_output(result),
                "returncode": result.exit_code,
                "exception_info": "",
            }
            record.update(
                returncode=result.exit_code,
                timed_out=False,
                duration_s=result.duration_s,
                truncated=result.truncated,
            )
        self._check_finished(output)
        return output

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        """The config and the sandbox's ``uname`` (never the host's system or environment)."""
        config = self.config.model_dump()
        uname = config.pop("uname")
        return recursive_merge(config, uname, kwargs)
