"""``task.toml`` as a pydantic model: each section and key of a Harbor task and what it accepts.

:func:`read_task_toml` validates a parsed ``task.toml`` and returns the model with every bad
value replaced by its default, together with one ``(field, message)`` problem per bad value,
so that a reader can report them all at once. Fields are named as ``docs/tasks.md`` writes
them: ``version``, ``[agent]``, ``[environment].memory``, ``[verifier].env.NAME``. Unknown
keys are not problems; :func:`unknown_keys` lists them for warnings.
"""

from __future__ import annotations

import copy
import math
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from rllm_task_source_harbor.sizes import parse_size_mb

__all__ = [
    "DEFAULT_AGENT_TIMEOUT_S",
    "DEFAULT_BUILD_TIMEOUT_S",
    "HealthcheckSection",
    "DEFAULT_VERIFIER_TIMEOUT_S",
    "SCHEMA_VERSIONS",
    "TaskToml",
    "read_task_toml",
    "unknown_keys",
]

DEFAULT_AGENT_TIMEOUT_S = 600.0
DEFAULT_VERIFIER_TIMEOUT_S = 600.0
DEFAULT_BUILD_TIMEOUT_S = 600.0

SCHEMA_VERSIONS = ("1.0", "1.1", "1.2", "1.3", "1.4")
"""The ``schema_version`` values this reader understands, oldest first."""

_PROBLEM = "task_toml"


def _problem(message: str) -> PydanticCustomError:
    # The message travels as context, so braces in a quoted value are never read as a template.
    return PydanticCustomError(_PROBLEM, "{message}", {"message": message})


def _seconds(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _problem(f"must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise _problem(f"must be positive, got {value!r}")
    return float(value)


def _seconds_or_zero(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _problem(f"must be a number of seconds, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise _problem(f"must be 0 or more, got {value!r}")
    return float(value)


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _problem(f"must be a non-empty string, got {value!r}")
    return value.strip()


def _absolute(value: str) -> str:
    if not value.startswith("/"):
        raise _problem(f"must be an absolute path, got {value!r}")
    return value


def _table(value: Any) -> Any:
    if not isinstance(value, dict):
        raise _problem(f"must be a table, got {value!r}")
    return value


def _env_table(value: Any) -> Any:
    if not isinstance(value, dict):
        raise _problem(f"must be a table of NAME = value, got {value!r}")
    return value


def _env_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str | int | float):
        return str(value)
    raise _problem(f"must be a string or number, got {value!r}")


def _size(value: Any) -> int:
    try:
        return parse_size_mb(value)
    except ValueError as exc:
        raise _problem(str(exc)) from exc


def _cores(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise _problem(f"must be a positive number of cores, got {value!r}")
    return float(value)


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _problem(f"must be a whole number >= 0, got {value!r}")
    return value


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise _problem(f"must be true or false, got {value!r}")
    return value


def _string(value: Any) -> str:
    if not isinstance(value, str):
        raise _problem(f"must be a string, got {value!r}")
    return value


def _version(value: Any) -> str:
    if not isinstance(value, str):
        raise _problem(f"must be a string such as '1.0', got {value!r}")
    return value


def _schema_version(value: Any) -> str:
    understood = ", ".join(SCHEMA_VERSIONS)
    if not isinstance(value, str):
        raise _problem(
            f"must be a string such as {SCHEMA_VERSIONS[-1]!r}, got {value!r}; task.toml"
            f" versions understood: {understood}"
        )
    if value.strip() not in SCHEMA_VERSIONS:
        raise _problem(
            f"task.toml declares schema version {value!r}, which this reader does not"
            f" understand; it reads {understood}: write the task for {SCHEMA_VERSIONS[-1]}"
            " or upgrade rllm-task-source-harbor"
        )
    return value.strip()


def _network_mode(value: Any) -> str:
    if value in ("public", "no-network"):
        return value
    if value == "allowlist":
        raise _problem(
            "'allowlist' is not supported: a sandbox here has either no network or full"
            " network; use 'no-network' or 'public'"
        )
    raise _problem(f"must be 'no-network' or 'public', got {value!r}")


def _verifier_mode(value: Any) -> str:
    if value not in ("shared", "separate"):
        raise _problem(f"must be 'shared' or 'separate', got {value!r}")
    return value


def _tags(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(tag, str) for tag in value):
        raise _problem(f"must be a list of strings, got {value!r}")
    return value


Seconds = Annotated[float, BeforeValidator(_seconds)]
SecondsOrZero = Annotated[float, BeforeValidator(_seconds_or_zero)]
Text = Annotated[str, BeforeValidator(_text)]
AbsolutePath = Annotated[str, BeforeValidator(_text), AfterValidator(_absolute)]
Env = Annotated[dict[str, Annotated[str, BeforeValidator(_env_value)]], BeforeValidator(_env_table)]
Size = Annotated[int, BeforeValidator(_size)]
Cores = Annotated[float, BeforeValidator(_cores)]
Count = Annotated[int, BeforeValidator(_count)]
Flag = Annotated[bool, BeforeValidator(_flag)]
String = Annotated[str, BeforeValidator(_string)]


class _Table(BaseModel):
    """A ``task.toml`` table: anything but a table is a problem; unknown keys are left to
    :func:`unknown_keys`."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _must_be_a_table(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise _problem(f"must be a table, got {data!r}")
        return data


class Metadata(_Table):
    """``[metadata]``: the named keys are checked; any other key is kept as it is."""

    model_config = ConfigDict(extra="allow", frozen=True)

    author_name: String | None = None
    author_email: String | None = None
    difficulty: String | None = None
    category: String | None = None
    tags: Annotated[list[str], BeforeValidator(_tags)] = Field(default_factory=list)


class AgentSection(_Table):
    """``[agent]``: the harness's time budget and who the agent's commands run as."""

    timeout_sec: Seconds = DEFAULT_AGENT_TIMEOUT_S
    user: Text | None = None


class VerifierSection(_Table):
    """``[verifier]``: ``tests/test.sh``'s timeout, user and added environment, which named
    reward of ``reward.json`` is trained on (``reward_key``), and where the verifier runs.

    ``environment_mode`` and ``environment`` are read so that the reader can refuse a
    separate verifier environment: the verifier runs in the agent's sandbox only."""

    timeout_sec: Seconds = DEFAULT_VERIFIER_TIMEOUT_S
    env: Env = Field(default_factory=dict)
    user: Text | None = None
    reward_key: Text | None = None
    environment_mode: Annotated[str, BeforeValidator(_verifier_mode)] | None = None
    environment: Annotated[dict[str, Any], BeforeValidator(_table)] | None = None


class SolutionSection(_Table):
    """``[solution]``: environment added to ``solution/solve.sh``."""

    env: Env = Field(default_factory=dict)


class HealthcheckSection(_Table):
    """``[environment.healthcheck]``: a command that must exit 0 in the sandbox before the
    agent starts. Each try may take ``timeout_sec``; after a failed try the next waits
    ``interval_sec``; ``retries`` failed tries after the first are allowed. Tries that fail
    within ``start_period_sec`` of the first do not count, and are spaced
    ``start_interval_sec``. ``command`` is required (checked by the reader)."""

    command: Text | None = None
    timeout_sec: Seconds = 30.0
    interval_sec: Seconds = 5.0
    retries: Count = 3
    start_period_sec: SecondsOrZero = 0.0
    start_interval_sec: Seconds = 5.0

    @property
    def worst_case_s(self) -> float:
        """The longest the check can take before it fails."""
        tries = self.retries + 1
        start = 0.0
        if self.start_period_sec > 0:
            start = self.start_period_sec + self.start_interval_sec + self.timeout_sec
        return start + tries * self.timeout_sec + (tries - 1) * self.interval_sec


class EnvironmentSection(_Table):
    """``[environment]``: the sandbox. Each size may be given as text (``memory``) or MiB
    (``memory_mb``), not both; ``gpu_types`` is accepted and not used; ``mcp_servers`` is
    accepted and warned about; ``network_mode`` (format 1.4) wins over ``allow_internet``;
    ``healthcheck`` is :class:`HealthcheckSection`."""

    build_timeout_sec: Seconds = DEFAULT_BUILD_TIMEOUT_S
    docker_image: Text | None = None
    workdir: AbsolutePath | None = None
    cpus: Cores | None = None
    # Each *_mb key comes before its text key, so the text key's check sees it validated.
    memory_mb: Size | None = None
    memory: Size | None = None
    storage_mb: Size | None = None
    storage: Size | None = None
    gpus: Count = 0
    gpu_types: Any = None
    allow_internet: Flag = False
    network_mode: Annotated[str, BeforeValidator(_network_mode)] | None = None
    env: Env = Field(default_factory=dict)
    mcp_servers: Any = None
    healthcheck: HealthcheckSection | None = None

    @field_validator("memory", "storage")
    @classmethod
    def _one_of_text_and_mb(cls, value: int | None, info: ValidationInfo) -> int | None:
        mb_key = f"{info.field_name}_mb"
        if value is not None and info.data.get(mb_key) is not None:
            raise _problem(f"both {info.field_name} and {mb_key} are set; keep one")
        return value

    @property
    def memory_size(self) -> int | None:
        """MiB from ``memory`` or ``memory_mb``; ``None`` when neither is set."""
        return self.memory if self.memory is not None else self.memory_mb

    @property
    def storage_size(self) -> int | None:
        """MiB from ``storage`` or ``storage_mb``; ``None`` when neither is set."""
        return self.storage if self.storage is not None else self.storage_mb

    @property
    def internet(self) -> bool:
        """Whether the sandbox has network: ``network_mode`` when set (the 1.4 key), else
        ``allow_internet``."""
        if self.network_mode is not None:
            return self.network_mode == "public"
        return self.allow_internet


class TaskToml(BaseModel):
    """A whole ``task.toml``. Every key is optional; ``docs/tasks.md`` lists what each
    becomes. ``steps`` is kept only so that the reader can refuse a multi-step task."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    schema_version: Annotated[str, BeforeValidator(_schema_version)] | None = None
    version: Annotated[str, BeforeValidator(_version)] | None = None
    task: Annotated[dict[str, Any], BeforeValidator(_table)] | None = None
    steps: Any = None
    metadata: Metadata = Field(default_factory=Metadata)
    agent: AgentSection = Field(default_factory=AgentSection)
    verifier: VerifierSection = Field(default_factory=VerifierSection)
    solution: SolutionSection = Field(default_factory=SolutionSection)
    environment: EnvironmentSection = Field(default_factory=EnvironmentSection)

    @property
    def declared_version(self) -> str | None:
        """The format version the task declares: ``schema_version``, else the older
        ``version`` key; ``None`` when it declares neither."""
        return self.schema_version or self.version


_SECTIONS: dict[str, type[_Table]] = {
    "agent": AgentSection,
    "verifier": VerifierSection,
    "solution": SolutionSection,
    "environment": EnvironmentSection,
}
_TABLES = frozenset({"metadata", "task", *_SECTIONS})


def field_name(loc: tuple[str | int, ...]) -> str:
    """A validation error's location as a problem names it: ``[environment].env.A``."""
    head, *rest = [str(part) for part in loc] or ["task.toml"]
    if head == "environment" and rest[:1] == ["healthcheck"] and len(rest) > 1:
        return "[environment.healthcheck]" + "".join(f".{part}" for part in rest[1:])
    if head in _TABLES:
        return f"[{head}]" + "".join(f".{part}" for part in rest)
    return ".".join([head, *rest])


def _drop(data: dict[str, Any], loc: tuple[str | int, ...]) -> bool:
    """Remove the value at ``loc`` so that its default applies; ``False`` when there is none."""
    *parents, last = loc
    for part in parents:
        data = data.get(part) if isinstance(data, dict) else None
    if isinstance(data, dict) and last in data:
        del data[last]
        return True
    return False


def read_task_toml(config: dict[str, Any]) -> tuple[TaskToml, list[tuple[str, str]]]:
    """Validate a parsed ``task.toml``; return the model (each bad value at its default) and
    the problems, ``(field, message)``, in the order the model lists the fields."""
    data = copy.deepcopy(config)
    problems: list[tuple[str, str]] = []
    while True:
        try:
            return TaskToml.model_validate(data), problems
        except ValidationError as exc:
            errors = exc.errors(include_url=False)
        dropped = False
        for error in errors:
            message = error["msg"]
            if error["type"] != _PROBLEM:
                message = f"{message}, got {error['input']!r}"
            problems.append((field_name(error["loc"]), message))
            dropped = _drop(data, error["loc"]) or dropped
        if not dropped:
            raise RuntimeError(f"task.toml problems at no droppable key: {problems}")


def unknown_keys(config: dict[str, Any]) -> list[str]:
    """Keys of ``config`` no Harbor task has, as ``homepage`` or ``[agent].model``; keys of
    ``[metadata]`` are all kept, so never listed."""
    found = [key for key in config if key not in TaskToml.model_fields]
    for name, model in _SECTIONS.items():
        section = config.get(name)
        if isinstance(section, dict):
            found += [f"[{name}].{key}" for key in section if key not in model.model_fields]
    environment = config.get("environment")
    healthcheck = environment.get("healthcheck") if isinstance(environment, dict) else None
    if isinstance(healthcheck, dict):
        known = HealthcheckSection.model_fields
        found += [f"[environment.healthcheck].{key}" for key in healthcheck if key not in known]
    return found
