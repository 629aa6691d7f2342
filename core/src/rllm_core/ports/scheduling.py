"""Contracts for the trainer scheduler: a trainer's lifecycle, and converting pool nodes."""

from __future__ import annotations

from typing import Literal, Protocol, runtime_checkable

__all__ = ["NodeConverter", "StopTrigger", "TrainerLifecycle", "TrainerReattach"]

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
