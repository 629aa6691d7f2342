"""The one lifecycle every run goes through: the RL loop, a split run's sampler and trainer,
and SFT (``docs/design/run-lifecycle.md``).

A loop owns its steps; :class:`Lifecycle` owns what is around them, the same for each:

- **start**: once the state is seeded or restored (:func:`fresh_or_resumed` does both for a
  run folder's ``checkpoints/``), :meth:`Lifecycle.begin` fires ``rllm_run_start`` and starts
  the wall clock;
- **stop signals**: :meth:`Lifecycle.stop_signals` routes the first SIGINT / SIGTERM to the
  loop's ``on_stop`` (it cancels or finishes the step in flight); a second one calls the loop's
  ``on_force`` and ends the process within :data:`FORCE_EXIT_S`, writing ``summary.json`` of
  what finished first;
- **checkpoints**: :meth:`Lifecycle.after_step` saves every ``[run].save_every`` steps, and
  :meth:`Lifecycle.final_checkpoint` saves the last finished step unless it is saved already
  or an interrupted step had moved the weights past it;
- **the end**: :meth:`Lifecycle.finish` writes ``summary.json`` (the loop's summary, then
  ``status``, ``run_dir``, ``wall_s``), tells the loggers and fires ``rllm_run_end`` with
  ``completed``, ``interrupted`` or ``failed``; :meth:`Lifecycle.crashed`, after an exception
  that ends the run, writes the summary with ``status = "failed"``, the ``error`` and the
  ``reason``, and fires ``rllm_run_end(FAILED)`` (the caller re-raises).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rllm_core.ports import WeightExporter
from rllm_core.run.checkpoints import RunCheckpoints
from rllm_core.run.folder import RunFolder, write_json
from rllm_core.run.observers import RunObservers
from rllm_core.run.signals import StopSignals
from rllm_core.run.state import DataOrder, LoopState, restore_rngs, seed_rngs
from rllm_core.types import CutTrigger, RunInfo, RunStatus

__all__ = [
    "FORCE_EXIT_S",
    "Lifecycle",
    "ResumeError",
    "RunResult",
    "fresh_or_resumed",
]

FORCE_EXIT_S = 5.0
"""Seconds between a second SIGINT / SIGTERM and the end of the process, cleanup or not."""

_RUN_STATUS = {"finished": RunStatus.COMPLETED, "interrupted": RunStatus.INTERRUPTED}


class ResumeError(Exception):
    """The run cannot start or resume as asked; the message says why and what to do."""


@dataclass
class RunResult:
    """How a run ended: ``status`` is ``finished``, ``interrupted`` or ``failed`` (then
    ``reason`` is the message to show, also in ``summary["reason"]``)."""

    status: str
    exit_code: int
    step: int
    summary: dict[str, Any]
    reason: str | None = None


def fresh_or_resumed(
    folder: RunFolder,
    trainer: Any,
    *,
    size: int,
    seed: int,
    resume: bool,
    what: str,
    again: str,
    display: Any,
    observers: RunObservers,
) -> LoopState:
    """The state a run over ``size`` items starts from: step 0 with the data order of ``seed``,
    or with ``resume`` the newest complete checkpoint of ``folder`` loaded into ``trainer``,
    the random generators restored and the folder's records after it dropped. ``what`` says
    what the data holds and ``again`` what to do, for the error when the checkpoint was taken
    over another size."""
    seed_rngs(seed)
    if not resume:
        return LoopState(step=0, data=DataOrder(size=size, seed=seed))
    checkpoints = RunCheckpoints(folder.checkpoints)
    latest = checkpoints.latest()
    if latest is None:
        raise ResumeError(
            f"{folder.path} has no complete checkpoint to resume from; start a new run"
            " (without --resume)"
        )
    checkpoint = latest.path
    state = checkpoints.load(latest, trainer)
    if state.data.size != size:
        raise ResumeError(f"{what} but the run was started with {state.data.size}; {again}")
    restore_rngs(state.rngs)
    folder.truncate_after(state.step)
    display.info(f"resumed from {checkpoint} (step {state.step})")
    observers.event("resume", {"step": state.step, "checkpoint": str(checkpoint)})
    return state


class Lifecycle:
    """What is around a run's steps; see the module docstring.

    ``summarize(status, state)`` is the loop's own part of ``summary.json``; ``save(state,
    trigger)`` writes a checkpoint (a cut, :mod:`rllm_core.run.checkpoints`) and returns where
    (None for a loop that checkpoints by itself).
    """

    def __init__(
        self,
        *,
        plan: Any,
        folder: RunFolder,
        display: Any,
        observers: RunObservers,
        run_id: str,
        summarize: Callable[[str, LoopState], dict[str, Any]],
        save: Callable[[LoopState, CutTrigger], Path | str] | None = None,
    ) -> None:
        self.plan = plan
        self.folder = folder
        self.display = display
        self.observers = observers
        self.run_id = run_id
        self._summarize = summarize
        self._save = save
        self.state = LoopState(step=0, data=DataOrder(size=1, seed=0))
        self.started = time.monotonic()
        self.signals: StopSignals | None = None
        self._saved_step = -1
        self._force_timer: threading.Timer | None = None

    # ------------------------------------------------------------------ start

    def begin(self, state: LoopState, *, resumed: bool = False) -> None:
        """The run starts from ``state`` (a resumed one is saved as it is): the wall clock
        starts and ``rllm_run_start`` fires."""
        self.state = state
        self.started = time.monotonic()
        self._saved_step = state.step if resumed else -1
        self.observers.run_start(
            RunInfo(
                run_id=self.run_id,
                name=self.plan.run.name,
                output_dir=str(self.folder.path),
                plan=self.plan.model_dump(mode="json", exclude_none=True),
                started_at=time.time(),
            )
        )

    # ------------------------------------------------------------------ signals

    @contextlib.contextmanager
    def stop_signals(
        self, on_stop: Callable[[], None], on_force: Callable[[], None] = lambda: None
    ) -> Iterator[StopSignals]:
        """SIGINT and SIGTERM while the block runs (on the running event loop): the first
        calls ``on_stop``, a second ``on_force`` and starts the watchdog that ends the
        process within :data:`FORCE_EXIT_S`."""

        def force() -> None:
            self.display.warn(f"second signal: exiting within {FORCE_EXIT_S:.0f} s")
            on_force()
            if self._force_timer is None:
                self._force_timer = threading.Timer(FORCE_EXIT_S, self._force_exit)
                self._force_timer.daemon = True
                self._force_timer.start()

        with StopSignals(on_stop, force) as signals:
            self.signals = signals
            yield signals

    @property
    def stop_code(self) -> int | None:
        """The exit code of the signal that stopped the run (130, 143), None without one."""
        if self.signals is None or self.signals.received is None:
            return None
        return self.signals.exit_code

    def _force_exit(self) -> None:
        """The watchdog a second signal starts: the summary of what finished, then exit."""
        code = self.stop_code or 130
        with contextlib.suppress(Exception):
            summary = self.summary("interrupted")
            summary["reason"] = f"exited {FORCE_EXIT_S:.0f} s after a second signal"
            write_json(self.folder.summary, summary)
        print(
            f"rllm-core: exited {FORCE_EXIT_S:.0f} s after a second signal; the cleanup had"
            " not finished",
            file=sys.stderr,
            flush=True,
        )
        os._exit(code)

    # ------------------------------------------------------------------ checkpoints

    def after_step(self, state: LoopState) -> None:
        """Checkpoint ``state`` when its step is a multiple of ``[run].save_every``."""
        every = self.plan.run.save_every
        if every and state.step % every == 0:
            self.checkpoint(state, "scheduled")

    def checkpoint(self, state: LoopState, trigger: CutTrigger) -> Path | str:
        """Save ``state`` with the loop's ``save``; ``trigger`` says why (``scheduled``,
        ``final``, ``manual`` after SIGINT, ``preempt`` after SIGTERM)."""
        assert self._save is not None, "this loop checkpoints by itself"
        where = self._save(state, trigger)
        self._saved_step = state.step
        self.observers.event("checkpoint", {"step": state.step, "path": str(where)})
        return where

    def final_checkpoint(self, state: LoopState, *, torn_step: int | None = None) -> None:
        """The checkpoint of the last finished step, unless it is saved already or step
        ``torn_step`` was interrupted after it had moved the weights past it."""
        if state.step == 0 or self._saved_step == state.step:
            return
        if torn_step is not None:
            self.display.warn(
                f"step {torn_step} was interrupted after it had changed the weights: no"
                f" checkpoint of step {state.step} written now; resume starts from the last"
                " saved one"
            )
            return
        trigger: CutTrigger = {130: "manual", 143: "preempt"}.get(self.stop_code or 0, "final")
        self.display.info(f"checkpoint: {self.checkpoint(state, trigger)}")

    def export(self, trainer: object, path: str, where: str) -> str:
        """Write ``trainer``'s policy as a standalone model folder at ``path`` (LoRA merged),
        as the plan's ``where`` (``[run].export``, ``[sft].export``) asks; returns the folder
        written. Raises ``RuntimeError`` naming ``where`` for a backend that cannot export."""
        if not isinstance(trainer, WeightExporter):
            raise RuntimeError(
                f"{where} = {path!r}: the trainer backend cannot export its weights (no"
                " WeightExporter); remove the key"
            )
        exported = trainer.export_weights(path, merge=True)
        self.display.info(f"exported the trained model to {exported.path}")
        self.observers.event("export", {"path": str(exported.path)})
        return str(exported.path)

    # ------------------------------------------------------------------ the end

    def summary(self, status: str) -> dict[str, Any]:
        return self._summarize(status, self.state) | {
            "status": status,
            "run_dir": str(self.folder.path),
            "wall_s": time.monotonic() - self.started,
        }

    def finish(
        self,
        status: str,
        exit_code: int,
        summary: dict[str, Any],
        failure: Any = None,
        *,
        show: bool = True,
    ) -> RunResult:
        """Write ``summary`` as ``summary.json``, show it (unless ``show`` is false: a loop
        that says how it ended in its own words), tell the loggers, fire ``rllm_run_end``;
        the run's result."""
        write_json(self.folder.summary, summary)
        self.observers.event("summary", summary)
        if show:
            self.display.finish(summary)
        self.observers.run_end(_RUN_STATUS.get(status, RunStatus.FAILED), failure)
        return RunResult(
            status=status,
            exit_code=exit_code,
            step=self.state.step,
            summary=summary,
            reason=str(failure) if failure is not None else None,
        )

    def crashed(self, exc: BaseException) -> None:
        """After an exception that ends the run: ``summary.json`` (status ``failed``, the
        error, the last finished step), a ``failure`` and a ``summary`` event, the loggers
        closed and ``rllm_run_end(FAILED)``; the caller re-raises."""
        error = {"type": type(exc).__name__, "message": str(exc)}
        reason = f"{error['type']}: {error['message']}" if error["message"] else error["type"]
        step = self.state.step + 1
        self.observers.event("failure", {"step": step, "reason": reason, "error": error})
        try:
            summary = self.summary("failed") | {"reason": reason, "error": error}
            write_json(self.folder.summary, summary)
        except Exception as problem:
            self.display.warn(f"could not write {self.folder.summary}: {problem}")
        else:
            self.observers.event("summary", summary)
        self.observers.run_end(RunStatus.FAILED, exc)

    def close(self) -> None:
        """Stop the watchdog of a second signal once the run has ended cleanly."""
        if self._force_timer is not None:
            self._force_timer.cancel()
