"""The ``torch`` trainer backend: a local transformers model, trained with LoRA or in full."""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from rllm_core.algorithms.objective import LossInputs, Objective, ObjectiveStep
from rllm_core.types import Datum

from rllm_trainer_backend_torch.checkpoint import (
    read_state,
    read_weights,
    write_state,
    write_weights,
)
from rllm_trainer_backend_torch.collate import Collated, collate
from rllm_trainer_backend_torch.gate import WeightGate
from rllm_trainer_backend_torch.loading import (
    load_policy,
    release_free_memory,
    resolve_device,
    seed_everything,
)
from rllm_trainer_backend_torch.logprobs import token_logprobs
from rllm_trainer_backend_torch.numerics import numerics_report, use_deterministic_numerics
from rllm_trainer_backend_torch.plugin import TorchBackendConfig
from rllm_trainer_backend_torch.schedule import build_scheduler

__all__ = ["TorchBackend"]


class TorchBackend:
    """A :class:`~rllm_core.ports.TrainerBackend` on one local transformers model.

    Construction seeds Python's and torch's generators from ``config.seed``, loads the model on
    the configured device (CUDA when present with ``device = "auto"``), adds LoRA adapters
    unless ``lora.rank = 0``, and builds AdamW and the learning-rate schedule over the trainable
    parameters. The model stays in eval mode except inside ``forward_backward``.

    Gradient normalization spans one ``forward_backward`` call: pass all of an optimizer step's
    datums in one call and the backend splits them into micro-batches of
    ``micro_batch_size`` itself, so the gradient does not depend on the micro-batch size. More
    calls before ``optim_step`` add their gradients, each normalized over its own datums.

    Training and sampling share the weights through a :class:`WeightGate`: the trainer takes
    exclusive access around ``forward_backward``, ``optim_step``, ``load_state`` and
    ``load_weights``, and every ``optim_step`` publishes a new weight version that the sampler
    reports. ``save_weights`` / ``load_weights`` (:class:`~rllm_core.ports.WeightReleaser`)
    carry a policy release from a training backend to one that samples.

    With ``config.deterministic`` (the default) the process computes in reproducible mode
    (:mod:`rllm_trainer_backend_torch.numerics`): the same datums, seed and conditions give bitwise
    equal results across processes.
    """

    def __init__(self, config: TorchBackendConfig) -> None:
        self.config = config
        if config.cpu_threads is not None:
            torch.set_num_threads(config.cpu_threads)
        seed_everything(config.seed)
        self.device = resolve_device(config.device)
        use_deterministic_numerics(config.deterministic, self.device)
        self.model = load_policy(config, self.device)
        self._parameters = {
            name: param for name, param in self.model.named_parameters() if param.requires_grad
        }
        self.optimizer = torch.optim.AdamW(
            list(self._parameters.values()),
            lr=config.learning_rate,
            betas=config.betas,
            eps=config.eps,
            weight_decay=config.weight_decay,
        )
        self.scheduler = build_scheduler(
            self.optimizer,
            schedule=config.lr_schedule,
            warmup_steps=config.warmup_steps,
            total_steps=config.total_steps,
        )
        self.gate = WeightGate()
        model_config = self.model.config
        self._vocab_size = int(self.model.get_input_embeddings().num_embeddings)
        self._context_length: int | None = getattr(model_config, "max_position_embeddings", None)
        self._steps = 0
        self._pending = False
        self._sampler: Any = None
        self._closed = False

    def numerics(self) -> dict[str, Any]:
        """What this backend's results depend on (:class:`~rllm_core.ports.NumericsReport`)."""
        return numerics_report(self.device, self.config.dtype)

    # ------------------------------------------------------------------ state

    @property
    def weight_version(self) -> int:
        """Increments with every ``optim_step``; restored by ``load_state``."""
        return self.gate.version

    @property
    def optimizer_steps(self) -> int:
        """Optimizer steps taken, counting those restored by ``load_state``."""
        return self._steps

    @property
    def trainable_parameters(self) -> Mapping[str, torch.nn.Parameter]:
        """The parameters the optimizer updates, by module name (adapters only with LoRA)."""
        return dict(self._parameters)

    def sampler(self) -> Any:
        """The sampler on this backend's weights (one per backend, built on first use)."""
        self._check_open()
        if self._sampler is None:
            from rllm_trainer_backend_torch.sampler import TorchSampler

            self._sampler = TorchSampler(
                self.model,
                gate=self.gate,
                device=self.device,
                max_batch_size=self.config.max_batch_size,
                max_seq_len=self.config.max_seq_len or self._context_length,
            )
        return self._sampler

    # ------------------------------------------------------------------ training

    def forward_backward(self, datums: Sequence[Datum], objective: Objective) -> dict[str, float]:
        """Add the gradient of ``objective`` over ``datums`` to the parameters.

        The datums are right-padded, split into micro-batches of ``micro_batch_size`` and run
        in train mode; the objective's normalizers count every datum of this call (see
        :class:`~rllm_core.algorithms.objective.Objective`). Returns the objective's metrics
        plus the counts ``tokens`` and ``sequences``. Invalid datums raise ``ValueError``
        before anything runs; a failure during the forward or backward pass clears every
        accumulated gradient, those of earlier calls included, and re-raises.
        """
        self._check_open()
        batch = collate(datums, vocab_size=self._vocab_size, max_length=self._context_length)
        step = objective.begin([batch.action_mask], [batch.observation_mask])
        with self.gate.exclusive():
            self.model.train()
            try:
                for micro in batch.micro_batches(self.config.micro_batch_size):
                    self._micro_step(micro, step)
            except BaseException:
                self.optimizer.zero_grad(set_to_none=True)
                self._pending = False
                raise
            finally:
                self.model.eval()
            self._pending = True
        metrics = step.metrics()
        metrics["tokens"] = float(batch.lengths.sum())
        metrics["sequences"] = float(batch.size)
        return metrics

    def _micro_step(self, micro: Collated, step: ObjectiveStep) -> None:
        device = self.device
        logprobs = token_logprobs(
            self.model,
            micro.token_ids.to(device),
            temperature=self.config.logprob_temperature,
            needed=((micro.action_mask != 0) | (micro.observation_mask != 0)).to(device),
        )
        proximal = micro.proximal_logprobs
        total = step.evaluate(
            LossInputs(
                logprobs=logprobs,
                rollout_logprobs=micro.rollout_logprobs.to(device),
                advantages=micro.advantages.to(device),
                action_mask=micro.action_mask.to(device),
                observation_mask=micro.observation_mask.to(device),
                proximal_logprobs=None if proximal is None else proximal.to(device),
            )
        )
        total.backward()

    def compute_logprobs(self, datums: Sequence[Datum]) -> list[list[float]]:
        """Each datum's per-token logprobs under the current weights (0.0 at position 0), in
        eval mode and without gradient, at ``logprob_temperature``."""
        self._check_open()
        batch = collate(datums, vocab_size=self._vocab_size, max_length=self._context_length)
        out: list[list[float]] = []
        with self.gate.exclusive(), torch.no_grad():
            for micro in batch.micro_batches(self.config.micro_batch_size):
                logprobs = token_logprobs(
                    self.model,
                    micro.token_ids.to(self.device),
                    temperature=self.config.logprob_temperature,
                ).cpu()
                for row, length in zip(logprobs, micro.lengths.tolist(), strict=True):
                    out.append(row[:length].tolist())
        return out

    def optim_step(self) -> dict[str, float]:
        """Clip the accumulated gradients, step AdamW and the schedule, clear the gradients
        and publish a new weight version.

        Returns ``grad_norm`` (the global L2 norm before clipping), ``learning_rate`` (the rate
        this step used) and ``step`` (optimizer steps taken, this one included). Raises
        ``RuntimeError`` when no ``forward_backward`` preceded it, and ``FloatingPointError``
        (after clearing the gradients, without changing the weights) when the gradient norm is
        not finite.
        """
        self._check_open()
        if not self._pending:
            raise RuntimeError("optim_step() without gradients: call forward_backward(...) first")
        params = list(self._parameters.values())
        max_norm = self.config.max_grad_norm if self.config.max_grad_norm > 0 else math.inf
        with self.gate.exclusive():
            learning_rate = float(self.optimizer.param_groups[0]["lr"])
            norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
            if not math.isfinite(norm):
                self.optimizer.zero_grad(set_to_none=True)
                self._pending = False
                raise FloatingPointError(
                    f"gradient norm is {norm} at optimizer step {self._steps + 1}; the step was"
                    " not applied and the gradients were cleared. Check the datums' advantages"
                    " and the loss for extreme values, or lower learning_rate"
                )
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            self._pending = False
            self._steps += 1
            self.gate.publish()
        release_free_memory()
        return {"grad_norm": norm, "learning_rate": learning_rate, "step": float(self._steps)}

    # ------------------------------------------------------------------ checkpoints

    def identity(self) -> dict[str, Any]:
        """What a checkpoint must match to load into this backend: the model, the dtype, the
        training mode with the LoRA shape, and the trainable parameters' names and shapes."""
        lora = self.config.lora
        return {
            "model": self.config.model,
            "dtype": self.config.dtype,
            "training": "full" if lora.full else "lora",
            "lora": None
            if lora.full
            else {
                "rank": lora.rank,
                "alpha": lora.alpha,
                "target_modules": list(lora.target_modules),
            },
            "parameters": {name: list(param.shape) for name, param in self._parameters.items()},
        }

    def save_state(self, path: str) -> None:
        """Write trainable weights, optimizer, schedule, random generators and counters into
        the folder ``path``. Raises ``RuntimeError`` between ``forward_backward`` and
        ``optim_step``, where saving would drop the accumulated gradients."""
        self._check_open()
        if self._pending:
            raise RuntimeError(
                "save_state() after forward_backward() and before optim_step() would lose the"
                " accumulated gradients; call optim_step() first"
            )
        with self.gate.exclusive():
            write_state(
                path,
                parameters=self._parameters,
                optimizer=self.optimizer,
                scheduler=self.scheduler,
                identity=self.identity(),
                counters={"optimizer_steps": self._steps, "weight_version": self.gate.version},
            )

    def load_state(self, path: str) -> None:
        """Restore a folder written by :meth:`save_state` (by a backend with the same model,
        dtype and LoRA shape; ``CheckpointError`` otherwise), publishing its weight version.
        Optimizer hyperparameters (learning rate, betas, weight decay) come from the
        checkpoint. Pending gradients are cleared."""
        self._check_open()
        with self.gate.exclusive():
            counters = read_state(
                path,
                parameters=self._parameters,
                optimizer=self.optimizer,
                scheduler=self.scheduler,
                identity=self.identity(),
            )
            self.optimizer.zero_grad(set_to_none=True)
            self._pending = False
            self._steps = counters["optimizer_steps"]
            self.gate.set_version(counters["weight_version"])

    # ------------------------------------------------------------------ releases

    def save_weights(self, path: str) -> None:
        """Write the trainable weights of the current version into the folder ``path``: the
        adapters with LoRA, every parameter for full training
        (:class:`~rllm_core.ports.WeightReleaser`)."""
        self._check_open()
        with self.gate.exclusive():
            write_weights(
                path,
                parameters=self._parameters,
                identity=self.identity(),
                version=self.gate.version,
            )

    def load_weights(self, path: str, version: int) -> None:
        """Install weights :meth:`save_weights` wrote (by a backend with the same model, dtype
        and LoRA shape; ``CheckpointError`` otherwise, with nothing changed) as weight version
        ``version``: the sampler admits no sequence while they change and tags every later one
        with ``version``. Pending gradients are dropped; the optimizer state is kept."""
        self._check_open()
        with self.gate.exclusive():
            read_weights(path, parameters=self._parameters, identity=self.identity())
            self.optimizer.zero_grad(set_to_none=True)
            self._pending = False
            self.gate.set_version(version)

    def export_weights(self, path: str) -> Any:
        """Write the current version into the folder ``path`` as model servers load it and
        return its :class:`~rllm_core.types.ExportedWeights`
        (:class:`~rllm_core.ports.WeightExporter`): a PEFT adapter folder over the resolved
        base model folder with LoRA, a model folder with the base's tokenizer files for full
        training (:func:`rllm_trainer_backend_torch.export.export_policy`)."""
        from rllm_core.models import resolve_model

        from rllm_trainer_backend_torch.export import export_policy

        self._check_open()
        with self.gate.exclusive():
            return export_policy(
                self.model,
                path,
                version=self.gate.version,
                base_model=resolve_model(self.config.model),
                lora_rank=self.config.lora.rank,
            )

    # ------------------------------------------------------------------ lifecycle

    def close(self) -> None:
        """Close the sampler and release the model. Calling it again does nothing."""
        if self._closed:
            return
        self._closed = True
        sampler, self._sampler = self._sampler, None
        closer = getattr(sampler, "close", None)
        if callable(closer) and not inspect.iscoroutinefunction(closer):
            closer()
        self.model = None
        self.optimizer.state.clear()
        self._parameters = {}
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this TorchBackend is closed; build a new one")
