"""The Harbor task format reader: a task directory becomes a :class:`~rllm_core.types.Task`.

A task directory holds ``task.toml``, ``instruction.md``, ``environment/Dockerfile`` (and the
files it uses), ``tests/test.sh`` and optionally ``solution/solve.sh``. A dataset is a
directory of task directories, optionally with a ``dataset.toml``. ``docs/tasks.md`` lists
every field and how it is read; :mod:`.task_toml` holds the model of ``task.toml``.

Every problem is collected before anything is raised, so one ``TaskFormatError`` names each
bad field of each task. Unknown fields are warned about, never fatal.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import msgspec
from rllm_core.errors import TaskFormatError, TaskProblem
from rllm_core.ports.agents import DatasetCheck, TaskCheck
from rllm_core.toml_text import load_toml_text
from rllm_core.types import NetworkPolicy, SandboxSpec, Task

from rllm_task_source_harbor.dockerfile import CopyStep, DockerfileReplay, RunStep, parse_dockerfile
from rllm_task_source_harbor.task_toml import (
    HealthcheckSection,
    VerifierSection,
    read_task_toml,
    unknown_keys,
)

__all__ = [
    "SOURCE",
    "check_dataset",
    "check_task",
    "load_dataset",
    "load_task",
]

log = logging.getLogger("rllm_task_source_harbor")

SOURCE = "harbor"
_DATASET_KEYS = frozenset({"name", "version", "description"})


def _problem(check: TaskCheck, where: str, message: str) -> None:
    check.problems.append(TaskProblem(task=check.task_id, field=where, message=message))


def _read_text(path: Path, check: TaskCheck, where: str, *, required: bool) -> str | None:
    if not path.is_file():
        if required:
            _problem(check, where, f"missing: expected a file at {path}")
        return None
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        _problem(check, where, f"cannot be read as UTF-8 text: {exc}")
        return None


def check_task(
    task_dir: str | Path,
    *,
    replay_dockerfile: bool | None = None,
    verifier_user: str | None = None,
    reward_key: str | None = None,
) -> TaskCheck:
    """Read one task directory and report everything found, without raising.

    ``replay_dockerfile`` overrides the default (on for a Dockerfile base image, off when the
    task names a prebuilt ``[environment].docker_image``); ``verifier_user`` overrides
    ``[verifier].user`` and ``reward_key`` ``[verifier].reward_key``. The check's
    ``settings`` are ``verifier_user``, ``replay_dockerfile``, ``setup_steps`` (replayed
    ``RUN`` and ``COPY``/``ADD`` steps) and ``healthcheck`` (its command, or ``None``); its
    ``setup`` is ``"N RUN"``, ``"N RUN, M COPY"`` or ``"image"``, followed by
    ``" + healthcheck"`` when the task has one.

    Each replayed ``COPY``/``ADD`` is planned against the build context (the folder of
    ``environment/Dockerfile``) here, so a source that is missing or cannot be replayed is a
    problem of the task, not a failure of its episodes.
    """
    task_dir = Path(task_dir).resolve()
    check = TaskCheck(task_dir=task_dir, task_id=task_dir.name)
    if not task_dir.is_dir():
        _problem(check, "(task directory)", f"{task_dir} is not a directory")
        return check

    config: dict[str, Any] = {}
    toml_text = _read_text(task_dir / "task.toml", check, "task.toml", required=True)
    if toml_text is None:
        return check
    try:
        config = load_toml_text(toml_text)
    except ValueError as exc:
        _problem(check, "task.toml", f"is not valid TOML: {exc}")
    check.warnings.extend(
        f"{check.task_id}: {key} is not a known field; ignored" for key in unknown_keys(config)
    )
    toml, problems = read_task_toml(config)
    for where, message in problems:
        _problem(check, where, message)
    agent, verifier, environment = toml.agent, toml.verifier, toml.environment
    verifier_user = verifier_user or verifier.user
    reward_key_source = "the task source" if reward_key else "task.toml [verifier]"
    reward_key = reward_key or verifier.reward_key
    if toml.steps is not None:
        _problem(
            check,
            "steps",
            "multi-step tasks are not supported: this reader runs one instruction.md and one"
            " tests/test.sh per task; split the steps into separate tasks",
        )
    _check_verifier_environment(check, task_dir, verifier)
    if environment.mcp_servers:
        check.warnings.append(
            f"{check.task_id}: [environment].mcp_servers is not supported; the servers are not"
            " started"
        )

    docker_image = environment.docker_image
    dockerfile_text = _read_text(
        task_dir / "environment" / "Dockerfile",
        check,
        "environment/Dockerfile",
        required=docker_image is None,
    )
    replay = docker_image is None if replay_dockerfile is None else replay_dockerfile
    parsed: DockerfileReplay | None = None
    if dockerfile_text is not None:
        parsed = parse_dockerfile(dockerfile_text)
        for message in parsed.problems:
            if replay or docker_image is None:
                _problem(check, "environment/Dockerfile", message)
            else:
                check.warnings.append(f"{check.task_id}: environment/Dockerfile: {message}")
        if replay:
            check.notes.extend(f"{check.task_id}: Dockerfile {note}" for note in parsed.notes)
            for step in parsed.copy_steps:
                try:
                    step.plan(task_dir / "environment")
                except ValueError as exc:
                    _problem(check, "environment/Dockerfile", str(exc))
    elif replay and docker_image is not None:
        _problem(
            check,
            "environment/Dockerfile",
            "replay_dockerfile is on but the task has no Dockerfile; turn replay off or add one",
        )
        replay = False

    healthcheck = environment.healthcheck
    if healthcheck is not None and healthcheck.command is None:
        _problem(
            check,
            "[environment.healthcheck].command",
            "missing: the healthcheck needs a command that exits 0 when the environment is ready",
        )

    instruction = _read_text(task_dir / "instruction.md", check, "instruction.md", required=True)
    if instruction is not None and not instruction.strip():
        _problem(check, "instruction.md", "is empty; write the task for the agent")
    _read_text(task_dir / "tests" / "test.sh", check, "tests/test.sh", required=True)
    check.has_solution = (task_dir / "solution" / "solve.sh").is_file()

    if check.problems:
        return check

    replayed = parsed if (replay and parsed is not None) else None
    setup_steps = [_setup_step(step) for step in replayed.steps] if replayed else []
    build_timeout = environment.build_timeout_sec
    lifetime = agent.timeout_sec + verifier.timeout_sec + (build_timeout if setup_steps else 0.0)
    if healthcheck is not None:
        lifetime += healthcheck.worst_case_s
    defaults = SandboxSpec()
    memory_mb = environment.memory_size
    disk_mb = environment.storage_size
    spec = SandboxSpec(
        context_dir=str(task_dir / "environment") if dockerfile_text is not None else None,
        image=docker_image or (parsed.base_image if parsed else None),
        dockerfile=dockerfile_text,
        replays_dockerfile=replayed is not None and docker_image is None,
        workdir=environment.workdir
        or (parsed.workdir if parsed and parsed.workdir else defaults.workdir),
        cpu=environment.cpus if environment.cpus is not None else defaults.cpu,
        memory_mb=memory_mb if memory_mb is not None else defaults.memory_mb,
        disk_mb=disk_mb if disk_mb is not None else defaults.disk_mb,
        lifetime_s=lifetime,
        env={**(replayed.env if replayed else {}), **environment.env},
        user=agent.user,
        network=NetworkPolicy.FULL if environment.internet else NetworkPolicy.NONE,
    )
    check.task = Task(
        task_id=check.task_id,
        instruction=instruction or "",
        source=SOURCE,
        data={
            "task_dir": str(task_dir),
            "verifier_user": verifier_user,
            "reward_key": reward_key,
            "reward_key_source": reward_key_source,
            "agent_user": agent.user,
            "setup_steps": setup_steps,
            "context_dir": str(task_dir / "environment"),
            "healthcheck": _healthcheck_data(healthcheck),
            "replay_dockerfile": bool(replayed),
            "build_timeout_s": build_timeout,
            "verifier_env": verifier.env,
            "solution_env": toml.solution.env,
            "has_solution": check.has_solution,
            "gpus": environment.gpus,
        },
        environment=spec,
        agent_timeout_s=agent.timeout_sec,
        verifier_timeout_s=verifier.timeout_sec,
        metadata={
            "version": toml.declared_version or "",
            **({"package": toml.task} if toml.task is not None else {}),
            **toml.metadata.model_dump(exclude_unset=True),
        },
    )
    check.settings = {
        "verifier_user": verifier_user,
        "replay_dockerfile": bool(replayed),
        "setup_steps": len(setup_steps),
        "healthcheck": healthcheck.command if healthcheck is not None else None,
    }
    check.setup = _describe_setup(replayed) + (" + healthcheck" if healthcheck else "")
    return check


def _setup_step(step: RunStep | CopyStep) -> dict[str, Any]:
    """One replayed step as ``task.data["setup_steps"]`` holds it."""
    if isinstance(step, RunStep):
        return {"run": step.render(), "line": step.line}
    return {"copy": step.to_dict(), "line": step.line}


def _describe_setup(replayed: DockerfileReplay | None) -> str:
    if replayed is None:
        return "image"
    runs = len(replayed.setup_commands)
    copies = len(replayed.copy_steps)
    return f"{runs} RUN, {copies} COPY" if copies else f"{runs} RUN"


def _healthcheck_data(healthcheck: HealthcheckSection | None) -> dict[str, Any] | None:
    if healthcheck is None:
        return None
    return {
        "command": healthcheck.command,
        "timeout_s": healthcheck.timeout_sec,
        "interval_s": healthcheck.interval_sec,
        "retries": healthcheck.retries,
        "start_period_s": healthcheck.start_period_sec,
        "start_interval_s": healthcheck.start_interval_sec,
    }


def _check_verifier_environment(
    check: TaskCheck, task_dir: Path, verifier: VerifierSection
) -> None:
    """Refuse a separate verifier environment: the verifier runs in the agent's sandbox."""
    tests_dockerfile = task_dir / "tests" / "Dockerfile"
    mode = verifier.environment_mode
    if mode == "shared" and verifier.environment is not None:
        _problem(
            check,
            "[verifier].environment",
            "is set but [verifier].environment_mode is 'shared'; remove one of them",
        )
        return
    if mode == "separate" or verifier.environment is not None:
        field = "[verifier].environment_mode" if mode == "separate" else "[verifier].environment"
        image = (
            f"its image built from {tests_dockerfile}"
            if tests_dockerfile.is_file()
            else "its own image"
        )
        _problem(
            check,
            field,
            f"asks for a separate verifier environment ({image}), which this task source"
            " does not support: it runs tests/test.sh in the agent's sandbox only"
            " (environment_mode = 'shared'); remove the setting and install what the"
            " verifier needs in environment/Dockerfile",
        )
        return
    if tests_dockerfile.is_file():
        check.warnings.append(
            f"{check.task_id}: tests/Dockerfile is only built for a separate verifier"
            " environment; the verifier runs in the agent's sandbox and the file is uploaded"
            " with tests/"
        )


def load_task(
    task_dir: str | Path,
    *,
    replay_dockerfile: bool | None = None,
    verifier_user: str | None = None,
    reward_key: str | None = None,
) -> Task:
    """Read one Harbor task directory into a :class:`~rllm_core.types.Task`.

    The task id is the directory name. ``environment`` is the sandbox spec; ``agent_timeout_s``
    is ``[agent].timeout_sec`` (the harness's time budget for the task) and
    ``verifier_timeout_s`` ``[verifier].timeout_sec``. ``data`` holds ``task_dir``
    (absolute), ``verifier_user``, ``agent_user``, ``setup_steps`` (the replayed steps in
    order, possibly none: ``{"run": command, "line": N}`` or ``{"copy": CopyStep.to_dict(),
    "line": N}``), ``context_dir`` (the build context, ``environment/``), ``healthcheck``
    (``command``, ``timeout_s``, ``interval_s``, ``retries``, ``start_period_s``,
    ``start_interval_s``; ``None`` without one), ``replay_dockerfile``, ``build_timeout_s``,
    ``verifier_env``, ``solution_env``, ``has_solution``, ``gpus``, ``reward_key`` and
    ``reward_key_source`` (where the key was set). Raises
    ``TaskFormatError`` listing every problem; logs unknown fields as warnings and what replay
    skips at INFO.
    """
    check = check_task(
        task_dir,
        replay_dockerfile=replay_dockerfile,
        verifier_user=verifier_user,
        reward_key=reward_key,
    )
    _log(check.warnings, check.notes)
    if check.task is None:
        raise TaskFormatError(check.problems)
    return check.task


def _read_dataset_toml(path: Path, check: DatasetCheck) -> None:
    where = path.name
    try:
        data = load_toml_text(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
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
    reward_key: str | None = None,
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
            task_dir,
            replay_dockerfile=replay_dockerfile,
            verifier_user=verifier_user,
            reward_key=reward_key,
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
    reward_key: str | None = None,
) -> list[Task]:
    """Read every task of a dataset directory, sorted by task id (see :func:`check_dataset`).

    Raises ``TaskFormatError`` listing every problem of every task.
    """
    check = check_dataset(
        path,
        replay_dockerfile=replay_dockerfile,
        verifier_user=verifier_user,
        reward_key=reward_key,
    )
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
