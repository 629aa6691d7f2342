"""Contracts for the trainer scheduler: a trainer's lifecycle, and converting pool nodes."""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

__all__ = [
    "NodeConverter",
    "StopTrigger",
    "TrainerJob",
    "TrainerLauncher",
    "TrainerLifecycle",
    "TrainerReattach",
]

StopTrigger = Literal["scheduled", "preempt", "manual", "final"]
"""Why a trainer incarnation stops; its last cut records it.

``scheduled``: the scheduler found nothing to train for long enough. ``preempt``: the machine
is being taken away. ``manual``: an operator asked. ``final``: the data has ended.
"""


@runtime_checkable
class TrainerLifecycle(Protocol):
    """Starts, drives and stops incarnations of one trainer; the scheduler's controller calls it.

    An incarnation is one life of the trainer between a start and a stop, numbered from 1 by
    the controller. The controller calls the methods one at a time, never concurrently.

    Contract:

    - ``start(incarnation)`` restores the newest checkpoint cut (or the initial state when
      there is none) and returns once the trainer is ready to train. It raises when the
      incarnation cannot start; the controller counts that as a failed incarnation. Starting
      incarnation ``n`` fences every older one: from then on only ``n`` may commit samples or
      write cuts.
    - ``train_round()`` trains one round (one step's batch of groups, within the age bound) from
      the sample buffer, writes its cut as the run's ``save_every`` says, and returns True;
      it returns False at once, training nothing, when less than a batch is pending. It raises
      when the trainer fails; the incarnation is then over and ``stop`` is not called.
    - ``stop(trigger)`` is called at a round boundary (never during ``train_round``): it writes
      a cut recording ``trigger`` and releases the trainer's machine. It raises when it could
      not write the cut; the incarnation is then over, as a failed one. Once it returns, a
      later ``start`` restores that cut, so nothing trained is lost and nothing is trained
      twice.

    Example::

        await lifecycle.start(incarnation=3)
        while await lifecycle.train_round():
            pass
        await lifecycle.stop("scheduled")
    """

    async def start(self, incarnation: int) -> None: ...

    async def train_round(self) -> bool: ...

    async def stop(self, trigger: StopTrigger) -> None: ...


@runtime_checkable
class TrainerReattach(Protocol):
    """What a :class:`TrainerLifecycle` may also offer: finding a running incarnation again.

    A controller that restarts while its journal says incarnation ``n`` was running calls
    ``reattach(n)``. It returns True when that incarnation still runs (a trainer on its own
    machine outlives its controller) and is ready to train: the controller then carries on with
    it, idle timer included. It returns False when it is gone; the controller records it as
    lost (counted as a failure when it had trained no round) and starts a new one when S1 says
    so, which trains again what the lost one trained after its last cut. A lifecycle without
    ``reattach`` is taken to be gone (a trainer in the controller's own process dies with it).
    """

    async def reattach(self, incarnation: int) -> bool: ...


@runtime_checkable
class NodeConverter(Protocol):
    """Turns one pool node from a sampler into a trainer and back.

    :class:`~rllm_core.training.nodes.NodePool` makes the calls, always in this order; each
    returns once its part is done.

    Sampler to trainer:

    1. ``stop_admitting(node)``: the node's sampler takes no new trajectory; those in flight go
       on.
    2. ``collect_finished(node, grace_s)``: waits up to ``grace_s`` seconds for trajectories in
       flight to finish, and hands every finished one to the sample buffer as usual (they are
       trained like any other). Returns how many it kept.
    3. ``cut_unfinished(node)``: ends the trajectories still in flight. They never reach the
       sample buffer and are never trained; their tasks go back to be rolled out again.
       Returns how many it cut.
    4. ``release_sampler(node)``: stops the node's sampler and frees its accelerator memory.
    5. ``start_trainer(node, incarnation)``: starts trainer incarnation ``incarnation`` on the
       node, as :meth:`TrainerLifecycle.start` does (restore the newest cut, return when ready).

    Trainer to sampler:

    1. ``stop_trainer(node, trigger)``: as :meth:`TrainerLifecycle.stop`: a cut recording
       ``trigger``, then the trainer's memory is freed.
    2. ``load_release(node)``: loads the newest published policy release into the node's
       sampler and returns its weight version.
    3. ``start_sampler(node)``: the node admits trajectories again.

    ``train_round(node)`` trains one round on the node while it is the trainer, as
    :meth:`TrainerLifecycle.train_round` does.

    Example::

        await converter.stop_admitting("gpu-2")
        kept = await converter.collect_finished("gpu-2", grace_s=30.0)
        cut = await converter.cut_unfinished("gpu-2")
        await converter.release_sampler("gpu-2")
        await converter.start_trainer("gpu-2", incarnation=4)
    """

    async def stop_admitting(self, node: str) -> None: ...

    async def collect_finished(self, node: str, grace_s: float) -> int: ...

    async def cut_unfinished(self, node: str) -> int: ...

    async def release_sampler(self, node: str) -> None: ...

    async def start_trainer(self, node: str, incarnation: int) -> None: ...

    async def train_round(self, node: str) -> bool: ...

    async def stop_trainer(self, node: str, trigger: StopTrigger) -> None: ...

    async def load_release(self, node: str) -> int: ...

    async def start_sampler(self, node: str) -> None: ...


@runtime_checkable
class TrainerJob(Protocol):
    """One trainer incarnation running as a job of its own, as :class:`TrainerLauncher` started
    it. The scheduler learns that the job is ready, and asks it to stop, through the object
    store (:mod:`rllm_core.training.island`); the job handle only says whether the job still
    runs and ends it.

    Contract:

    - ``job_id`` names the job where its launcher runs it (a process id, a sandbox id), for
      the journal and the operator.
    - ``wait(timeout_s)`` returns the job's exit status once it has ended, or None when it
      still runs after ``timeout_s`` seconds (0: look once, without waiting; None: wait until
      it ends). An exit status of 0 means the job ended as it was asked to.
    - ``stop(grace_s)`` ends the job: a polite request first (SIGTERM for a process), then,
      after ``grace_s`` seconds, a forced one. It returns once the job has ended, and does
      nothing to a job that already has.
    - ``release()`` frees everything the launcher holds for the job (its machine, container,
      log handles); it stops a job that still runs without grace. Safe to call more than once.
      The scheduler releases every job it launched: a stopped one, one that never became
      ready, and an orphan (one whose heartbeat was lost).
    """

    job_id: str

    async def wait(self, timeout_s: float | None = None) -> int | None: ...

    async def stop(self, grace_s: float = 10.0) -> None: ...

    async def release(self) -> None: ...


@runtime_checkable
class TrainerLauncher(Protocol):
    """Starts trainer incarnations as jobs of their own: the trainer on its own island.

    ``launch(incarnation, command_file_uri)`` starts one job that runs the trainer incarnation
    described by the command file at ``command_file_uri`` and returns its :class:`TrainerJob`
    as soon as the job is submitted (not once it is ready). ``command_file_uri`` is the key of
    the command file in the run's object store; the command file (a JSON object written by the
    scheduler before the launch, :class:`rllm_core.training.island.CommandFile`) says what to
    run: the plan, the role (``trainer``), the incarnation and the cut it resumes from. The job
    reads it, restores the cut, writes its ready marker into the object store and trains until
    the scheduler writes it a stop request. ``launch`` raises when the job could not be
    submitted; the scheduler counts that incarnation as failed.

    The scheduler launches one incarnation at a time, in increasing order, and releases each
    job it launched. A job that comes up after a newer incarnation was launched finds the newer
    command file and exits without training (the incarnation fence of
    :mod:`rllm_core.run.cuts` would refuse its cuts anyway).

    Example::

        job = await launcher.launch(2, "runs/demo/island/000002/command.json")
        ...  # the ready marker appears in the object store
        await job.wait()  # after the stop request
        await job.release()
    """

    async def launch(self, incarnation: int, command_file_uri: str) -> TrainerJob: ...
