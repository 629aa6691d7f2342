"""Running a task's verifier in its sandbox and reading the reward it writes.

Contract: ``tests/`` is uploaded to ``/tests`` only now, after the agent finished, once
whatever the agent left there, every reward file of :data:`REWARD_FILES` with the folders
holding them, and any link it put in their place are removed; ``bash /tests/test.sh`` runs
as the verifier user, in the workdir, with ``[verifier].env`` and the verifier timeout; the
reward is read from the first existing of :data:`REWARD_FILES`: ``reward.json``, then
``rewards.json``, then ``reward.txt`` in ``/logs/verifier``, then the same in
``/tmp/rllm/logs/verifier``, then ``/tmp/rllm/reward.json`` (see :func:`parse_reward` for
which named reward of a ``reward.json`` is trained on). Anything that keeps a reward from
being read is a ``VerifierError``, never a reward of 0. The agent's processes are gone by
then: the rollout ends them first (see :class:`rllm_core.ports.EndsProcesses`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rllm_core.errors import (
    RewardFileInvalid,
    RewardFileMissing,
    SandboxCommandTimeout,
    SandboxError,
    SandboxFileNotFound,
    VerifierCrashed,
    VerifierTimeout,
)
from rllm_core.ports.sandboxes import Sandbox
from rllm_core.types import Grade, Task

from rllm_task_source_harbor.output import output_tail
from rllm_task_source_harbor.upload import upload_dir

__all__ = ["REWARD_FILES", "TESTS_DIR", "parse_reward", "run_verifier"]

TESTS_DIR = "/tests"
# rewards.json is read like reward.json (the name Harbor writes); reward.json wins over it.
# /tmp/rllm/reward.json, where some task builders write, is the last resort.
REWARD_FILES = (
    "/logs/verifier/reward.json",
    "/logs/verifier/rewards.json",
    "/logs/verifier/reward.txt",
    "/tmp/rllm/logs/verifier/reward.json",
    "/tmp/rllm/logs/verifier/rewards.json",
    "/tmp/rllm/logs/verifier/reward.txt",
    "/tmp/rllm/reward.json",
)
# A parent the agent replaced with a link (or a file) goes first, so that nothing below
# resolves into a folder it chose.
_RESET = (
    "set -e; for d in /logs /tmp/rllm /tmp/rllm/logs; do"
    ' if [ -L "$d" ] || { [ -e "$d" ] && [ ! -d "$d" ]; }; then rm -f "$d"; fi; done;'
    " rm -rf /tests /logs/verifier /tmp/rllm/logs/verifier /tmp/rllm/reward.json;"
    " mkdir -p /tests /logs/verifier; chmod 0777 /logs/verifier"
)
_RESET_TIMEOUT_S = 60.0


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _signals(data: dict[str, Any], prefix: str, out: dict[str, float]) -> list[str]:
    """Collect numeric fields (nested tables as ``outer.inner``); return non-finite names."""
    bad = []
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            bad.extend(_signals(value, f"{name}.", out))
            continue
        number = _number(value)
        if number is None:
            continue
        if not math.isfinite(number):
            bad.append(name)
        else:
            out[name] = number
    return bad


def _named_rewards(
    data: dict[str, Any], invalid: Callable[[str], RewardFileInvalid]
) -> dict[str, float]:
    rewards: dict[str, float] = {}
    bad = _signals(data, "", rewards)
    if "reward" in data and not isinstance(data["reward"], dict) and "reward" not in rewards:
        if "reward" in bad:
            raise invalid(f"holds a non-finite reward {data['reward']!r}")
        raise invalid(f"has a non-numeric reward {data['reward']!r}")
    if bad:
        raise invalid("holds non-finite values in " + ", ".join(bad))
    return rewards


def _scalar(
    rewards: dict[str, float],
    reward_key: str | None,
    key_source: str,
    invalid: Callable[[str], RewardFileInvalid],
) -> float:
    """The reward trained on: the one ``reward_key`` names, else ``reward``, else the only
    one, else the mean of all."""
    if reward_key is not None:
        if reward_key not in rewards:
            held = ", ".join(rewards) or "no numeric field"
            raise invalid(
                f"has no numeric reward named {reward_key!r} (the reward_key of {key_source});"
                f" it holds {held}"
            )
        return rewards[reward_key]
    if "reward" in rewards:
        return rewards["reward"]
    if not rewards:
        raise invalid("holds no numeric reward")
    return math.fsum(rewards.values()) / len(rewards)


def parse_reward(
    path: str,
    content: str,
    *,
    task_id: str,
    reward_key: str | None = None,
    reward_key_source: str = "task.toml [verifier]",
) -> Grade:
    """Read one reward file's text into a :class:`~rllm_core.types.Grade`.

    ``reward.txt`` holds one finite number, the reward. ``reward.json`` (or ``rewards.json``,
    read the same way) holds an object of named rewards: every numeric field (nested
    objects flattened to ``outer.inner``; strings, lists and booleans ignored). The reward
    trained on is the field ``reward_key`` names (``reward_key_source`` says where it was
    set, for the error), else the field ``reward``, else the only named reward, else the mean
    of all of them; every named reward but ``reward`` itself becomes a signal. Raises
    ``RewardFileInvalid`` for an empty file, text that does not parse, no numeric field, a
    missing ``reward_key`` field, a non-numeric ``reward`` or a non-finite number.
    """

    def invalid(reason: str) -> RewardFileInvalid:
        return RewardFileInvalid(
            f"task {task_id}: reward file {path} {reason}; make tests/test.sh write one"
            " finite number to reward.txt or a JSON object of named numbers, such as"
            ' {"reward": 1.0}, to reward.json',
            task_id=task_id,
            path=path,
            content=content[:500],
        )

    text = content.strip()
    if not text:
        raise invalid("is empty")
    if path.endswith(".json"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise invalid(f"is not valid JSON ({exc})") from exc
        if not isinstance(data, dict):
            raise invalid(f"must hold a JSON object, got {text[:80]!r}")
        rewards = _named_rewards(data, invalid)
        reward = _scalar(rewards, reward_key, reward_key_source, invalid)
        return Grade(reward=reward, signals={k: v for k, v in rewards.items() if k != "reward"})
    try:
        reward = float(text)
    except ValueError as exc:
        raise invalid(f"must hold one number, got {text[:80]!r}") from exc
    if not math.isfinite(reward):
        raise invalid(f"holds a non-finite reward {text[:80]!r}")
    return Grade(reward=reward)


async def run_verifier(task: Task, sandbox: Sandbox) -> Grade:
    """Run the task's verifier in ``sandbox`` and return its grade.

    Raises ``VerifierTimeout`` when ``test.sh`` runs past ``task.verifier_timeout_s``,
    ``VerifierCrashed`` (with the tail of its output) when it exits non-zero without writing a
    reward file, ``RewardFileMissing`` when it exits 0 without one, and ``RewardFileInvalid``
    when the first reward file found cannot be read as a reward. A test.sh that exits
    non-zero after writing a reward (failing tests) yields that reward. Sandbox failures raise
    ``SandboxError``.
    """
    task_dir = Path(task.data["task_dir"])
    reset = await sandbox.exec(_RESET, timeout=_RESET_TIMEOUT_S, cwd="/")
    if reset.exit_code != 0:
        raise SandboxError(
            f"task {task.task_id}: could not prepare /tests and /logs/verifier"
            f" (exit {reset.exit_code}): {output_tail(reset.stdout, reset.stderr)}"
        )
    await upload_dir(sandbox, task_dir / "tests", TESTS_DIR)
    spec = task.environment
    try:
        result = await sandbox.exec(
            f"bash {TESTS_DIR}/test.sh",
            timeout=task.verifier_timeout_s,
            user=task.data.get("verifier_user"),
            env=task.data.get("verifier_env") or None,
            cwd=spec.workdir if spec else None,
        )
    except SandboxCommandTimeout as exc:
        raise VerifierTimeout(
            f"task {task.task_id}: tests/test.sh ran past the {task.verifier_timeout_s:g} s"
            " verifier timeout and was killed; raise [verifier].timeout_sec or speed it up",
            task_id=task.task_id,
            timeout_s=task.verifier_timeout_s,
        ) from exc
    for path in REWARD_FILES:
        try:
            raw = await sandbox.read_file(path)
        except SandboxFileNotFound:
            continue
        return parse_reward(
            path,
            raw.decode("utf-8", errors="replace"),
            task_id=task.task_id,
            reward_key=task.data.get("reward_key"),
            reward_key_source=task.data.get("reward_key_source") or "task.toml [verifier]",
        )
    if result.exit_code != 0:
        tail = output_tail(result.stdout, result.stderr)
        raise VerifierCrashed(
            f"task {task.task_id}: tests/test.sh exited {result.exit_code} without writing a"
            f" reward file. Output tail:\n{tail}",
            task_id=task.task_id,
            exit_code=result.exit_code,
            output=tail,
        )
    raise RewardFileMissing(
        f"task {task.task_id}: tests/test.sh exited 0 but wrote none of "
        + ", ".join(REWARD_FILES)
        + "; make it write the reward to /logs/verifier/reward.txt",
        task_id=task.task_id,
        searched=REWARD_FILES,
    )
