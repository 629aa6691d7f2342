"""The SFT run: ``epochs`` passes over the training examples, one optimizer step per batch.

Step ``k`` (from 0) trains batch ``k % S`` of epoch ``k // S`` (``S`` steps per epoch, see
:mod:`~rllm_core.training.sft.batches`), so the step counter alone says where a resumed run
goes on. Each step writes one ``metrics.jsonl`` line: ``step``, ``epoch`` (from 1),
``train/nll``, ``train/tokens`` (trained tokens), ``train/sequences``, the optimizer's
metrics (``train/grad_norm``, ``train/learning_rate`` ...), ``tokens/trained`` (every token of
the step's datums), ``tokens/trained_per_s``, ``time/step_s``, ``weight_version`` and memory;
with an eval split, ``eval/nll``, ``eval/ppl`` and ``eval/tokens`` every ``eval_every`` steps
and at the last step. Plots (``loss.png``: train and eval NLL), loggers, lifecycle hooks,
checkpoints (``[run].save_every`` and the end), ``summary.json`` and signals behave as in
``rllm-core run`` (:mod:`rllm_core.training.loop`). At the end, with ``[sft].export``, the
model is written there as a standalone folder (``export_weights(path, merge=True)``).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rllm_core.plan import ResolvedPlan
from rllm_core.plugins.manager import PluginManager, get_plugin_manager
from rllm_core.ports import LogprobScorer, WeightExporter
from rllm_core.training.checkpoints import latest_checkpoint, load_checkpoint, save_checkpoint
from rllm_core.training.folder import RunFolder, write_json
from rllm_core.training.loop import ResumeError, RunResult
from rllm_core.training.metrics import memory_metrics, sft_summary
from rllm_core.training.observers import RunObservers
from rllm_core.training.sft.batches import batch_datums, epoch_batches, steps_per_epoch
from rllm_core.training.sft.data import TokenExample
from rllm_core.training.sft.plots import write_sft_plots
from rllm_core.training.sft.step import eval_nll, supervised_forward_backward
from rllm_core.training.signals import EXIT_CODES
from rllm_core.training.state import DataOrder, LoopState, capture_rngs, restore_rngs, seed_rngs
from rllm_core.types import RunInfo, RunStatus

__all__ = ["SftLoop"]


class SftLoop:
    """One SFT run of a resolved plan on a built ``trainer``, writing into ``folder``."""

    def __init__(
        self,
        *,
        resolved: ResolvedPlan,
        trainer: Any,
        loggers: Sequence[tuple[str, Any]],
        folder: RunFolder,
        display: Any,
        train: Sequence[TokenExample],
        held_out: Sequence[TokenExample],
        resume: bool = False,
        plugins: PluginManager | None = None,
    ) -> None:
        self.resolved = resolved
        self.plan = resolved.plan
        self.sft = resolved.plan.sft
        self.trainer = trainer
        self.folder = folder
        self.display = display
        self.train = list(train)
        self.held_out = list(held_out)
        self.resume = resume
        self.per_epoch = steps_per_epoch(len(self.train), self.sft.batch_size)
        self.total_steps = self.per_epoch * self.sft.epochs
        self._batches: dict[int, list[list[int]]] = {}
        self._received: int | None = None
        self.observers = RunObservers(
            loggers=loggers,
            plugins=plugins if plugins is not None else get_plugin_manager(),
            warn=display.warn,
        )

    def _initial_state(self) -> LoopState:
        if self.held_out and not isinstance(self.trainer, LogprobScorer):
            key = "eval_data" if self.sft.eval_data is not None else "eval_fraction"
            raise ResumeError(
                f"[sft].{key}: the trainer backend computes no logprobs (no LogprobScorer), so"
                " held-out examples cannot be scored; remove the key"
            )
        seed_rngs(self.plan.run.seed)
        fresh = LoopState(step=0, data=DataOrder(size=len(self.train), seed=self.plan.run.seed))
        if not self.resume:
            return fresh
        checkpoint = latest_checkpoint(self.folder.checkpoints)
        if checkpoint is None:
            raise ResumeError(
                f"{self.folder.path} has no complete checkpoint to resume from; start a new run"
                " (without --resume)"
            )
        state = load_checkpoint(checkpoint, self.trainer)
        if state.data.size != len(self.train):
            raise ResumeError(
                f"the training data holds {len(self.train)} examples but the run was started"
                f" with {state.data.size}; resume with the same [sft] data"
            )
        restore_rngs(state.rngs)
        self.folder.truncate_after(state.step)
        self.display.info(f"resumed from {checkpoint} (step {state.step})")
        self.observers.event("resume", {"step": state.step, "checkpoint": str(checkpoint)})
        return state

    def _batch(self, step: int) -> list[TokenExample]:
        """The examples of step ``step`` (from 0)."""
        epoch, index = divmod(step, self.per_epoch)
        if epoch not in self._batches:
            self._batches = {
                epoch: epoch_batches(
                    len(self.train), self.sft.batch_size, self.plan.run.seed, epoch
                )
            }
        return [self.train[i] for i in self._batches[epoch][index]]

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._received is None:
            self._received = signum
            self.display.warn("stopping after the current step")

    def run(self) -> RunResult:
        """Train the steps left; see the module docstring."""
        try:
            state = self._initial_state()
        except BaseException:
            self.observers.close_loggers()
            raise
        started = time.monotonic()
        self.observers.run_start(
            RunInfo(
                run_id=self.folder.path.name,
                name=self.plan.run.name,
                output_dir=str(self.folder.path),
                plan=self.plan.model_dump(mode="json", exclude_none=True),
                started_at=time.time(),
            )
        )
        saved = state.step if self.resume else -1
        previous = {s: signal.signal(s, self._on_signal) for s in EXIT_CODES}
        try:
            try:
                while state.step < self.total_steps and self._received is None:
                    self._step(state)
                    every = self.plan.run.save_every
                    if every and state.step % every == 0:
                        self._checkpoint(state)
                        saved = state.step
            finally:
                for signum, handler in previous.items():
                    signal.signal(signum, handler)
            if state.step > 0 and saved != state.step:
                self.display.info(f"checkpoint: {self._checkpoint(state)}")
            status = "interrupted" if self._received is not None else "finished"
            if status == "finished" and self.sft.export is not None:
                self._export(self.sft.export)
            summary = self._summary(status, state, started)
            write_json(self.folder.summary, summary)
            self.observers.event("summary", summary)
        except BaseException as exc:
            self._crashed(exc, state, started)
            raise
        self.display.finish(summary)
        self.observers.run_end(
            RunStatus.INTERRUPTED if status == "interrupted" else RunStatus.COMPLETED
        )
        code = EXIT_CODES[signal.Signals(self._received)] if self._received is not None else 0
        return RunResult(status=status, exit_code=code, step=state.step, summary=summary)

    def _step(self, state: LoopState) -> None:
        step = state.step + 1
        self.observers.step_start(step)
        began = time.monotonic()
        datums = batch_datums(
            self._batch(state.step), packing=self.sft.packing, max_length=self.sft.max_length
        )
        train = supervised_forward_backward(self.trainer, datums)
        train |= {k: float(v) for k, v in self.trainer.optim_step().items()}
        train_s = time.monotonic() - began
        tokens = float(sum(len(d.token_ids) for d in datums))
        line: dict[str, Any] = {
            "step": step,
            "epoch": float(state.step // self.per_epoch + 1),
            "tokens/trained": tokens,
            "tokens/trained_per_s": tokens / train_s if train_s > 0 else 0.0,
            "time/train_s": train_s,
            "weight_version": float(self.trainer.weight_version),
        }
        line |= {f"train/{k}": v for k, v in train.items()}
        every = self.sft.eval_every
        if self.held_out and (step == self.total_steps or (every and step % every == 0)):
            line |= {f"eval/{k}": v for k, v in self._evaluate().items()}
        line["time/step_s"] = time.monotonic() - began
        line |= memory_metrics()
        self.folder.append(self.folder.metrics, line)
        self.observers.step_end(step, line)
        state.step = step
        state.rngs = capture_rngs()
        problem = write_sft_plots(RunFolder.read_jsonl(self.folder.metrics), self.folder.path)
        if problem is not None and step == 1:
            self.display.warn(problem)
        self.display.step_finished(line)

    def _evaluate(self) -> dict[str, float]:
        datums = batch_datums(self.held_out, packing=False, max_length=None)
        return dict(eval_nll(self.trainer, datums))

    def _checkpoint(self, state: LoopState) -> Path:
        path = save_checkpoint(self.folder.checkpoints, self.trainer, state)
        self.observers.event("checkpoint", {"step": state.step, "path": str(path)})
        return path

    def _export(self, path: str) -> None:
        if not isinstance(self.trainer, WeightExporter):
            raise RuntimeError(
                f"[sft].export = {path!r}: the trainer backend cannot export its weights (no"
                " WeightExporter); remove the key"
            )
        exported = self.trainer.export_weights(path, merge=True)
        self.display.info(f"exported the trained model to {exported.path}")
        self.observers.event("export", {"path": str(exported.path)})

    def _summary(self, status: str, state: LoopState, started: float) -> dict[str, Any]:
        rows = RunFolder.read_jsonl(self.folder.metrics)
        out = sft_summary(rows) | {
            "kind": "sft",
            "status": status,
            "run_dir": str(self.folder.path),
            "wall_s": time.monotonic() - started,
            "last_step": state.step,
            "total_steps": self.total_steps,
            "examples": len(self.train),
            "eval_examples": len(self.held_out),
            "weight_version": getattr(self.trainer, "weight_version", None),
        }
        if self.sft.export is not None and status == "finished":
            out["export"] = self.sft.export
        return out

    def _crashed(self, exc: BaseException, state: LoopState, started: float) -> None:
        error = {"type": type(exc).__name__, "message": str(exc)}
        reason = f"{error['type']}: {error['message']}" if error["message"] else error["type"]
        self.observers.event("failure", {"step": state.step + 1, "reason": reason, "error": error})
        try:
            summary = self._summary("failed", state, started) | {"reason": reason, "error": error}
            write_json(self.folder.summary, summary)
        except Exception as problem:
            self.display.warn(f"could not write {self.folder.summary}: {problem}")
        self.observers.run_end(RunStatus.FAILED, exc)
