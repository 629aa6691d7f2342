"""Entry module: the config of the ``cli`` harness and its spec.

Imports only rllm-core, pydantic and the standard library; the harness loads when a plan
builds it.

``invocation`` and the values of ``env`` are ``str.format`` templates over
:data:`PLACEHOLDERS` (literal braces are written ``{{`` and ``}}``, so a shell ``${VAR}``
becomes ``${{VAR}}``), checked when the plan is validated. The ``install`` script is not a
template: it runs with the same environment, so it reads ``$OPENAI_BASE_URL`` and the rest.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from rllm_core import ComponentSpec, hookimpl, lazy
from rllm_core.kit.harness_keys import TimeoutCap
from rllm_core.kit.templates import template_fields

__all__ = ["DEFAULT_ENV", "PLACEHOLDERS", "CliConfig"]

PLACEHOLDERS = (
    "base_url",
    "api_key",
    "model",
    "instruction_path",
    "outcome_path",
    "agent_dir",
    "workdir",
    "task_id",
    "timeout_s",
)
"""What ``invocation`` and ``env`` values may use: the episode's OpenAI base URL, key and model
name; the instruction file, the outcome file and the folder holding both; the task's workdir
and id; and the time budget in seconds."""

DEFAULT_ENV = {
    "OPENAI_BASE_URL": "{base_url}",
    "OPENAI_API_KEY": "{api_key}",
    "OPENAI_MODEL": "{model}",
    "RLLM_INSTRUCTION_PATH": "{instruction_path}",
    "RLLM_OUTCOME_PATH": "{outcome_path}",
    "RLLM_TIME_BUDGET_S": "{timeout_s}",
}
"""Variables every agent gets; ``env`` adds to them and may replace them."""


_SHELL_HINT = " (a shell ${{VAR}} as $VAR or ${{{{VAR}}}})"


class CliConfig(BaseModel):
    """Keys of ``[harness] name = "cli"``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    invocation: str = Field(
        min_length=1,
        description="command line that runs the agent once, as the task's agent user in its"
        " workdir; a template (placeholder values are shell-quoted)",
    )
    install: str | None = Field(
        default=None,
        description="bash script run once per episode before the invocation (not a template;"
        " it sees the same environment); unset installs nothing",
    )
    install_user: str | None = Field(
        default=None,
        description="user that runs the install script; unset uses the sandbox's default user",
    )
    install_timeout_s: float = Field(
        default=600.0, gt=0, description="how long the install script may run"
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="environment variables for install and invocation, added to (or"
        " replacing) the defaults; values are templates",
    )
    timeout_cap_s: TimeoutCap = Field(
        default=None,
        description="cap on the invocation's time budget, which is the task's agent timeout;"
        " unset uses the task's timeout as it is",
    )
    agent_dir: str = Field(
        default="/tmp/rllm/agent",
        description="absolute folder in the sandbox for instruction.md, install.sh and"
        " outcome.json",
    )
    network: Literal["gateway", "full"] = Field(
        default="gateway",
        description="what the sandbox reaches: 'gateway' only the episode's gateway (and what"
        " the task's own network allows); 'full' the sandbox backend's whole network, which"
        " for the local backend is every service on this machine and beyond, for install"
        " scripts that download",
    )

    @field_validator("invocation")
    @classmethod
    def _invocation_template(cls, value: str) -> str:
        template_fields(value, PLACEHOLDERS, "invocation", hint=_SHELL_HINT)
        return value

    @field_validator("env")
    @classmethod
    def _env_templates(cls, value: dict[str, str]) -> dict[str, str]:
        for name, template in value.items():
            if not name or "=" in name or "\0" in name:
                raise ValueError(f"env has the invalid variable name {name!r}")
            template_fields(template, PLACEHOLDERS, f"env.{name}", hint=_SHELL_HINT)
        return value

    @field_validator("agent_dir")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not posixpath.isabs(value):
            raise ValueError(f"agent_dir {value!r} must be an absolute path in the sandbox")
        return posixpath.normpath(value)


@hookimpl
def rllm_harnesses() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="harness",
        name="cli",
        factory=lazy("rllm_harness_cli.harness:CliHarness"),
        config=CliConfig,
        summary="installs a command-line agent in the sandbox and runs it against the gateway",
    )
