"""One run in several processes: ``rllm-core run`` starting its ranks through PyTorch's launcher.

``rllm-core run`` with ``[trainer].parallel.world_size`` above 1, and not itself started by
``torchrun``, starts ``python -m torch.distributed.run --standalone --nproc-per-node N -m rllm_core
run <same arguments>`` as a child (:func:`launch`). The child runs in a session of its own, so
a Ctrl-C at the terminal reaches this process only: it forwards SIGINT / SIGTERM to rank 0,
which stops and checkpoints as a one-process run does (torchrun itself would turn the signal
into SIGTERM for every rank, and ranks that die cannot take part in rank 0's last checkpoint).
Rank 0 writes its pid and, at the end, its exit code into the folder :data:`LAUNCH_DIR_ENV`
names (:func:`report_rank0`); :func:`launch` returns that code, since torchrun exits 1 for any
failed rank.

Torch is never imported here: the launcher is a subprocess.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from rllm_core.run.signals import handled

__all__ = [
    "LAUNCH_DIR_ENV",
    "DistributedEnv",
    "WorldSizeMismatch",
    "check_world_size",
    "distributed_env",
    "in_one_process",
    "launch",
    "launcher_argv",
    "report_rank0",
]

LAUNCH_DIR_ENV = "RLLM_CORE_LAUNCH_DIR"
"""The folder where rank 0 of a run that ``rllm-core run`` launched writes its pid and exit
code (set by :func:`launch` for its child; absent under a ``torchrun`` the user started)."""

PID_FILE = "rank0.pid"
EXIT_FILE = "rank0.exit"
_GROUP_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK")
_SIGNAL_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


@dataclass(frozen=True)
class DistributedEnv:
    """This process's place in a group ``torchrun`` started, from the variables it sets."""

    rank: int
    world_size: int
    local_rank: int


class WorldSizeMismatch(ValueError):
    """``torchrun`` started a number of processes other than the plan's world size."""


def distributed_env(environ: Mapping[str, str] | None = None) -> DistributedEnv | None:
    """The group this process belongs to when ``torchrun`` started it (``RANK`` set), else
    None. Raises :class:`ValueError` naming the variable when one is set and not an integer."""
    env = os.environ if environ is None else environ
    if not any(key in env for key in _GROUP_VARIABLES):
        return None
    values = {}
    for key, default in (("RANK", None), ("WORLD_SIZE", None), ("LOCAL_RANK", "0")):
        raw = env.get(key, default)
        if raw is None:
            raise ValueError(
                f"the environment sets {', '.join(k for k in _GROUP_VARIABLES if k in env)} but"
                f" not {key}: start the run with torchrun, which sets all three, or unset them"
            )
        try:
            values[key] = int(raw)
        except ValueError:
            raise ValueError(
                f"environment variable {key}={raw!r} is not an integer; torchrun sets it to"
                " this process's place in the group"
            ) from None
    return DistributedEnv(
        rank=values["RANK"], world_size=values["WORLD_SIZE"], local_rank=values["LOCAL_RANK"]
    )


def check_world_size(env: DistributedEnv, world_size: int, plan_path: str) -> None:
    """Raise :class:`WorldSizeMismatch` when torchrun's ``WORLD_SIZE`` is not the plan's."""
    if env.world_size != world_size:
        raise WorldSizeMismatch(
            f"torchrun started WORLD_SIZE={env.world_size} processes but {plan_path} has"
            f" [trainer].parallel.world_size = {world_size}; make them equal (torchrun"
            " --nnodes times --nproc-per-node is the world size, or --set"
            f" trainer.parallel.world_size={env.world_size})"
        )


def launcher_argv(
    world_size: int, run_args: Sequence[str], *, python: str | None = None
) -> list[str]:
    """The command that starts ``world_size`` ranks of ``rllm-core run_args`` on this machine
    (``run_args`` begins with ``run``)."""
    return [
        python or sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(world_size),
        "-m",
        "rllm_core",
        *run_args,
    ]


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None


def launch(
    world_size: int,
    run_args: Sequence[str],
    *,
    python: str | None = None,
    argv: Sequence[str] | None = None,
) -> int:
    """Run ``rllm-core run_args`` in ``world_size`` processes (see the module docstring) and
    return rank 0's exit code: 0 finished, 1 failed, 2 plan or usage error, 130 / 143
    interrupted, 3 the scheduler gave up. ``argv`` replaces the launcher command (tests)."""
    command = list(argv) if argv is not None else launcher_argv(world_size, run_args, python=python)
    with tempfile.TemporaryDirectory(prefix="rllm-core-launch-") as folder:
        env = dict(os.environ, **{LAUNCH_DIR_ENV: folder})
        # torchrun would otherwise set 1 thread per rank with a warning; share the cores instead.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world_size)))
        child = subprocess.Popen(command, env=env, start_new_session=True)
        received: list[int] = []

        def forward(signum: int, frame: FrameType | None) -> None:
            received.append(signum)
            pid = _read_int(Path(folder) / PID_FILE)
            # A third signal, or one before rank 0 started, goes to the launcher: it ends
            # every rank.
            if pid is not None and len(received) <= 2:
                try:
                    os.kill(pid, signum)
                    return
                except ProcessLookupError:
                    pass
            if child.poll() is None:
                child.send_signal(signum)

        with handled(forward, tuple(_SIGNAL_CODES)):
            returncode = child.wait()
        code = _read_int(Path(folder) / EXIT_FILE)
    if code is not None:
        return code
    if received:
        return _SIGNAL_CODES.get(signal.Signals(received[0]), 1)
    return returncode if returncode >= 0 else 128 - returncode


@contextmanager
def report_rank0(environ: Mapping[str, str] | None = None) -> Iterator[None]:
    """Around rank 0's run: write its pid now and its exit code at the end into the folder
    :data:`LAUNCH_DIR_ENV` names; nothing when it is unset."""
    env = os.environ if environ is None else environ
    folder = env.get(LAUNCH_DIR_ENV)
    if not folder:
        yield
        return
    _write(Path(folder) / PID_FILE, os.getpid())
    code = 1
    try:
        yield
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        raise
    except KeyboardInterrupt:
        code = 130
        raise
    finally:
        _write(Path(folder) / EXIT_FILE, code)


def _write(path: Path, value: int) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(str(value), encoding="utf-8")
    os.replace(partial, path)


def in_one_process(resolved: Any) -> Any:
    """``resolved`` (a :class:`~rllm_core.plan.ResolvedPlan`) with its trainer built for one
    process (``parallel.world_size = 1``), for commands that only sample from the trainer: the
    sampler role and ``rllm-core eval``. A plan without a ``parallel`` table is returned as
    it is."""
    from dataclasses import replace

    from rllm_core.ports import ParallelSettings

    trainer = resolved.get("[trainer]")
    parallel = getattr(trainer.config, "parallel", None) if trainer is not None else None
    if not isinstance(parallel, ParallelSettings) or parallel.world_size == 1:
        return resolved
    alone = trainer.config.model_copy(
        update={"parallel": parallel.model_copy(update={"world_size": 1})}
    )
    components = dict(resolved.components)
    components["[trainer]"] = replace(trainer, config=alone)
    return replace(resolved, components=components)
