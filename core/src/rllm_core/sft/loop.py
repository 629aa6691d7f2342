"""The SFT run: ``epochs`` passes over the training examples, one optimizer step per batch.

Step ``k`` (from 0) trains batch ``k % S`` of epoch ``k // S`` (``S`` steps per epoch, see
:mod:`~rllm_core.sft.batches`), so the step counter alone says where a resumed run
goes on. Each step writes one ``metrics.jsonl`` line: ``step``, ``epoch`` (from 1),
``train/nll``, ``train/tokens`` (trained tokens), ``train/sequences``, the optimizer's
metrics (``train/grad_norm``, ``train/learning_rate`` ...), ``tokens/trained`` (every token of
the step's datums), ``tokens/trained_per_s``, ``time/step_s``, ``weight_version`` and memory;
with an eval split, ``eval/nll``, ``eval/ppl`` and ``eval/tokens`` every ``eval_every`` steps
and at the last step. Plots (``loss.png``: train and eval NLL), loggers, lifecycle hooks,
checkpoints (``[run].save_every`` and the end), ``summary.json`` and signals are the run
lifecycle's (:mod:`rllm_core.run.lifecycle`), as in ``rllm-core run``. At the end, with
``[sft].export``, the model is written there as a standalone folder
(``export_weights(path, merge=True)``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rllm_core.plan import ResolvedPlan
from rllm_core.plugins.manager import PluginManager, get_plugin_manager
from rllm_core.ports import LogprobScorer
from rllm_core.run.checkpoints import RunCheckpoints
from rllm_core.run.folder import RunFolder
from rllm_core.run.lifecycle import Lifecycle, ResumeError, RunResult, fresh_or_resumed
from rllm_core.run.metrics import memory_metrics, sft_summary
from rllm_core.run.observers import RunObservers
from rllm_core.run.state import LoopState, capture_rngs
from rllm_core.run.trainer_thread import TrainerThread
from rllm_core.sft.batches import batch_datums, epoch_batches, steps_per_epoch
from rllm_core.sft.data import TokenExample
from rllm_core.sft.plots import write_sft_plots
from rllm_core.sft.step import eval_nll, supervised_forward_backward
from rllm_core.types import CutTrigger

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
        self._stop = False
        self.observers = RunObservers(
            loggers=loggers,
            plugins=plugins if plugins is not None else get_plugin_manager(),
            warn=display.warn,
        )
        self.checkpoints = RunCheckpoints(folder.checkpoints)
        self.lifecycle = Lifecycle(
            plan=self.plan,
            folder=folder,
            display=display,
            observers=self.observers,
            run_id=folder.path.name,
            summarize=self._summary,
            save=self._save,
        )

    def _initial_state(self) -> LoopState:
        if self.held_out and not isinstance(self.trainer, LogprobScorer):
            key = "eval_data" if self.sft.eval_data is not None else "eval_fraction"
            raise ResumeError(
                f"[sft].{key}: the trainer backend computes no logprobs (no LogprobScorer), so"
                " held-out examples cannot be scored; remove the key"
            )
        return fresh_or_resumed(
            self.folder,
            self.trainer,
            size=len(self.train),
            seed=self.plan.run.seed,
            resume=self.resume,
            what=f"the training data holds {len(self.train)} examples",
            again="resume with the same [sft] data",
            display=self.display,
            observers=self.observers,
        )

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

    def _on_stop(self) -> None:
        self._stop = True
        self.display.warn("stopping after the current step")

    async def run(self) -> RunResult:
        """Train the steps left; see the module docstring."""
        try:
            state = self._initial_state()
        except BaseException:
            self.observers.close_loggers()
            raise
        life = self.lifecycle
        life.begin(state, resumed=self.resume)
        thread = TrainerThread()
        try:
            with life.stop_signals(self._on_stop):
                while state.step < self.total_steps and not self._stop:
                    await thread.call(functools.partial(self._step, state))
                    life.after_step(state)
            thread.shutdown()
            life.final_checkpoint(state)
            status = "interrupted" if life.stop_code is not None else "finished"
            if status == "finished" and self.sft.export is not None:
                life.export(self.trainer, self.sft.export, "[sft].export")
            summary = life.summary(status)
        except BaseException as exc:
            thread.shutdown()
            life.crashed(exc)
            raise
        finally:
            life.close()
        return life.finish(status, life.stop_code or 0, summary)

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

    def _save(self, state: LoopState, trigger: CutTrigger) -> Path:
        return self.checkpoints.save(self.trainer, state, trigger=trigger)

    def _summary(self, status: str, state: LoopState) -> dict[str, Any]:
        rows = RunFolder.read_jsonl(self.folder.metrics)
        out = sft_summary(rows) | {
            "kind": "sft",
            "last_step": state.step,
            "total_steps": self.total_steps,
            "examples": len(self.train),
            "eval_examples": len(self.held_out),
            "weight_version": getattr(self.trainer, "weight_version", None),
        }
        if self.sft.export is not None and status == "finished":
            out["export"] = self.sft.export
        return out
