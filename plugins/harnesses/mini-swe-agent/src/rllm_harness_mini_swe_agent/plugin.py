"""Entry module: the config of the ``mini-swe-agent`` harness and its spec.

Imports only rllm-core, pydantic and the standard library; the harness, mini-swe-agent and
litellm load when a plan builds it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from rllm_core import ComponentSpec, hookimpl, lazy
from rllm_core.kit.harness_keys import MaxRetries, MaxTokens, RequestTimeout, TimeoutCap

__all__ = ["MiniSweAgentConfig", "ModelClass"]

ModelClass = Literal["auto", "toolcall", "textbased"]


class MiniSweAgentConfig(BaseModel):
    """Keys of ``[harness] name = "mini-swe-agent"``.

    Every key left unset keeps the value of the agent's config file: the library's own
    ``mini.yaml`` (tool calling) or ``mini_textbased.yaml`` (actions in backtick blocks), or
    ``config_file``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_class: ModelClass = Field(
        default="auto",
        description="how the agent writes actions: 'toolcall' (a bash tool call, config"
        " mini.yaml), 'textbased' (a ```mswea_bash_command block, config mini_textbased.yaml),"
        " or 'auto': tool calls unless the gateway refuses to render tools (a template"
        " without a tool format), then text; decided on the first episode",
    )
    config_file: str | None = Field(
        default=None,
        description="a mini-swe-agent YAML config (agent, environment and model sections) used"
        " instead of the library's default for the model class; a relative path is read from"
        " the working directory",
    )
    step_limit: int = Field(
        default=30,
        gt=0,
        description="model calls per episode before it ends with max_turns (the agent's"
        " step_limit; the library's default of 0 would never stop)",
    )
    cost_limit: float | None = Field(
        default=None,
        ge=0,
        description="the agent's cost_limit in dollars (0 disables it); the gateway reports no"
        " price, so calls cost 0 unless litellm knows the model; unset keeps the config file's",
    )
    timeout_cap_s: TimeoutCap = None
    command_timeout_s: int | None = Field(
        default=None,
        gt=0,
        description="seconds one command may run before it is killed (the environment's"
        " timeout); unset keeps the config file's, else the library's 30",
    )
    max_consecutive_format_errors: int | None = Field(
        default=None,
        ge=0,
        description="replies in a row without a valid action before the episode ends with"
        " format_error (0: never); unset keeps the config file's, else the library's 3",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="environment variables for every command, over the config file's"
        " environment.env",
    )
    max_tokens: MaxTokens = None
    request_timeout_s: RequestTimeout = 600.0
    max_retries: MaxRetries = 2


@hookimpl
def rllm_harnesses() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="harness",
        name="mini-swe-agent",
        factory=lazy("rllm_harness_mini_swe_agent.harness:MiniSweAgentHarness"),
        config=MiniSweAgentConfig,
        summary="mini-swe-agent's own agent loop (pinned release): bash actions in the sandbox",
    )
