"""The trainer on its own island: each trainer incarnation runs as a job of its own.

With ``[scheduler].launcher`` other than ``in-process``, the ``--role trainer`` process only
schedules: its controller (:mod:`rllm_core.training.scheduler`) drives an
:class:`IslandTrainer`, which starts each incarnation through a
:class:`~rllm_core.ports.TrainerLauncher` and talks to it only through the run's object store.
Under ``runs/<name>/island/<incarnation:06d>/``:

============  =========  ==============================================================
key           writer     content
============  =========  ==============================================================
command.json  scheduler  a :class:`CommandFile`: what the job runs (plan, role, incarnation,
                         the cut it resumes from); written before the launch, create-only
ready         job        ``{"ts", "step"}``: the cut is restored, the job trains from now on
heartbeat     job        ``{"ts", "step"}``: rewritten after every round and every ``poll_s``
stop          scheduler  ``{"trigger"}``: cut with this trigger at the next round boundary
stopped       job        ``{"ts", "step", "trigger"}``: the cut is written; the job then exits 0
============  =========  ==============================================================

The job (:class:`IslandIncarnation`, ``rllm-core run PLAN --role trainer --incarnation N``)
trains every batch it finds, as the in-process trainer does. The scheduler counts one round
for each step the heartbeat moves on, and calls the job idle when its next batch is not in the
store. Timestamps are wall-clock seconds.

Orphans. An incarnation is released (its job ended through the launcher) when it is not ready
within ``ready_timeout_s``, exits on its own, or its heartbeat is older than ``lease_s``; the
journal records ``launched``, ``ready-timeout`` and ``released`` with the reason, besides the
controller's own ``started``, ``ready``, ``stopped`` and ``failed``. A job that comes up, or is
still running, after a newer incarnation's command file was written (a scheduler that lost
track of it, a launcher that released it late) finds that file and exits at once without
training or cutting; were it to cut anyway, the incarnation fence of :mod:`rllm_core.run.cuts`
would refuse to let its cut become the newest.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from rllm_core.errors import ObjectNotFoundError, RllmError
from rllm_core.ports import ObjectStore, StopTrigger, TrainerJob, TrainerLauncher
from rllm_core.run.cuts import latest_cut
from rllm_core.training.shared import SharedRun

if TYPE_CHECKING:
    from rllm_core.plan import ResolvedPlan
    from rllm_core.training.roles import TrainerRole

__all__ = [
    "DEFAULT_READY_TIMEOUT_S",
    "CommandFile",
    "IslandIncarnation",
    "IslandTrainer",
    "LAUNCHER_WHERE",
    "LocalProcessLauncher",
    "TrainerJobError",
    "TrainerNotReady",
    "build_launcher",
    "close_launcher",
    "island_key",
    "read_command",
]

LAUNCHER_WHERE = "[scheduler].launcher"
"""Where a plugin's trainer launcher is in a resolved plan."""

DEFAULT_READY_TIMEOUT_S = 600.0
"""``[scheduler].ready_timeout_s`` when unset."""

ORPHANED_EXIT = 4
"""The exit status of a job that found a newer incarnation's command file and did nothing."""


class TrainerJobError(RllmError):
    """A launched trainer incarnation ended without doing what it was asked to (it exited
    before it was ready or before it was asked to stop, exited with an error, or its heartbeat
    was lost). The message names the incarnation, the job and where its log is."""


class TrainerNotReady(TrainerJobError):
    """A launched incarnation wrote no ready marker within ``[scheduler].ready_timeout_s``."""


class CommandFile(msgspec.Struct, kw_only=True, frozen=True):
    """What one trainer job runs: ``role`` of ``run`` as incarnation ``incarnation``, from the
    plan at ``plan_path`` (relative to ``cwd``) with ``overrides`` (``--set`` items), resuming
    from cut ``resume_cut`` (the newest when the command was written; None: the initial
    state). ``plan`` is the plan file's text, for a job on a machine that cannot read
    ``plan_path``. ``node`` names the convertible node the job runs on (``[scheduler].nodes``,
    :mod:`rllm_core.training.node_agent`), None without nodes; a launcher that places jobs on
    machines puts the job there."""

    incarnation: int
    run: str
    plan_path: str
    plan: str
    overrides: list[str] = []
    cwd: str = "."
    role: str = "trainer"
    resume_cut: str | None = None
    launched_at: float = 0.0
    node: str | None = None


def island_key(shared: SharedRun, incarnation: int, name: str) -> str:
    """The key of ``name`` (``command.json``, ``ready`` ...) of ``incarnation``."""
    return shared.key("island", f"{incarnation:06d}", name)


def read_command(store: ObjectStore, key: str) -> CommandFile:
    """The command file at ``key``; raises :class:`TrainerJobError` naming it when it is missing
    or not a command file."""
    try:
        return msgspec.json.decode(store.get(key), type=CommandFile)
    except ObjectNotFoundError as exc:
        raise TrainerJobError(
            f"no trainer command file at {key!r} in {store!r}: start the job with the key the"
            " scheduler wrote (runs/<name>/island/<incarnation>/command.json)"
        ) from exc
    except msgspec.ValidationError as exc:
        raise TrainerJobError(f"{key!r} in {store!r} is not a trainer command file: {exc}") from exc


def _marker(store: ObjectStore, key: str) -> dict[str, Any] | None:
    try:
        return json.loads(store.get(key))
    except ObjectNotFoundError:
        return None


def _json(value: dict[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


# ---------------------------------------------------------------- the scheduler's side


class IslandTrainer:
    """The scheduler's :class:`~rllm_core.ports.TrainerLifecycle` of a trainer whose
    incarnations run as jobs started by ``launcher`` (the module docstring).

    ``command`` is the command file of an incarnation with its number and resume cut left to
    fill; ``steps`` is ``[run].steps``. ``record`` journals a lifecycle event (the controller's
    :meth:`~rllm_core.training.scheduler.Controller.record_event`). ``lease_s`` is how old the
    heartbeat of a running job may be before the job counts as gone (default: 60 s, or 20
    ``poll_s`` when longer); a job's heartbeat stands still while its process is busy in a
    step, so make it longer than a step takes.
    """

    def __init__(
        self,
        *,
        launcher: TrainerLauncher,
        shared: SharedRun,
        command: CommandFile,
        steps: int,
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
        poll_s: float = 1.0,
        lease_s: float | None = None,
        record: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.launcher = launcher
        self.shared = shared
        self.command = command
        self.steps = steps
        self.ready_timeout_s = ready_timeout_s
        self.poll_s = poll_s
        self.lease_s = lease_s if lease_s is not None else max(60.0, 20 * poll_s)
        self.record = record
        self.clock = clock
        self.sleep = sleep
        self.job: TrainerJob | None = None
        self.incarnation = 0
        self._seen = 0

    @property
    def store(self) -> ObjectStore:
        return self.shared.store

    @property
    def step(self) -> int:
        """The last step the running job has reported trained (its ready step at first)."""
        return self._seen

    def key(self, name: str, incarnation: int | None = None) -> str:
        return island_key(self.shared, incarnation or self.incarnation, name)

    async def _event(self, kind: str, **fields: Any) -> None:
        if self.record is not None:
            await self.record({"kind": kind, "incarnation": self.incarnation, **fields})

    async def start(self, incarnation: int) -> None:
        """Write the command file, launch the job and wait for its ready marker."""
        self.incarnation = incarnation
        ref = await asyncio.to_thread(latest_cut, self.store, self.shared.prefix)
        command = msgspec.structs.replace(
            self.command,
            incarnation=incarnation,
            resume_cut=ref.name if ref is not None else None,
            launched_at=self.clock(),
        )
        key = self.key("command.json")
        if not await asyncio.to_thread(self.store.put_if_absent, key, msgspec.json.encode(command)):
            raise TrainerJobError(
                f"{key!r} in {self.store!r} exists: incarnation {incarnation} was launched"
                " before, by another scheduler of this run; stop all but one scheduler"
            )
        self.job = await self.launcher.launch(incarnation, key)
        await self._event("launched", job=self.job.job_id, command=key)
        deadline = self.clock() + self.ready_timeout_s
        while True:
            ready = await asyncio.to_thread(_marker, self.store, self.key("ready"))
            if ready is not None:
                self._seen = int(ready["step"])
                return
            await self._check_running("before it was ready")
            if self.clock() >= deadline:
                await self._event("ready-timeout", ready_timeout_s=self.ready_timeout_s)
                job = self.job.job_id
                await self._release(f"not ready within {self.ready_timeout_s} s")
                raise TrainerNotReady(
                    f"trainer incarnation {incarnation} (job {job}) wrote no ready marker"
                    f" ({self.key('ready')}) within [scheduler].ready_timeout_s ="
                    f" {self.ready_timeout_s} s: see the job's log, or raise ready_timeout_s"
                    " when its start-up (building the model, restoring the cut) takes longer"
                )
            await self.sleep(self.poll_s)

    async def train_round(self) -> bool:
        """True once per step the job has trained since the last call; waits while the job
        trains a batch that is in the store, and returns False when the next one is not."""
        while True:
            beat = await asyncio.to_thread(_marker, self.store, self.key("heartbeat"))
            if beat is not None and int(beat["step"]) > self._seen:
                self._seen += 1
                return True
            await self._check_running("before it was asked to stop")
            await self._check_lease(beat)
            if self._seen >= self.steps:
                return False
            if await asyncio.to_thread(self.shared.ticket, self._seen + 1) is None:
                return False
            await self.sleep(self.poll_s)

    async def stop(self, trigger: StopTrigger) -> None:
        """Ask the job to cut with ``trigger`` and exit; release it once it has."""
        await asyncio.to_thread(self.store.put, self.key("stop"), _json({"trigger": trigger}))
        job = self.job
        assert job is not None
        while (status := await job.wait(self.poll_s)) is None:
            beat = await asyncio.to_thread(_marker, self.store, self.key("heartbeat"))
            await self._check_lease(beat)
        stopped = await asyncio.to_thread(_marker, self.store, self.key("stopped"))
        if status != 0 or stopped is None:
            await self._release(f"exited with status {status} when asked to stop")
            raise TrainerJobError(
                f"trainer incarnation {self.incarnation} (job {job.job_id}) exited with status"
                f" {status} when asked to stop ({trigger}) and wrote no {self.key('stopped')}:"
                " its cut may be missing; see the job's log"
            )
        await self._release("stopped")

    async def reattach(self, incarnation: int) -> bool:
        """A scheduler that restarted holds no job handle, so the incarnation it finds running
        is an orphan: the next incarnation's command file ends it (the module docstring)."""
        return False

    async def aclose(self) -> None:
        """Release a job still held (the scheduler ended in between)."""
        if self.job is not None:
            await self._release("the scheduler ended")

    async def _check_running(self, when: str) -> None:
        job = self.job
        assert job is not None
        status = await job.wait(0)
        if status is not None:
            await self._release(f"exited with status {status} {when}")
            raise TrainerJobError(
                f"trainer incarnation {self.incarnation} (job {job.job_id}) exited with status"
                f" {status} {when}: see the job's log"
            )

    async def _check_lease(self, beat: dict[str, Any] | None) -> None:
        if beat is None:
            return
        silent = self.clock() - float(beat["ts"])
        if silent > self.lease_s:
            job = self.job
            assert job is not None
            await self._release(f"heartbeat lost for {silent:.1f} s")
            raise TrainerJobError(
                f"trainer incarnation {self.incarnation} (job {job.job_id}) wrote no heartbeat"
                f" for {silent:.1f} s (more than its lease of {self.lease_s} s): released as"
                " lost; see the job's log"
            )

    async def _release(self, reason: str) -> None:
        job, self.job = self.job, None
        if job is None:
            return
        try:
            await job.release()
        finally:
            await self._event("released", job=job.job_id, reason=reason)


# ---------------------------------------------------------------- the local-process launcher


class LocalProcessJob:
    """A trainer job running as a process on this machine (:class:`LocalProcessLauncher`)."""

    def __init__(self, process: subprocess.Popen[bytes], log: Path | None) -> None:
        self.process = process
        self.log = log
        self.job_id = f"pid {process.pid}" + (f", log {log}" if log is not None else "")

    async def wait(self, timeout_s: float | None = None) -> int | None:
        if timeout_s == 0:
            return self.process.poll()
        try:
            return await asyncio.to_thread(self.process.wait, timeout_s)
        except subprocess.TimeoutExpired:
            return None

    async def stop(self, grace_s: float = 10.0) -> None:
        if self.process.poll() is not None:
            return
        self.process.terminate()
        if await self.wait(grace_s) is None:
            self.process.kill()
            await self.wait()

    async def release(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        await self.wait()


class LocalProcessLauncher:
    """Starts each trainer incarnation as a process on this machine:
    ``rllm-core run PLAN --plain --role trainer --incarnation N`` (with the command file's
    ``--set`` overrides), in the command file's ``cwd``. ``argv(command, key)`` replaces that
    command line; ``logs`` is a folder for each job's output (``trainer-<n>.log``; None: the
    scheduler's own output).
    """

    def __init__(
        self,
        store: ObjectStore,
        *,
        logs: str | os.PathLike[str] | None = None,
        argv: Callable[[CommandFile, str], Sequence[str]] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.store = store
        self.logs = Path(logs) if logs is not None else None
        self.argv = argv or trainer_argv
        self.env = env

    async def launch(self, incarnation: int, command_file_uri: str) -> LocalProcessJob:
        command = await asyncio.to_thread(read_command, self.store, command_file_uri)
        if command.incarnation != incarnation:
            raise TrainerJobError(
                f"{command_file_uri!r} is the command of incarnation {command.incarnation},"
                f" not {incarnation}"
            )
        argv = list(self.argv(command, command_file_uri))
        log: Path | None = None
        out: Any = None
        if self.logs is not None:
            self.logs.mkdir(parents=True, exist_ok=True)
            log = self.logs / f"trainer-{incarnation}.log"
            out = open(log, "ab")  # noqa: SIM115 - the child holds it; closed below
        try:
            process = subprocess.Popen(
                argv,
                cwd=command.cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT if out is not None else None,
                env=self.env,
            )
        except OSError as exc:
            raise TrainerJobError(
                f"could not start trainer incarnation {incarnation}: {shlex.join(argv)}: {exc}"
            ) from exc
        finally:
            if out is not None:
                out.close()
        return LocalProcessJob(process, log)


def build_launcher(
    resolved: ResolvedPlan, store: ObjectStore, *, logs: str | os.PathLike[str] | None = None
) -> TrainerLauncher:
    """The trainer launcher ``resolved``'s ``[scheduler].launcher`` selects: a
    :class:`LocalProcessLauncher` for ``local-process`` (its jobs' output in ``logs``), or the
    plugin's launcher resolved at :data:`LAUNCHER_WHERE`, built with ``store`` (the run's
    object store) as its run key ``store`` when its spec lists it. Raises
    :class:`~rllm_core.run.components.BuildError` naming the section and the plugin when the
    factory fails or builds no :class:`~rllm_core.ports.TrainerLauncher`."""
    from rllm_core.run.components import BuildError

    launcher = resolved.plan.scheduler.launcher
    if launcher == "local-process":
        return LocalProcessLauncher(store, logs=logs)
    component = resolved.get(LAUNCHER_WHERE)
    if component is None:
        raise BuildError(
            f"{resolved.path}: [scheduler].launcher = {launcher!r} launches no trainer job"
            ' (set launcher = "local-process" or a plugin\'s launcher)'
        )
    config = component.config
    if "store" in component.spec.trait("run_keys"):
        config = config.model_copy(update={"store": store})
    label = f"{LAUNCHER_WHERE}: trainer_launcher:{component.name} ({component.provider})"
    try:
        built = component.spec.build(config)
    except Exception as exc:
        raise BuildError(f"{label}: building it failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(built, TrainerLauncher):
        raise BuildError(
            f"{label}: its factory built a {type(built).__name__}, which has no"
            " launch(incarnation, command_file_uri): fix the plugin's factory"
        )
    return built


async def close_launcher(launcher: TrainerLauncher) -> None:
    """Close ``launcher`` when it has a ``close`` method (sync or async)."""
    close = getattr(launcher, "close", None)
    if callable(close):
        result = close()
        if asyncio.iscoroutine(result):
            await result


def trainer_argv(command: CommandFile, key: str) -> list[str]:
    """``rllm-core run`` of ``command``'s plan as its role and incarnation."""
    argv = [sys.executable, "-m", "rllm_core.cli", "run", command.plan_path, "--plain"]
    argv += ["--role", command.role, "--incarnation", str(command.incarnation)]
    for item in command.overrides:
        argv += ["--set", item]
    return argv


# ---------------------------------------------------------------- the job's side


class IslandIncarnation:
    """One trainer incarnation as a job (the module docstring): restores the newest cut
    through ``role`` (a :class:`~rllm_core.training.roles.TrainerRole`), writes its ready
    marker, trains every batch it finds and writes a heartbeat after each, until the
    scheduler's stop request (a cut with its trigger, then ``stopped``), a signal
    (:meth:`request_stop`: the same, with the signal's trigger) or a newer incarnation's
    command file (nothing more). ``ended`` is then the trigger it cut with, or
    ``"orphaned"``."""

    def __init__(
        self, role: TrainerRole, incarnation: int, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.role = role
        self.shared = role.shared
        self.incarnation = incarnation
        self.poll_s = role.plan.scheduler.poll_s
        self.clock = clock
        self.step = 0
        self.ended: str | None = None
        self._requested: StopTrigger | None = None

    def key(self, name: str, incarnation: int | None = None) -> str:
        return island_key(self.shared, incarnation or self.incarnation, name)

    def request_stop(self, trigger: StopTrigger) -> None:
        """Cut with ``trigger`` after the round in flight and end, as a stop request would."""
        self._requested = self._requested or trigger

    def fenced(self) -> bool:
        return self.shared.store.exists(self.key("command.json", self.incarnation + 1))

    async def _put(self, name: str, **fields: Any) -> None:
        value = {"ts": self.clock(), "step": self.step, **fields}
        await asyncio.to_thread(self.shared.store.put, self.key(name), _json(value))

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            await self._put("heartbeat")

    async def run(self) -> str:
        self.ended = await self._run()
        return self.ended

    async def _run(self) -> str:
        store = self.shared.store
        await asyncio.to_thread(read_command, store, self.key("command.json"))
        if await asyncio.to_thread(self.fenced):
            return "orphaned"
        await self.role.start(self.incarnation)
        assert self.role.state is not None
        self.step = self.role.state.step
        await self._put("heartbeat")
        await self._put("ready")
        beat = asyncio.ensure_future(self._beat())
        try:
            while True:
                stop = await asyncio.to_thread(_marker, store, self.key("stop"))
                trigger = stop["trigger"] if stop is not None else self._requested
                if trigger is not None:
                    await self.role.stop(trigger)
                    await self._put("stopped", trigger=trigger)
                    return trigger
                if await asyncio.to_thread(self.fenced):
                    return "orphaned"
                if await self.role.train_round():
                    self.step = self.role.state.step
                    await self._put("heartbeat")
                else:
                    await asyncio.sleep(self.poll_s)
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
