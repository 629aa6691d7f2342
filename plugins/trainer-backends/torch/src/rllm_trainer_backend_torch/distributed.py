"""The torch backend's process group: joining it, wrapping the model for a strategy, handing
rank 0's calls to the other ranks and agreeing on failures."""

from __future__ import annotations

import datetime
import os
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from rllm_core.errors import ComponentError, RllmError
from rllm_core.ports import ParallelSettings

__all__ = ["Group", "RankFailure", "resolve_strategy", "share", "start_group", "wrap_model"]

_LAUNCH = (
    "start it with `rllm-core run` (which launches the processes itself) or with"
    " `torchrun --nproc-per-node <world_size> -m rllm_core run ...`"
)


class RankFailure(RllmError, RuntimeError):
    """Another rank failed while carrying out a call rank 0 made."""


def _config_error(message: str) -> ComponentError:
    return ComponentError(message, kind="trainer_backend", name="torch")


@dataclass(frozen=True, slots=True)
class Group:
    """This process's place in the default process group."""

    rank: int
    world_size: int
    device: torch.device

    def send(self, command: tuple[str, tuple[Any, ...]] | None) -> None:
        """Rank 0: hand one call (method name, arguments) to every other rank; ``None`` ends
        :meth:`receive` loops."""
        dist.broadcast_object_list([command], src=0)

    def receive(self) -> tuple[str, tuple[Any, ...]] | None:
        """Ranks > 0: wait for rank 0's next call."""
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order, on every rank."""
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out

    def check(self, error: BaseException | None, what: str) -> None:
        """Agree on the outcome of ``what``: when any rank failed, raise on every rank (a rank
        that failed re-raises its own error, the others a :class:`RankFailure` naming the first
        rank that failed and its error)."""
        described = None if error is None else _describe(error)
        outcomes = self.gather(described)
        if error is not None:
            raise error
        for rank, outcome in enumerate(outcomes):
            if outcome is not None:
                raise RankFailure(
                    f"rank {rank} of {self.world_size} failed in {what}: {outcome}; see that"
                    " rank's log for the traceback"
                )


def _describe(error: BaseException) -> str:
    if isinstance(error, RankFailure):
        return str(error)
    last = traceback.extract_tb(error.__traceback__)[-1:] if error.__traceback__ else []
    where = f" (at {last[0].filename}:{last[0].lineno})" if last else ""
    return f"{type(error).__name__}: {error}{where}"


def start_group(settings: ParallelSettings, device_spec: str) -> Group:
    """Join the process group torchrun described in the environment (``RANK``,
    ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``), or use the one already
    initialized, and pick this rank's device: ``cuda:LOCAL_RANK`` when CUDA is used, else the
    CPU."""
    launched = os.environ.get("WORLD_SIZE")
    if launched is None and not dist.is_initialized():
        raise _config_error(
            f"[trainer].parallel.world_size is {settings.world_size} but this process was not"
            f" started by torchrun (WORLD_SIZE is not set); {_LAUNCH}"
        )
    world_size = dist.get_world_size() if dist.is_initialized() else int(launched or 0)
    if world_size != settings.world_size:
        raise _config_error(
            f"[trainer].parallel.world_size is {settings.world_size} but torchrun started"
            f" {world_size} processes (WORLD_SIZE={world_size}); make them equal, or {_LAUNCH}"
        )
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = _pick_device(device_spec, local_rank)
    backend = settings.backend
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise _config_error(
            "[trainer].parallel.backend = 'nccl' needs CUDA devices but this rank trains on the"
            " CPU; use backend = 'gloo' (or 'auto')"
        )
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(
            backend=backend,
            timeout=datetime.timedelta(seconds=settings.timeout_s),
            device_id=device if device.type == "cuda" else None,
        )
    return Group(rank=dist.get_rank(), world_size=world_size, device=device)


def _pick_device(spec: str, local_rank: int) -> torch.device:
    if spec == "cpu":
        return torch.device("cpu")
    if spec not in ("auto", "cuda"):
        raise _config_error(
            f"[trainer].device = {spec!r} names one device, but with parallel.world_size > 1"
            " each rank uses cuda:LOCAL_RANK; set device = 'auto', 'cuda' or 'cpu'"
        )
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        if local_rank >= count:
            raise _config_error(
                f"LOCAL_RANK {local_rank} has no CUDA device: {count} are visible; start at"
                f" most {count} processes per node"
            )
        return torch.device("cuda", local_rank)
    if spec == "cuda":
        raise _config_error(
            f"device 'cuda' asks for CUDA, but torch {torch.__version__} sees no CUDA device;"
            " set device = 'auto' or 'cpu'"
        )
    return torch.device("cpu")


def resolve_strategy(settings: ParallelSettings, *, full: bool) -> str:
    """``ddp`` or ``fsdp``: ``auto`` is fsdp for full training and ddp for LoRA. FSDP with
    LoRA is refused: its frozen base weights would be sharded and gathered for nothing."""
    strategy = settings.strategy
    if strategy == "auto":
        return "fsdp" if full else "ddp"
    if strategy == "fsdp" and not full:
        raise _config_error(
            "[trainer].parallel.strategy = 'fsdp' shards full training only, but lora.rank > 0"
            " trains adapters; use strategy = 'ddp' (or 'auto'), or lora.rank = 0"
        )
    return strategy


def wrap_model(model: torch.nn.Module, strategy: str, device: torch.device) -> torch.nn.Module:
    """The module forward_backward runs: ``model`` in DistributedDataParallel (``ddp``), or
    ``model`` itself after FSDP2 ``fully_shard`` of each decoder layer and then of the root
    (``fsdp``, which changes ``model`` in place). Parameters keep their names."""
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(
            model,
            device_ids=[device.index] if device.type == "cuda" else None,
            broadcast_buffers=False,
        )
    from torch.distributed.fsdp import fully_shard

    layers = _decoder_layers(model)
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def _decoder_layers(model: torch.nn.Module) -> Sequence[torch.nn.Module]:
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and name.endswith("layers"):
            return list(module)
    raise _config_error(
        f"found no decoder layers (a ModuleList named '*layers') in {type(model).__name__} to"
        " shard; use parallel.strategy = 'ddp'"
    )


def share(count: int, world_size: int, rank: int) -> range:
    """The contiguous block of ``count`` items that ``rank`` takes; blocks differ in size by
    at most one, earlier ranks taking the larger ones."""
    base, extra = divmod(count, world_size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))
