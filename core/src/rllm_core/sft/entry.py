"""The entry point of ``rllm-core sft`` once its plan is resolved, its data read and its run
folder placed: build the trainer and the loggers, record the numerics and run the SFT loop
to the end."""

from __future__ import annotations

from typing import Any

from rllm_core.plan import ResolvedPlan
from rllm_core.run.folder import RunFolder
from rllm_core.run.lifecycle import RunResult
from rllm_core.run.runlog import RunLog
from rllm_core.run.start import build_one, record_numerics, run_loop
from rllm_core.sft.loop import SftLoop
from rllm_core.sft.prepare import SftData

__all__ = ["fine_tune"]


def fine_tune(
    resolved: ResolvedPlan,
    folder: RunFolder,
    data: SftData,
    *,
    display: Any,
    resume: bool = False,
) -> RunResult:
    """Fine-tune ``resolved``'s trainer on ``data`` into ``folder``; raises
    :class:`~rllm_core.run.start.RunRefused`. The components built here are closed at the
    end, however it ends."""
    run_log = RunLog(folder.log)
    built: list[Any] = []
    try:
        trainer = build_one(resolved, "[trainer]", display)
        built.append(trainer)
        loggers = []
        for component in resolved:
            if component.where.startswith("[loggers"):
                logger = build_one(resolved, component.where, display)
                built.append(logger)
                loggers.append((f"{component.where} {component.name}", logger))
        changed = record_numerics(folder, resolved, {"[trainer]": trainer}, resume=resume)
        if changed is not None:
            display.warn(changed)
        loop = SftLoop(
            resolved=resolved,
            trainer=trainer,
            loggers=loggers,
            folder=folder,
            display=display,
            train=data.train,
            held_out=data.held_out,
            resume=resume,
        )
        return run_loop(loop.run, folder, what="SFT run")
    finally:
        for instance in reversed(built):
            close = getattr(instance, "close", None)
            if callable(close):
                close()
        run_log.close()
