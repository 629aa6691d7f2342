"""Building mini-swe-agent's ``DefaultAgent`` for one episode from its own config files.

Importing this module imports mini-swe-agent and litellm; the harness does so in the agent's
thread, after setting ``MSWEA_SILENT_STARTUP`` and ``LITELLM_LOCAL_MODEL_COST_MAP``.
"""

from __future__ import annotations

from typing import Any

from minisweagent.agents.default import DefaultAgent
from minisweagent.config import get_config_from_spec
from rllm_core.ports import Sandbox
from rllm_core.types import LLMEndpoint

from rllm_harness_mini_swe_agent.bridge import LoopBridge
from rllm_harness_mini_swe_agent.environment import SandboxEnvironment
from rllm_harness_mini_swe_agent.models import TextbasedModel, ToolcallModel
from rllm_harness_mini_swe_agent.plugin import MiniSweAgentConfig
from rllm_harness_mini_swe_agent.termination import (
    EXIT_STATUSES,
    from_exception,
    is_tools_refusal,
)

__all__ = [
    "DEFAULT_CONFIGS",
    "EXIT_STATUSES",
    "build_agent",
    "from_exception",
    "is_tools_refusal",
    "read_config",
]

DEFAULT_CONFIGS = {"toolcall": "mini", "textbased": "mini_textbased"}
"""The library's config file for each model class (``minisweagent/config/<name>.yaml``)."""

MODELS = {"toolcall": ToolcallModel, "textbased": TextbasedModel}


def read_config(config: MiniSweAgentConfig, kind: str) -> dict[str, Any]:
    """The agent's config file for model class ``kind``: ``config_file``, else the library's
    default, found and read by the library."""
    spec = config.config_file or DEFAULT_CONFIGS[kind]
    try:
        return get_config_from_spec(spec) or {}
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"[harness] config_file {spec!r}: {exc}; give the path of a mini-swe-agent YAML"
            " config (absolute, or relative to the working directory)"
        ) from None


def build_agent(
    config: MiniSweAgentConfig,
    kind: str,
    *,
    llm: LLMEndpoint,
    sandbox: Sandbox,
    bridge: LoopBridge,
    user: str | None,
    uname: dict[str, str],
    wall_time_limit_s: int,
) -> DefaultAgent:
    """A ``DefaultAgent`` for one episode: the config file's ``agent``, ``environment`` and
    ``model`` sections with the harness's keys over them."""
    file_config = read_config(config, kind)

    agent_config = dict(file_config.get("agent") or {})
    agent_config.update(
        step_limit=config.step_limit, wall_time_limit_seconds=wall_time_limit_s, output_path=None
    )
    if config.cost_limit is not None:
        agent_config["cost_limit"] = config.cost_limit
    if config.max_consecutive_format_errors is not None:
        agent_config["max_consecutive_format_errors"] = config.max_consecutive_format_errors

    environment_config = dict(file_config.get("environment") or {})
    environment_config["env"] = {**(environment_config.get("env") or {}), **config.env}
    # Commands run in the task's workdir, the sandbox's default.
    environment_config["cwd"] = ""
    if config.command_timeout_s is not None:
        environment_config["timeout"] = config.command_timeout_s
    environment = SandboxEnvironment(
        sandbox=sandbox, bridge=bridge, user=user, uname=uname, **environment_config
    )

    model_config = dict(file_config.get("model") or {})
    model_config.pop("model_class", None)
    model_kwargs = {
        **(model_config.get("model_kwargs") or {}),
        "api_base": llm.base_url,
        "api_key": llm.api_key,
        "timeout": config.request_timeout_s,
        "max_retries": config.max_retries,
    }
    if config.max_tokens is not None:
        model_kwargs["max_tokens"] = config.max_tokens
    model_config.update(
        model_name=f"openai/{llm.model}",
        model_kwargs=model_kwargs,
        # The gateway reports no price: every call costs 0 instead of failing the episode.
        cost_tracking="ignore_errors",
    )
    model = MODELS[kind](bridge=bridge, **model_config)
    return DefaultAgent(model, environment, **agent_config)
