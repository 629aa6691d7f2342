"""Entry module: the config of the ``shell`` harness, its default prompts, and its spec.

Imports only rllm-core, pydantic and the standard library; the harness (and the ``openai``
client) loads when a plan builds it.

Every prompt is a ``str.format`` template; each key accepts only the placeholders listed in
:data:`PLACEHOLDERS` (literal braces are written ``{{`` and ``}}``), checked when the plan is
validated.
"""

from __future__ import annotations

from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from rllm_core import ComponentSpec, hookimpl, lazy
from rllm_core.kit.harness_keys import MaxRetries, MaxTokens, RequestTimeout, TimeoutCap
from rllm_core.kit.templates import template_fields

__all__ = [
    "DEFAULT_SYSTEM_PROMPT",
    "PLACEHOLDERS",
    "ShellConfig",
]

DEFAULT_SYSTEM_PROMPT = """\
You are an agent that completes a task by running shell commands in a Linux sandbox.

Reply with exactly one command per turn, in a fenced code block:

```bash
ls -la
```

Each command runs in a fresh bash shell in {workdir}, so `cd` and shell variables do not carry \
over to the next command: chain steps with `&&`. You then see the command's exit code and \
output; long output is shortened in the middle. A command is stopped after \
{command_timeout_s:g} seconds. Do not start interactive programs or editors; write files with \
`cat > file <<'EOF'` or `printf`.

When the task is complete, reply with a line that contains only {done_marker}, without a code \
block."""

DEFAULT_FORMAT_REMINDER = """\
Your reply had no command. Write exactly one command in a fenced code block:

```bash
<command>
```

or a line with only {done_marker} when the task is complete."""

PLACEHOLDERS: dict[str, tuple[str, ...]] = {
    "system_prompt": ("workdir", "done_marker", "max_turns", "command_timeout_s"),
    "instruction_template": ("instruction", "task_id", "workdir"),
    "observation_template": ("exit_code", "output", "command"),
    "command_timeout_template": ("timeout_s", "command"),
    "format_reminder": ("done_marker",),
    "truncation_marker": ("cut",),
}
"""The placeholders each prompt key may use."""


class ShellConfig(BaseModel):
    """Keys of ``[harness] name = "shell"``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_turns: int = Field(
        default=30, gt=0, description="model calls per episode before it ends with max_turns"
    )
    timeout_cap_s: TimeoutCap = None
    command_timeout_s: float = Field(
        default=60.0, gt=0, description="how long one command may run before it is killed"
    )
    max_output_chars: int = Field(
        default=4000,
        gt=0,
        description="characters of command output shown to the model; longer output keeps"
        " its head and tail with a marker saying how much was cut",
    )
    shell: str | None = Field(
        default="bash",
        description="program that runs each command as `<shell> -c <command>`; unset hands"
        " the command to the sandbox's own shell",
    )
    done_marker: str = Field(
        default="DONE",
        min_length=1,
        description="a reply line holding only this text (outside code blocks) ends the episode",
    )
    system_prompt: str | None = Field(
        default=DEFAULT_SYSTEM_PROMPT,
        description="system message; placeholders {workdir}, {done_marker}, {max_turns},"
        " {command_timeout_s}; unset sends none",
    )
    instruction_template: str = Field(
        default="{instruction}",
        description="first user message; placeholders {instruction}, {task_id}, {workdir}",
    )
    observation_template: str = Field(
        default="Exit code: {exit_code}\nOutput:\n{output}",
        description="user message after a command; placeholders {exit_code}, {output}, {command}",
    )
    command_timeout_template: str = Field(
        default="The command ran past {timeout_s:g} seconds and was killed.",
        description="user message after a command was killed at command_timeout_s;"
        " placeholders {timeout_s}, {command}",
    )
    format_reminder: str = Field(
        default=DEFAULT_FORMAT_REMINDER,
        description="user message after a reply with no command and no done marker;"
        " placeholder {done_marker}",
    )
    truncation_marker: str = Field(
        default="\n[... {cut} characters cut ...]\n",
        description="put between the head and tail of cut output; placeholder {cut}",
    )
    empty_output: str = Field(
        default="(no output)", description="shown as {output} when a command printed nothing"
    )
    max_tokens: MaxTokens = None
    request_timeout_s: RequestTimeout = 600.0
    max_retries: MaxRetries = 2

    @field_validator("done_marker")
    @classmethod
    def _one_line(cls, value: str) -> str:
        if value != value.strip() or "\n" in value or "`" in value:
            raise ValueError(
                f"done_marker {value!r} must be one line without surrounding spaces or backticks"
            )
        return value

    @model_validator(mode="after")
    def _templates(self) -> ShellConfig:
        for key in PLACEHOLDERS:
            value = getattr(self, key)
            if value is not None:
                template_fields(value, PLACEHOLDERS[key], key)
        return self


@hookimpl
def rllm_harnesses() -> Iterator[ComponentSpec]:
    yield ComponentSpec(
        kind="harness",
        name="shell",
        factory=lazy("rllm_harness_shell.harness:ShellHarness"),
        config=ShellConfig,
        summary="multi-turn terminal agent: one shell command per turn in the task's sandbox",
    )
