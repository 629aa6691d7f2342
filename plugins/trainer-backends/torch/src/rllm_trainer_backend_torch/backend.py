"""The ``torch`` trainer backend: a local transformers model, trained with LoRA or in full."""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from rllm_core.algorithms.objective import LossInputs, Objective, ObjectiveStep
from rllm_core.errors import TrainingInterrupted
from rllm_core.types import Datum

from rllm_trainer_backend_torch.checkpoint import (
    ADAPTER_DIR,
    read_state,
    read_weights,
    write_state,
    write_weights,
)
from rllm_trainer_backend_torch.collate import Collated, collate, count_examples
from rllm_trainer_backend_torch.distributed import (
    Group,
    resolve_strategy,
    share,
    start_group,
    wrap_model,
)
from rllm_trainer_backend_torch.gate import WeightGate
from rllm_trainer_backend_torch.loading import (
    fix_mmap_threshold,
    load_policy,
    release_free_memory,
    resolve_device,
    seed_everything,
)
from rllm_trainer_backend_torch.logprobs import (
    check_maskable_attention,
    shared_prefix_logprobs,
    token_logprobs,
)
from rllm_trainer_backend_torch.numerics import numerics_report, use_deterministic_numerics
from rllm_trainer_backend_torch.plugin import TorchBackendConfig
from rllm_trainer_backend_torch.schedule import build_scheduler
from rllm_trainer_backend_torch.sharded import is_sharded

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

    With ``parallel.world_size > 1`` the backend is one rank of a ``torch.distributed`` group
    that torchrun started (:class:`~rllm_core.ports.ParallelTrainer`): rank 0 is used as
    above, every other rank calls :meth:`follow`. Each of rank 0's calls is handed to every
    rank; a ``forward_backward`` call's micro-batches are shared out in contiguous blocks and
    the gradients summed, so results equal one process's up to summation order. The model
    is replicated (``ddp``) or sharded with FSDP2 (``fsdp``); checkpoints are then sharded
    (:mod:`rllm_trainer_backend_torch.sharded`) and releases gathered on rank 0.

    :meth:`interrupt` (:class:`~rllm_core.ports.Interruptible`) stops a ``forward_backward``
    or ``compute_logprobs`` of one process between two micro-batches; a parallel run finishes
    the call, as every rank must run the same passes.
    """

    def __init__(self, config: TorchBackendConfig) -> None:
        self.config = config
        if config.cpu_threads is not None:
            torch.set_num_threads(config.cpu_threads)
        if config.malloc_mmap_threshold_kb is not None:
            fix_mmap_threshold(config.malloc_mmap_threshold_kb)
        seed_everything(config.seed)
        self._group: Group | None = None
        self._strategy: str | None = None
        if config.parallel.world_size > 1:
            self._strategy = resolve_strategy(config.parallel, full=config.lora.full)
            self._group = start_group(config.parallel, config.device)
            self.device = self._group.device
        else:
            self.device = resolve_device(config.device)
        use_deterministic_numerics(config.deterministic, self.device)
        self.model = load_policy(config, self.device)
        if config.share_prefixes:
            check_maskable_attention(self.model)
        # What forward passes run (the DDP wrapper) and what the sampler reads (a full copy
        # on rank 0 when FSDP shards the parameters); both the model itself in one process.
        self._train_model = self.model
        self._full_model: torch.nn.Module | None = None
        if self._group is not None and self._strategy is not None:
            if self._strategy == "fsdp" and self._group.rank == 0:
                self._full_model = copy.deepcopy(self.model).requires_grad_(False)
            self._train_model = wrap_model(self.model, self._strategy, self.device)
        self._command_lock = threading.RLock()
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
        self._interrupt = threading.Event()
        self._sampler: Any = None
        self._reference: torch.nn.Module | None = None
        self._closed = False

    @property
    def rank(self) -> int:
        """This process's rank (0 when training alone)."""
        return 0 if self._group is None else self._group.rank

    @property
    def world_size(self) -> int:
        """Processes training together (``parallel.world_size``)."""
        return 1 if self._group is None else self._group.world_size

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
        """The sampler on this backend's weights (one per backend, built on first use; only
        rank 0 has one)."""
        self._check_open()
        if self.rank != 0:
            raise RuntimeError(
                f"rank {self.rank} has no sampler: only rank 0 samples; the other ranks call"
                " follow()"
            )
        if self._sampler is None:
            from rllm_trainer_backend_torch.sampler import TorchSampler

            if self._full_model is not None:
                self._run("refresh_full_model")
            self._sampler = TorchSampler(
                self._full_model if self._full_model is not None else self.model,
                gate=self.gate,
                device=self.device,
                max_batch_size=self.config.max_batch_size,
                max_seq_len=self.config.max_seq_len or self._context_length,
                prefix_cache_bytes=self.config.prefix_cache_mb * 2**20,
            )
        return self._sampler

    # ------------------------------------------------------------------ training

    def forward_backward(self, datums: Sequence[Datum], objective: Objective) -> dict[str, float]:
        """Add the gradient of ``objective`` over ``datums`` to the parameters.

        The datums are right-padded, split into micro-batches of ``micro_batch_size`` (and at
        most ``micro_batch_tokens``) and run in train mode; the objective's normalizers count
        every datum of this call (see :class:`~rllm_core.algorithms.objective.Objective`).
        Returns the objective's metrics plus the counts ``tokens`` and ``sequences``. Invalid
        datums raise ``ValueError`` before anything runs; a failure during the forward or
        backward pass clears every accumulated gradient, those of earlier calls included, and
        re-raises.
        """
        self._check_open()
        return self._run("forward_backward", list(datums), objective)

    def _forward_backward(self, datums: Sequence[Datum], objective: Objective) -> dict[str, float]:
        batch = collate(datums, vocab_size=self._vocab_size, max_length=self._context_length)
        step = objective.begin([batch.action_mask], [batch.observation_mask])
        if self._group is not None:
            self._shared_forward_backward(batch, step, self._group)
        else:
            self._local_forward_backward(batch, step)
        metrics = step.metrics()
        metrics["tokens"] = float(batch.lengths.sum())
        metrics["sequences"] = float(count_examples(datums))
        return metrics

    @contextlib.contextmanager
    def _computing(self) -> Iterator[None]:
        """Exclusive access for a pass over a batch, with the sampler's stored prefixes
        dropped first: they are stale once the weights change, and their memory is better
        spent on activations."""
        with self.gate.exclusive():
            if self._sampler is not None:
                self._sampler.drop_prefixes()
            yield

    def _local_forward_backward(self, batch: Collated, step: ObjectiveStep) -> None:
        with self._computing():
            self.model.train()
            try:
                for micro in self._micro_batches(batch):
                    self._check_interrupt("forward_backward")
                    self._micro_step(micro, step)
            except BaseException:
                self.optimizer.zero_grad(set_to_none=True)
                self._pending = False
                raise
            finally:
                self.model.eval()
            self._pending = True

    def interrupt(self) -> None:
        """Stop the ``forward_backward`` or ``compute_logprobs`` running on another thread
        before its next micro-batch (or the next such call, before its first), which raises
        :class:`~rllm_core.errors.TrainingInterrupted` with every pending gradient cleared.
        Ignored on a parallel run."""
        if self._group is None:
            self._interrupt.set()

    def _check_interrupt(self, call: str) -> None:
        if self._interrupt.is_set():
            self._interrupt.clear()
            raise TrainingInterrupted(f"{call} was interrupted before its next micro-batch")

    def _micro_batches(self, batch: Collated) -> Iterator[Collated]:
        return batch.micro_batches(
            self.config.micro_batch_size,
            self.config.micro_batch_tokens,
            shared=self._shares_prefixes(batch),
        )

    def _shares_prefixes(self, batch: Collated) -> bool:
        # Packed SFT examples restart their position ids inside a row; a tree cannot hold them.
        return self.config.share_prefixes and batch.position_ids is None

    def _micro_step(self, micro: Collated, step: ObjectiveStep) -> None:
        logprobs, entropy = self._micro_logprobs(micro, self.model, step.objective)
        step.evaluate(self._loss_inputs(micro, logprobs, entropy)).backward()

    def _micro_logprobs(
        self, micro: Collated, model: torch.nn.Module, objective: Objective
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The micro-batch's logprobs and, when the objective has an entropy bonus, the
        entropies at the same positions (one forward pass for both)."""
        needed = micro.action_mask != 0
        if objective.reads_observations:
            needed |= micro.observation_mask != 0
        entropy = objective.needs_entropy
        if self._shares_prefixes(micro):
            out = shared_prefix_logprobs(
                model,
                micro.token_ids,
                micro.lengths,
                device=self.device,
                temperature=self.config.logprob_temperature,
                needed=needed,
                entropy=entropy,
            )
        else:
            out = token_logprobs(
                model,
                micro.token_ids.to(self.device),
                temperature=self.config.logprob_temperature,
                needed=needed.to(self.device),
                position_ids=_on(micro.position_ids, self.device),
                entropy=entropy,
            )
        return out if entropy else (out, None)

    def _loss_inputs(
        self, micro: Collated, logprobs: torch.Tensor, entropy: torch.Tensor | None = None
    ) -> LossInputs:
        device = self.device
        return LossInputs(
            logprobs=logprobs,
            rollout_logprobs=micro.rollout_logprobs.to(device),
            advantages=micro.advantages.to(device),
            action_mask=micro.action_mask.to(device),
            observation_mask=micro.observation_mask.to(device),
            proximal_logprobs=_on(micro.proximal_logprobs, device),
            ref_logprobs=_on(micro.ref_logprobs, device),
            entropy=entropy,
        )

    def _shared_forward_backward(self, batch: Collated, step: ObjectiveStep, group: Group) -> None:
        """This rank's block of the call's micro-batches. Every rank runs as many forward and
        backward passes as the largest block (FSDP gathers each layer's parameters at each
        pass), padding with passes of zero loss, and the last pass syncs the gradients: the
        wrappers average them, so each loss is scaled by the world size to sum them. A loss
        that fails on one rank becomes a zero-loss pass there, so no rank waits forever; the
        failure is then raised on every rank, with the gradients cleared."""
        micros = list(self._micro_batches(batch))
        mine = [micros[index] for index in share(len(micros), group.world_size, group.rank)]
        rounds = -(-len(micros) // group.world_size)
        filler = next(batch.micro_batches(1))
        failure: BaseException | None = None
        with self._computing():
            self._train_model.train()
            try:
                for index in range(rounds):
                    real = index < len(mine)
                    micro = mine[index] if real else filler
                    with self._gradient_sync(index == rounds - 1):
                        logprobs, entropy = self._micro_logprobs(
                            micro, self._train_model, step.objective
                        )
                        total = None
                        if real and failure is None:
                            try:
                                total = step.evaluate(self._loss_inputs(micro, logprobs, entropy))
                            except Exception as exc:
                                failure = exc
                        if total is None:
                            total = logprobs.sum() * 0.0
                            if entropy is not None:
                                total = total + entropy.sum() * 0.0
                        (total * group.world_size).backward()
            except BaseException as exc:
                failure = failure or exc
            finally:
                self._train_model.eval()
            try:
                group.check(failure, "forward_backward")
            except BaseException:
                self.optimizer.zero_grad(set_to_none=True)
                self._pending = False
                raise
            self._pending = True
        step.merge(group.gather(step.partial()))

    def _gradient_sync(self, sync: bool) -> Any:
        if self._strategy == "ddp" and not sync:
            return self._train_model.no_sync()
        return contextlib.nullcontext()

    def compute_logprobs(self, datums: Sequence[Datum]) -> list[list[float]]:
        """Each datum's per-token logprobs under the current weights (0.0 at position 0), in
        eval mode and without gradient, at ``logprob_temperature``."""
        self._check_open()
        return self._run("compute_logprobs", list(datums))

    def compute_ref_logprobs(self, datums: Sequence[Datum]) -> list[list[float]]:
        """Each datum's per-token logprobs under the reference model
        (:class:`~rllm_core.ports.ReferenceScorer`), in eval mode and without gradient, at
        ``logprob_temperature``: with LoRA the policy with its adapters disabled (one more
        forward pass, no copy); with full training a frozen copy of ``config.model`` as loaded,
        made on the first call (the starting weights: the memory of a second model, held only
        by runs with ``[algorithm.kl] coef > 0``)."""
        self._check_open()
        return self._run("compute_ref_logprobs", list(datums))

    def _compute_ref_logprobs(self, datums: Sequence[Datum]) -> list[list[float]]:
        if self.config.lora.full:
            return self._compute_logprobs(datums, model=self._reference_model())
        with self.model.disable_adapter():
            return self._compute_logprobs(datums)

    def _reference_model(self) -> torch.nn.Module:
        if self._reference is None:
            from rllm_trainer_backend_torch.loading import load_reference

            self._reference = load_reference(self.config, self.device)
        return self._reference

    def _compute_logprobs(
        self, datums: Sequence[Datum], model: torch.nn.Module | None = None
    ) -> list[list[float]]:
        batch = collate(datums, vocab_size=self._vocab_size, max_length=self._context_length)
        micros = list(self._micro_batches(batch))
        rounds = len(micros)
        group = self._group
        if group is not None:
            rounds = -(-len(micros) // group.world_size)
            micros = [micros[index] for index in share(len(micros), group.world_size, group.rank)]
        if model is None:
            model = self.model if self._strategy != "fsdp" else self._train_model
        out: list[list[float]] = []
        with self._computing(), torch.no_grad():
            for index in range(rounds):
                if group is None:
                    self._check_interrupt("compute_logprobs")
                micro = micros[index] if index < len(micros) else next(batch.micro_batches(1))
                if self._shares_prefixes(micro):
                    logprobs = shared_prefix_logprobs(
                        model,
                        micro.token_ids,
                        micro.lengths,
                        device=self.device,
                        temperature=self.config.logprob_temperature,
                    ).cpu()
                else:
                    logprobs = token_logprobs(
                        model,
                        micro.token_ids.to(self.device),
                        temperature=self.config.logprob_temperature,
                        position_ids=_on(micro.position_ids, self.device),
                    ).cpu()
                if index >= len(micros):
                    continue
                for row, length in zip(logprobs, micro.lengths.tolist(), strict=True):
                    out.append(row[:length].tolist())
        if group is not None:
            return [row for part in group.gather(out) for row in part]
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
        return self._run("optim_step")

    def _optim_step(self) -> dict[str, float]:
        if not self._pending:
            raise RuntimeError("optim_step() without gradients: call forward_backward(...) first")
        params = list(self._parameters.values())
        max_norm = self.config.max_grad_norm if self.config.max_grad_norm > 0 else math.inf
        with self.gate.exclusive():
            learning_rate = float(self.optimizer.param_groups[0]["lr"])
            norm = _as_float(torch.nn.utils.clip_grad_norm_(params, max_norm))
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
            self._refresh_full_model()
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
        ``optim_step``, where saving would drop the accumulated gradients. With several
        processes the checkpoint is sharded (:mod:`rllm_trainer_backend_torch.sharded`;
        ``path`` must be a folder every rank sees) and loads at any world size."""
        self._check_open()
        self._run("save_state", path)

    def _save_state(self, path: str) -> None:
        if self._pending:
            raise RuntimeError(
                "save_state() after forward_backward() and before optim_step() would lose the"
                " accumulated gradients; call optim_step() first"
            )
        counters = {"optimizer_steps": self._steps, "weight_version": self.gate.version}
        group = self._group
        if group is not None:
            from rllm_trainer_backend_torch.sharded import write_sharded

            with self.gate.exclusive():
                write_sharded(
                    path,
                    model=self.model,
                    optimizer=self.optimizer,
                    scheduler=self.scheduler,
                    identity=self.identity(),
                    counters=counters,
                    rank=group.rank,
                    world_size=group.world_size,
                )
                self._save_adapter(path)
            return
        with self.gate.exclusive():
            write_state(
                path,
                parameters=self._parameters,
                optimizer=self.optimizer,
                scheduler=self.scheduler,
                identity=self.identity(),
                counters={"optimizer_steps": self._steps, "weight_version": self.gate.version},
            )
            self._save_adapter(path)

    def _save_adapter(self, path: str) -> None:
        """With LoRA, rank 0 writes the checkpoint's adapters as a PEFT adapter folder
        (``<path>/adapter``) too, for peft and model servers; the checkpoint itself does not
        need it to load. The caller holds the gate."""
        if not self.config.lora.full and self.rank == 0:
            self._export(os.path.join(path, ADAPTER_DIR), merge=False, tokenizer=False)

    def load_state(self, path: str) -> None:
        """Restore a folder written by :meth:`save_state` (by a backend with the same model,
        dtype and LoRA shape; ``CheckpointError`` otherwise), publishing its weight version.
        Optimizer hyperparameters (learning rate, betas, weight decay) come from the
        checkpoint. Pending gradients are cleared. Reads a sharded checkpoint too, at any world
        size."""
        self._check_open()
        self._run("load_state", path)

    def _load_state(self, path: str) -> None:
        with self.gate.exclusive():
            if self._group is None or (self._strategy == "ddp" and not is_sharded(path)):
                counters = read_state(
                    path,
                    parameters=self._parameters,
                    optimizer=self.optimizer,
                    scheduler=self.scheduler,
                    identity=self.identity(),
                )
            else:
                counters = self._load_shared_state(path)
            self._refresh_full_model()
            self.optimizer.zero_grad(set_to_none=True)
            self._pending = False
            self._steps = counters["optimizer_steps"]
            self.gate.set_version(counters["weight_version"])

    def _load_shared_state(self, path: str) -> dict[str, int]:
        from rllm_trainer_backend_torch.sharded import read_into_group

        return read_into_group(
            path,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            identity=self.identity(),
            names=list(self._parameters),
        )

    # ------------------------------------------------------------------ releases

    def save_weights(self, path: str) -> None:
        """Write the trainable weights of the current version into the folder ``path``: the
        adapters with LoRA, every parameter for full training
        (:class:`~rllm_core.ports.WeightReleaser`). With several processes rank 0 writes the
        whole weights, the same file as one process."""
        self._check_open()
        self._run("save_weights", path)

    def _save_weights(self, path: str) -> None:
        with self.gate.exclusive():
            parameters = self._whole_parameters()
            if self.rank == 0:
                write_weights(
                    path,
                    parameters=parameters,
                    identity=self.identity(),
                    version=self.gate.version,
                )

    def _whole_parameters(self) -> Mapping[str, torch.Tensor]:
        """The trainable parameters whole: gathered onto rank 0 (empty elsewhere) when FSDP
        shards them, a collective every rank calls."""
        if self._strategy != "fsdp":
            return self._parameters
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        whole = get_model_state_dict(
            self.model,
            options=StateDictOptions(
                full_state_dict=True, cpu_offload=True, ignore_frozen_params=True
            ),
        )
        return {name: whole[name] for name in self._parameters} if self.rank == 0 else {}

    def _refresh_full_model(self) -> None:
        """With FSDP, copy the gathered weights into rank 0's whole model (the sampler's and
        the exports'); a collective every rank calls. Nothing otherwise."""
        if self._strategy != "fsdp":
            return
        whole = self._whole_parameters()
        if self._full_model is not None:
            with torch.no_grad():
                for name, param in self._full_model.named_parameters():
                    param.copy_(whole[name])

    def load_weights(self, path: str, version: int) -> None:
        """Install weights :meth:`save_weights` wrote (by a backend with the same model, dtype
        and LoRA shape; ``CheckpointError`` otherwise, with nothing changed) as weight version
        ``version``: the sampler admits no sequence while they change and tags every later one
        with ``version``. Pending gradients are dropped; the optimizer state is kept."""
        self._check_open()
        self._run("load_weights", path, version)

    def _load_weights(self, path: str, version: int) -> None:
        with self.gate.exclusive():
            if self._strategy == "fsdp":
                from torch.distributed.checkpoint.state_dict import (
                    StateDictOptions,
                    set_model_state_dict,
                )

                whole = {
                    name: torch.empty(tuple(param.shape), dtype=param.dtype)
                    for name, param in self._parameters.items()
                }
                read_weights(path, parameters=whole, identity=self.identity())
                set_model_state_dict(
                    self.model, whole, options=StateDictOptions(full_state_dict=True, strict=False)
                )
                self._refresh_full_model()
            else:
                read_weights(path, parameters=self._parameters, identity=self.identity())
            self.optimizer.zero_grad(set_to_none=True)
            self._pending = False
            self.gate.set_version(version)

    def export_weights(self, path: str, *, merge: bool = False) -> Any:
        """Write the current version into the folder ``path`` as model servers load it and
        return its :class:`~rllm_core.types.ExportedWeights`
        (:class:`~rllm_core.ports.WeightExporter`): with LoRA a PEFT adapter folder over the
        resolved base model folder, with its tokenizer files; for full training, or with
        ``merge``, a model folder with the base's tokenizer and chat template that loads on its
        own (:func:`rllm_trainer_backend_torch.export.export_policy`). With several processes
        rank 0 writes it from its whole copy of the weights."""
        self._check_open()
        return self._run("export_weights", path, merge)

    def _export_weights(self, path: str, merge: bool = False) -> Any:
        with self.gate.exclusive():
            if self.rank != 0:
                return None
            return self._export(path, merge=merge, tokenizer=True)

    def _export(self, path: str, *, merge: bool, tokenizer: bool) -> Any:
        from rllm_core.models import resolve_model

        from rllm_trainer_backend_torch.export import export_policy

        return export_policy(
            self._full_model if self._full_model is not None else self.model,
            path,
            version=self.gate.version,
            base_model=resolve_model(self.config.model),
            lora_rank=self.config.lora.rank,
            merge=merge,
            tokenizer=tokenizer,
        )

    # ------------------------------------------------------------------ lifecycle

    def follow(self) -> None:
        """Ranks > 0: carry out rank 0's calls until rank 0 closes its backend, then close this
        one and return (:class:`~rllm_core.ports.ParallelTrainer`). A call that fails here is
        reported to rank 0, which raises it; the loop goes on. Raises ``RuntimeError`` when rank
        0 is gone or when called on rank 0."""
        group = self._group
        if group is None or group.rank == 0:
            raise RuntimeError(
                "follow() is for ranks > 0 of a parallel run; rank 0 (or a backend training"
                " alone) is driven by calling its methods"
            )
        self._check_open()
        while True:
            try:
                command = group.receive()
            except Exception as exc:
                self._release()
                raise RuntimeError(
                    f"rank {group.rank} lost rank 0 while waiting for its next call ({exc});"
                    " see rank 0's log for why it stopped"
                ) from exc
            if command is None:
                self._shutdown()
                return
            name, args = command
            try:
                self._execute(name, args)
            except Exception:
                continue

    def _run(self, name: str, *args: Any) -> Any:
        """Carry out ``_<name>(*args)``: alone, or on every rank when this is rank 0."""
        group = self._group
        if group is None:
            return getattr(self, f"_{name}")(*args)
        if group.rank != 0:
            raise RuntimeError(
                f"{name}() called on rank {group.rank}: only rank 0 drives the backend; the"
                " other ranks call follow()"
            )
        with self._command_lock:
            group.send((name, args))
            return self._execute(name, args)

    def _execute(self, name: str, args: tuple[Any, ...]) -> Any:
        assert self._group is not None
        error: BaseException | None = None
        result = None
        try:
            result = getattr(self, f"_{name}")(*args)
        except Exception as exc:
            error = exc
        self._group.check(error, f"{name}()")
        return result

    def close(self) -> None:
        """Close the sampler and release the model. Calling it again does nothing. On rank 0
        of a parallel run it also ends the other ranks' :meth:`follow` and leaves the process
        group."""
        if self._closed:
            return
        group = self._group
        if group is not None and group.rank == 0:
            with self._command_lock:
                try:
                    group.send(None)
                finally:
                    self._shutdown()
            return
        self._release()

    def _shutdown(self) -> None:
        import torch.distributed as dist

        self._release()
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()

    def _release(self) -> None:
        if self._closed:
            return
        self._closed = True
        sampler, self._sampler = self._sampler, None
        closer = getattr(sampler, "close", None)
        if callable(closer) and not inspect.iscoroutinefunction(closer):
            closer()
        self.model = None
        self._train_model = None
        self._full_model = None
        self._reference = None
        self.optimizer.state.clear()
        self._parameters = {}
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this TorchBackend is closed; build a new one")


def _on(tensor: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    return None if tensor is None else tensor.to(device)


def _as_float(norm: torch.Tensor) -> float:
    # With FSDP2 the norm is a DTensor; its full value is the global norm.
    full = getattr(norm, "full_tensor", None)
    return float(full() if callable(full) else norm)
