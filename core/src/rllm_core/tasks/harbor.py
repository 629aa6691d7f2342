"""The Harbor task format reader: a task directory becomes a :class:`~rllm_core.types.Task`.

A task directory holds ``task.toml``, ``instruction.md``, ``environment/Dockerfile`` (and the
files it uses), ``tests/test.sh`` and optionally ``solution/solve.sh``. A dataset is a
directory of task directories, optionally with a ``dataset.toml``. ``docs/tasks.md`` lists
every field and how it is read.

Every problem is collected before anything is raised, so one ``TaskFormatError`` names each
bad field of each task. Unknown fields are warned about, never fatal.
"""

from __future__ import annotations

import logging
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from rllm_core.errors import TaskFormatError, TaskProblem
from rllm_core.tasks.dockerfile import DockerfileReplay, parse_dockerfile
from rllm_core.tasks.sizes import parse_size_mb
from rllm_core.types import NetworkPolicy, SandboxSpec, Task

__all__ = [
    "DEFAULT_AGENT_TIMEOUT_S",
    "DEFAULT_BUILD_TIMEOUT_S",
    "DEFAULT_VERIFIER_TIMEOUT_S",
    "SOURCE",
    "DatasetCheck",
    "TaskCheck",
    "check_dataset",
    "check_task",
    "load_dataset",
    "load_task",
]

log = logging.getLogger("rllm_core.tasks")

SOURCE = "harbor"
DEFAULT_AGENT_TIMEOUT_S = 600.0
DEFAULT_VERIFIER_TIMEOUT_S = 600.0
DEFAULT_BUILD_TIMEOUT_S = 600.0

_SECTIONS: dict[str, frozenset[str]] = {
    "verifier": frozenset({"timeout_sec", "env", "user"}),
    "agent": frozenset({"timeout_sec", "user"}),
    "solution": frozenset({"env"}),
    "environment": frozenset(
        {
            "build_timeout_sec",
            "docker_image",
            "cpus",
            "memory",
            "memory_mb",
            "storage",
            "storage_mb",
            "gpus",
            "gpu_types",
            "allow_internet",
            "env",
            "workdir",
            "mcp_servers",
        }
    ),
}
_TOP_LEVEL = frozenset({"version", "metadata", *_SECTIONS})
_DATASET_KEYS = frozenset({"name", "version", "description"})


@dataclass
class TaskCheck:
    """What reading one task directory found. ``task`` is ``None`` when there are problems;
    ``warnings`` name ignored or unknown fields; ``notes`` say what Dockerfile replay skips."""

    task_dir: Path
    task_id: str
    task: Task | None = None
    problems: list[TaskProblem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class DatasetCheck:
    """What reading a dataset directory found: one :class:`TaskCheck` per task directory, in
    name order, plus problems and warnings of the dataset itself."""

    path: Path
    name: str
    tasks: list[TaskCheck] = field(default_factory=list)
    problems: list[TaskProblem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def all_problems(self) -> list[TaskProblem]:
        return [*self.problems, *(p for check in self.tasks for p in check.problems)]

    @property
    def ok(self) -> bool:
        return not self.all_problems


class _Fields:
    """Typed reads from one ``task.toml`` table; a bad value becomes a problem, not an
    exception."""

    def __init__(self, check: TaskCheck) -> None:
        self.check = check

    def problem(self, where: str, message: str) -> None:
        self.check.problems.append(
            TaskProblem(task=self.check.task_id, field=where, message=message)
        )

    def table(self, data: dict[str, Any], key: str) -> dict[str, Any]:
        value = data.get(key, {})
        if not isinstance(value, dict):
            self.problem(f"[{key}]", f"must be a table, got {value!r}")
            return {}
        return value

    def seconds(self, section: dict[str, Any], name: str, key: str, default: float) -> float:
        value = section.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.problem(f"[{name}].{key}", f"must be a number of seconds, got {value!r}")
            return default
        if not math.isfinite(value) or value <= 0:
            self.problem(f"[{name}].{key}", f"must be positive, got {value!r}")
            return default
        return float(value)

    def string(self, section: dict[str, Any], name: str, key: str) -> str | None:
        value = section.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            self.problem(f"[{name}].{key}", f"must be a non-empty string, got {value!r}")
            return None
        return value.strip()

    def env(self, section: dict[str, Any], name: str) -> dict[str, str]:
        value = section.get("env", {})
        if not isinstance(value, dict):
            self.problem(f"[{name}].env", f"must be a table of NAME = value, got {value!r}")
            return {}
        env = {}
        for var, item in value.items():
            if isinstance(item, bool):
                env[var] = "true" if item else "false"
            elif isinstance(item, str | int | float):
                env[var] = str(item)
            else:
                self.problem(f"[{name}].env.{var}", f"must be a string or number, got {item!r}")
        return env

    def size(self, section: dict[str, Any], text_key: str, mb_key: str, default: int) -> int:
        if text_key in section and mb_key in section:
            self.problem(
                f"[environment].{text_key}",
                f"both {text_key} and {mb_key} are set; keep one",
            )
            return default
        key = text_key if text_key in section else mb_key
        if key not in section:
            return default
        try:
            return parse_size_mb(section[key])
        except ValueError as exc:
            self.problem(f"[environment].{key}", str(exc))
            return default

    def unknown(self, data: dict[str, Any], known: frozenset[str], where: str) -> None:
        for key in data:
            if key not in known:
                self.check.warnings.append(
                    f"{self.check.task_id}: {where}{key} is not a known field; ignored"
                )


def _read_text(path: Path, fields: _Fields, where: str, *, required: bool) -> str | None:
    if not path.is_file():
        if required:
            fields.problem(where, f"missing: expected a file at {path}")
        return None
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        fields.problem(where, f"cannot be read as UTF-8 text: {exc}")
        return None


def check_task(
    task_dir: str | Path,
    *,
    replay_dockerfile: bool | None = None,
    verifier_user: str | None = None,
) -> TaskCheck:
    """Read one task directory and report everything found, without raising.

    ``replay_dockerfile`` overrides the default (on for a Dockerfile base image, off when the
    task names a prebuilt ``[environment].docker_image``); ``verifier_user`` overrides
    ``[verifier].user``.
    """
    task_dir = Path(task_dir).resolve()
    check = TaskCheck(task_dir=task_dir, task_id=task_dir.name)
    fields = _Fields(check)
    if not task_dir.is_dir():
        fields.problem("(task directory)", f"{task_dir} is not a directory")
        return check

    config: dict[str, Any] = {}
    toml_text = _read_text(task_dir / "task.toml", fields, "task.toml", required=True)
    if toml_text is None:
        return check
    try:
        config = tomllib.loads(toml_text)
    except tomllib.TOMLDecodeError as exc:
        fields.problem("task.toml", f"is not valid TOML: {exc}")
    fields.unknown(config, _TOP_LEVEL, "")

    version = config.get("version")
    if version is not None and not isinstance(version, str):
        fields.problem("version", f"must be a string such as '1.0', got {version!r}")
    metadata = fields.table(config, "metadata")
    tags = metadata.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(tag, str) for tag in tags):
        fields.problem("[metadata].tags", f"must be a list of strings, got {tags!r}")
    for key in ("author_name", "author_email", "difficulty", "category"):
        if key in metadata and not isinstance(metadata[key], str):
            fields.problem(f"[metadata].{key}", f"must be a string, got {metadata[key]!r}")

    verifier = fields.table(config, "verifier")
    agent = fields.table(config, "agent")
    solution = fields.table(config, "solution")
    environment = fields.table(config, "environment")
    for name, section in (
        ("verifier", verifier),
        ("agent", agent),
        ("solution", solution),
        ("environment", environment),
    ):
        fields.unknown(section, _SECTIONS[name], f"[{name}].")

    agent_timeout = fields.seconds(agent, "agent", "timeout_sec", DEFAULT_AGENT_TIMEOUT_S)
    verifier_timeout = fields.seconds(
        verifier, "verifier", "timeout_sec", DEFAULT_VERIFIER_TIMEOUT_S
    )
    build_timeout = fields.seconds(
        environment, "environment", "build_timeout_sec", DEFAULT_BUILD_TIMEOUT_S
    )
    agent_user = fields.string(agent, "agent", "user")
    verifier_user = verifier_user or fields.string(verifier, "verifier", "user")
    verifier_env = fields.env(verifier, "verifier")
    solution_env = fields.env(solution, "solution")
    task_env = fields.env(environment, "environment")
    docker_image = fields.string(environment, "environment", "docker_image")
    workdir = fields.string(environment, "environment", "workdir")
    if workdir is not None and not workdir.startswith("/"):
        fields.problem("[environment].workdir", f"must be an absolute path, got {workdir!r}")
        workdir = None

    defaults = SandboxSpec()
    cpus = environment.get("cpus", defaults.cpu)
    if isinstance(cpus, bool) or not isinstance(cpus, int | float) or not cpus > 0:
        fields.problem("[environment].cpus", f"must be a positive number of cores, got {cpus!r}")
        cpus = defaults.cpu
    memory_mb = fields.size(environment, "memory", "memory_mb", defaults.memory_mb)
    disk_mb = fields.size(environment, "storage", "storage_mb", defaults.disk_mb)
    gpus = environment.get("gpus", 0)
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        fields.problem("[environment].gpus", f"must be a whole number >= 0, got {gpus!r}")
        gpus = 0
    allow_internet = environment.get("allow_internet", False)
    if not isinstance(allow_internet, bool):
        fields.problem(
            "[environment].allow_internet", f"must be true or false, got {allow_internet!r}"
        )
        allow_internet = False
    if environment.get("mcp_servers"):
        check.warnings.append(
            f"{check.task_id}: [environment].mcp_servers is not supported; the servers are not"
            " started"
        )

    dockerfile_text = _read_text(
        task_dir / "environment" / "Dockerfile",
        fields,
        "environment/Dockerfile",
        required=docker_image is None,
    )
    replay = docker_image is None if replay_dockerfile is None else replay_dockerfile
    parsed: DockerfileReplay | None = None
    if dockerfile_text is not None:
        parsed = parse_dockerfile(dockerfile_text)
        for message in parsed.problems:
            if replay or docker_image is None:
                fields.problem("environment/Dockerfile", message)
            else:
                check.warnings.append(f"{check.task_id}: environment/Dockerfile: {message}")
        if replay:
            check.notes.extend(f"{check.task_id}: Dockerfile {note}" for note in parsed.notes)
    elif replay and docker_image is not None:
        fields.problem(
            "environment/Dockerfile",
            "replay_dockerfile is on but the task has no Dockerfile; turn replay off or add one",
        )
        replay = False

    instruction = _read_text(task_dir / "instruction.md", fields, "instruction.md", required=True)
    if instruction is not None and not instruction.strip():
        fields.problem("instruction.md", "is empty; write the task for the agent")
    _read_text(task_dir / "tests" / "test.sh", fields, "tests/test.sh", required=True)
    solve = task_dir / "solution" / "solve.sh"

    if check.problems:
        return check

    replayed = parsed if (replay and parsed is not None) else None
    setup_commands = replayed.setup_commands if replayed else []
    env = {**(replayed.env if replayed else {}), **task_env}
    image = docker_image or (parsed.base_image if parsed else None)
    lifetime = agent_timeout + verifier_timeout + (build_timeout if setup_commands else 0.0)
    spec = SandboxSpec(
        image=image,
        dockerfile=dockerfile_text,
        workdir=workdir or (parsed.workdir if parsed and parsed.workdir else defaults.workdir),
        cpu=float(cpus),
        memory_mb=memory_mb,
        disk_mb=disk_mb,
        lifetime_s=lifetime,
        env=env,
        user=agent_user,
        network=NetworkPolicy.FULL if allow_internet else NetworkPolicy.NONE,
    )
    check.task = Task(
        task_id=check.task_id,
        instruction=instruction or "",
        source=SOURCE,
        data={
            "task_dir": str(task_dir),
            "verifier_user": verifier_user,
            "agent_user": agent_user,
            "setup_commands": setup_commands,
            "replay_dockerfile": bool(replayed),
            "build_timeout_s": build_timeout,
            "verifier_env": verifier_env,
            "solution_env": solution_env,
            "has_solution": solve.is_file(),
            "gpus": gpus,
        },
        environment=spec,
        agent_timeout_s=agent_timeout,
        verifier_timeout_s=verifier_timeout,
        metadata={"version": version or "", **metadata},
    )
    return check


def load_task(
    task_dir: str | Path,
    *,
    replay_dockerfile: bool | None = None,
    verifier_user: str | None = None,
) -> Task:
    """Read one Harbor task directory into a :class:`~rllm_core.types.Task`.

    The task id is the directory name. ``environment`` is the sandbox spec; ``data`` holds
    ``task_dir`` (absolute), ``verifier_user``, ``agent_user``, ``setup_commands`` (the
    replayed ``RUN`` steps, possibly empty), ``replay_dockerfile``, ``build_timeout_s``,
    ``verifier_env``, ``solution_env``, ``has_solution`` and ``gpus``. Raises
    ``TaskFormatError`` listing every problem; logs unknown fields as warnings and what replay
    skips at INFO.
    """
    check = check_task(task_dir, replay_dockerfile=replay_dockerfile, verifier_user=verifier_user)
    _log(check.warnings, check.notes)
    if check.task is None:
        raise TaskFormatError(check.problems)
    return check.task


def _read_dataset_toml(path: Path, check: DatasetCheck) -> None:
    where = path.name
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        check.problems.append(
            TaskProblem(task=check.name, field=where, message=f"cannot be read: {exc}")
        )
        return
    table = data.get("dataset", data)
    if not isinstance(table, dict):
        check.problems.append(
            TaskProblem(task=check.name, field=f"{where} [dataset]", message="must be a table")
        )
        return
    name = table.get("name")
    if name is not None:
        if isinstance(name, str) and name.strip():
            check.name = name.strip()
        else:
            check.problems.append(
                TaskProblem(
                    task=check.name, field=f"{where} name", message=f"must be a string: {name!r}"
                )
            )
    for key in table:
        if key not in _DATASET_KEYS and not (table is data and key == "dataset"):
            check.warnings.append(f"{check.name}: {where} key {key!r} is not known; ignored")


def check_dataset(
    path: str | Path,
    *,
    replay_dockerfile: bool | None = None,
    verifier_user: str | None = None,
) -> DatasetCheck:
    """Read every task of a dataset directory, without raising.

    ``path`` is a directory of task directories (hidden ones and ones starting with ``_`` are
    skipped; any other subdirectory must be a task), or a single task directory (one holding
    ``task.toml``). An optional ``dataset.toml`` names the set (``name``, ``version``,
    ``description``, at the top level or under ``[dataset]``).
    """
    path = Path(path).resolve()
    check = DatasetCheck(path=path, name=path.name)
    if not path.is_dir():
        check.problems.append(
            TaskProblem(task=path.name, field="(dataset)", message=f"{path} is not a directory")
        )
        return check
    if (path / "task.toml").is_file():
        task_dirs = [path]
    else:
        if (path / "dataset.toml").is_file():
            _read_dataset_toml(path / "dataset.toml", check)
        task_dirs = sorted(
            child
            for child in path.iterdir()
            if child.is_dir() and not child.name.startswith((".", "_"))
        )
        if not task_dirs:
            check.problems.append(
                TaskProblem(
                    task=check.name,
                    field="(dataset)",
                    message=f"{path} holds no task directories",
                )
            )
    for task_dir in task_dirs:
        task_check = check_task(
            task_dir, replay_dockerfile=replay_dockerfile, verifier_user=verifier_user
        )
        if task_check.task is not None and task_dir != path:
            task = task_check.task
            task_check.task = msgspec.structs.replace(
                task, metadata={**task.metadata, "dataset": check.name}
            )
        check.tasks.append(task_check)
    return check


def load_dataset(
    path: str | Path,
    *,
    replay_dockerfile: bool | None = None,
    verifier_user: str | None = None,
) -> list[Task]:
    """Read every task of a dataset directory, sorted by task id (see :func:`check_dataset`).

    Raises ``TaskFormatError`` listing every problem of every task.
    """
    check = check_dataset(path, replay_dockerfile=replay_dockerfile, verifier_user=verifier_user)
    _log(
        [*check.warnings, *(w for t in check.tasks for w in t.warnings)],
        [n for t in check.tasks for n in t.notes],
    )
    problems = check.all_problems
    if problems:
        raise TaskFormatError(problems)
    return [task_check.task for task_check in check.tasks if task_check.task is not None]


def _log(warnings: list[str], notes: list[str]) -> None:
    for warning in warnings:
        log.warning("%s", warning)
    for note in notes:
        log.info("%s", note)
