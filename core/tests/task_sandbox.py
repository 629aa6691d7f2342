"""Helpers for the task tests: writing task directories, and a sandbox with private absolute
paths built on the reference subprocess backend.

Harbor tasks use absolute paths (/tests, /solution, /logs/verifier, /app). The reference
backend runs on the host filesystem, so :class:`RootedBackend` gives each sandbox a private
root directory and maps those paths into it: in file calls, in ``cwd`` and in the command
text the harbor task source sends. Scripts run inside see the root as ``$SANDBOX_ROOT`` and
write their reward to ``$SANDBOX_ROOT/logs/verifier/...``. This module holds no tests.
"""

from __future__ import annotations

import os
import posixpath
import re
import textwrap
from collections.abc import Mapping
from pathlib import Path

import msgspec
from reference.subprocess_sandbox import SubprocessBackend, SubprocessSandbox
from rllm_core.types import ExecResult, SandboxSpec

PRIVATE_PREFIXES = ("/tests", "/solution", "/logs", "/tmp/rllm", "/app", "/workspace")
_PATH_RE = re.compile(
    r"(?<![\w./-])(" + "|".join(re.escape(p) for p in PRIVATE_PREFIXES) + r")(?=[/\s;'\"&|)]|$)"
)

GOOD_TOML = """\
version = "1.0"

[metadata]
author_name = "Ada"
difficulty = "easy"
category = "files"
tags = ["shell"]

[agent]
timeout_sec = 30

[verifier]
timeout_sec = 20
"""

GOOD_DOCKERFILE = """\
FROM debian:bookworm-slim
WORKDIR /app
RUN printf 'a\\nb\\n' > input.txt
"""

REWARD_TXT = '"$SANDBOX_ROOT/logs/verifier/reward.txt"'

GOOD_TEST = f"""\
mkdir -p "$SANDBOX_ROOT/logs/verifier"
if [ "$(cat output.txt 2>/dev/null)" = "done" ]; then echo 1 > {REWARD_TXT};
else echo 0 > {REWARD_TXT}; fi
"""

GOOD_SOLVE = "echo done > output.txt\n"


def write_task(
    root: Path,
    name: str = "task-a",
    *,
    toml: str | None = GOOD_TOML,
    instruction: str | None = "Write done to output.txt.\n",
    dockerfile: str | None = GOOD_DOCKERFILE,
    test_sh: str | None = GOOD_TEST,
    solve_sh: str | None = GOOD_SOLVE,
    extra: Mapping[str, str] | None = None,
) -> Path:
    """Create a task directory; a ``None`` part is left out."""
    task_dir = root / name
    task_dir.mkdir(parents=True)
    parts = {
        "task.toml": toml,
        "instruction.md": instruction,
        "environment/Dockerfile": dockerfile,
        "tests/test.sh": test_sh,
        "solution/solve.sh": solve_sh,
        **(extra or {}),
    }
    for relative, text in parts.items():
        if text is None:
            continue
        path = task_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return task_dir


class RootedSandbox(SubprocessSandbox):
    """A subprocess sandbox whose absolute task paths live under ``root``; it records every
    exec as ``(command, timeout, user, env, cwd)`` in ``calls``."""

    root: str = ""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.calls: list[tuple[str, float, str | None, dict[str, str] | None, str | None]] = []

    def host_path(self, path: str) -> str:
        if path.startswith(PRIVATE_PREFIXES) or path == "/":
            return posixpath.join(self.root, path.lstrip("/"))
        return path

    def _path(self, path: str) -> str:
        if posixpath.isabs(path):
            return self.host_path(path)
        return posixpath.join(self.workdir, path)

    async def exec(
        self,
        command: str,
        timeout: float,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        self.calls.append((command, timeout, user, dict(env) if env else None, cwd))
        mapped = _PATH_RE.sub(lambda m: self.root + m.group(1), command)
        return await super().exec(mapped, timeout, user=None, env=env, cwd=cwd)


class RootedBackend(SubprocessBackend):
    """Creates :class:`RootedSandbox` es, each under its own directory of ``base``. Image,
    Dockerfile and user in the spec are ignored (the commands run on this host as this
    user); ``specs`` keeps every spec asked for."""

    sandbox_class = RootedSandbox

    def __init__(self, base: Path) -> None:
        super().__init__(output_limit_bytes=1 << 16)
        self.base = base
        self.specs: list[SandboxSpec] = []
        self.created: list[RootedSandbox] = []

    async def create(self, spec: SandboxSpec) -> RootedSandbox:
        self.specs.append(spec)
        root = self.base / f"sandbox-{len(self.specs)}"
        root.mkdir(parents=True)
        workdir = posixpath.join(str(root), spec.workdir.lstrip("/"))
        host_spec = msgspec.structs.replace(
            spec,
            image=None,
            dockerfile=None,
            user=None,
            workdir=workdir,
            env={**spec.env, "SANDBOX_ROOT": str(root), "PATH": os.environ.get("PATH", "")},
        )
        sandbox = await super().create(host_spec)
        assert isinstance(sandbox, RootedSandbox)
        sandbox.root = str(root)
        self.created.append(sandbox)
        return sandbox
