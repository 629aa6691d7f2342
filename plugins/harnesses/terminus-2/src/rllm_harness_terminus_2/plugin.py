"""Entry module: the config of the ``terminus-2`` harness and its spec.

Imports only rllm-core, pydantic and the standard library; the harness loads when a plan
builds it, and harbor only ever loads in the side environment's interpreter.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from rllm_core import ComponentSpec, hookimpl, lazy
from rllm_core.kit.harness_keys import MaxRetries, MaxTokens, RequestTimeout, TimeoutCap

__all__ = ["Terminus2Config"]


class Terminus2Config(BaseModel):
    """Keys of ``[harness] name = "terminus-2"``.

    The agent's own settings (``parser``, ``max_turns``, ``temperature``, the
    summarization keys, the pane size) are passed to harbor's ``Terminus2`` as they are; the
    others bound the episode from outside the agent, which has no time budget or cap on
    model calls of its own.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    python: str | None = Field(
        default=None,
        description="the Python 3.12 (or newer) interpreter that builds the side environment"
        " harbor runs in; unset: python3.12, python3.13, python3.14 on PATH, then pyenv's"
        " versions folder",
    )
    parser: Literal["json", "xml"] = Field(
        default="json",
        description="the agent's reply format: a JSON object or XML tags (Terminus-2's"
        " parser_name, with its own prompt template)",
    )
    max_turns: int = Field(
        default=30,
        gt=0,
        description="agent turns per episode before it ends with max_turns (Terminus-2's"
        " max_turns; a reply it cannot parse is a turn)",
    )
    max_model_calls: int | None = Field(
        default=None,
        gt=0,
        description="model calls per episode before it ends with max_turns: the agent"
        " re-prompts a reply cut at max_tokens without counting a turn, and a summarization"
        " makes three calls; unset: 2 x max_turns",
    )
    temperature: float | None = Field(
        default=None,
        ge=0,
        description="sampling temperature the agent sends; unset sends none (the gateway's"
        " [sampling] applies)",
    )
    max_tokens: MaxTokens = None
    enable_summarize: bool = Field(
        default=True,
        description="let the agent summarize its history when the context fills up"
        " (Terminus-2's enable_summarize); a summarization starts a new lineage",
    )
    proactive_summarization_threshold: int = Field(
        default=8000,
        ge=0,
        description="free tokens of context_window below which the agent summarizes before"
        " its next call (0: never)",
    )
    context_window: int | None = Field(
        default=None,
        gt=0,
        description="the model's context in tokens, told to the agent's client so that"
        " summarization starts before the gateway refuses a prompt; unset: the client's"
        " default of 1,000,000, so the agent never summarizes on its own",
    )
    max_consecutive_format_errors: int = Field(
        default=3,
        ge=0,
        description="replies in a row the agent's parser rejects before the episode ends"
        " with format_error (0: never; the agent itself never stops for them)",
    )
    timeout_cap_s: TimeoutCap = None
    command_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="seconds one sandbox command of the agent (a tmux send-keys or"
        " capture-pane) may take before it is reported as timed out",
    )
    tmux_pane_width: int = Field(default=160, gt=0, description="the tmux pane's columns")
    tmux_pane_height: int = Field(default=40, gt=0, description="the tmux pane's rows")
    env: dict[str, str] = Field(
        default_factory=dict,
        description="environment variables of the agent's shell (Terminus-2's extra_env)",
    )
    request_timeout_s: RequestTimeout = 600.0
    max_retries: MaxRetries = Field(
        default=2,
        description="retries of a failed request (connection errors, 429, 5xx), after which"
        " the episode ends with model_error",
    )
    driver_start_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="seconds the side interpreter may take to import harbor and connect",
    )

    @field_validator("python")
    @classmethod
    def _new_enough(cls, value: str | None) -> str | None:
        if value is None:
            return value
        from rllm_core.errors import AssetError

        from rllm_harness_terminus_2.sideenv import MIN_PYTHON, find_python

        try:
            find_python(MIN_PYTHON, value, what="the Terminus-2 side environment")
        except AssetError as exc:
            raise ValueError(str(exc)) from None
        return value

    @property
    def model_calls(self) -> int:
        """The cap on model calls per episode."""
        return self.max_model_calls or 2 * self.max_turns


@hookimpl
def rllm_harnesses() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="harness",
        name="terminus-2",
        factory=lazy("rllm_harness_terminus_2.harness:Terminus2Harness"),
        config=Terminus2Config,
        summary="harbor's Terminus-2 agent (pinned release, Python 3.12 side environment):"
        " keystrokes into a tmux session in the sandbox",
    )
