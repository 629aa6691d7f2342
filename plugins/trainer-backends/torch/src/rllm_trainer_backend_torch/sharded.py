"""Sharded checkpoints of a backend that trains in several processes, and their consolidation.

Layout of a sharded checkpoint folder (``state.json`` format 2, ``"layout": "sharded"``):

- ``sharded/``: a ``torch.distributed.checkpoint`` folder holding ``model`` (the trainable
  parameters) and ``optimizer``, both keyed by parameter name
  (``torch.distributed.checkpoint.state_dict``), so it loads at any world size;
- ``trainer.pt``: rank 0's scheduler state, random generators and optimizer hyperparameters
  (``param_groups``);
- ``state.json``: format, layout, the world size that wrote it, counters and identity; written
  last.

:func:`consolidate` turns it into the single-process layout of
:mod:`rllm_trainer_backend_torch.checkpoint` (``weights.safetensors``, ``trainer.pt``,
``state.json`` format 1), which any world size loads and whose ``weights.safetensors`` holds
every trainable weight for export.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from rllm_trainer_backend_torch.checkpoint_files import (
    FORMAT,
    SHARDED,
    SHARDED_FORMAT,
    STATE,
    TRAINER,
    WEIGHTS,
    CheckpointError,
    check_format,
    check_identity,
    digest,
    read_state_file,
    rng_state,
    set_rng_state,
    write_state_file,
)

__all__ = [
    "SHARDED",
    "SHARDED_FORMAT",
    "consolidate",
    "is_sharded",
    "read_full",
    "to_indexed",
    "to_named",
    "write_sharded",
]


def is_sharded(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder``'s ``state.json`` describes a sharded checkpoint."""
    state_file = Path(folder) / STATE
    if not state_file.is_file():
        return False
    state = json.loads(state_file.read_text(encoding="utf-8"))
    return state.get("layout") == SHARDED


def write_sharded(
    folder: str | os.PathLike[str],
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    identity: Mapping[str, Any],
    counters: Mapping[str, int],
    rank: int,
    world_size: int,
) -> None:
    """Write a sharded checkpoint; every rank calls it with the same ``folder`` (one that all
    ranks see)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_state_dict,
    )

    target = Path(folder)
    if rank == 0:
        target.mkdir(parents=True, exist_ok=True)
        (target / STATE).unlink(missing_ok=True)
    dist.barrier()
    # An optimizer that never stepped has no state; asking for its state dict would step it
    # once with zero gradients, and the next real step would then be its second.
    stepped = bool(optimizer.state)
    options = StateDictOptions(ignore_frozen_params=True)
    if stepped:
        model_state, optimizer_state = get_state_dict(model, optimizer, options=options)
        content = {"model": _trainable(model_state, model), "optimizer": optimizer_state}
    else:
        content = {"model": _trainable(get_model_state_dict(model, options=options), model)}
    dcp.save(content, checkpoint_id=target / SHARDED)
    if rank == 0:
        torch.save(
            {
                "scheduler": scheduler.state_dict(),
                "rng": rng_state(),
                "param_groups": optimizer.state_dict()["param_groups"],
                "parameter_names": [
                    name for name, param in model.named_parameters() if param.requires_grad
                ],
            },
            target / TRAINER,
        )
        write_state_file(
            target,
            {
                "format": SHARDED_FORMAT,
                "layout": SHARDED,
                "optimizer": stepped,
                "world_size": world_size,
                "counters": dict(counters),
                "identity": dict(identity),
                "digest": digest(identity),
            },
        )
    dist.barrier()


def load_sharded_into(
    folder: str | os.PathLike[str],
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    stepped: bool = True,
) -> None:
    """Every rank: reshard a sharded checkpoint's model and optimizer into this group's
    ``model`` and ``optimizer``, in place (``stepped``: whether the checkpoint holds optimizer
    state; without it the optimizer's state is cleared)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_state_dict,
        set_model_state_dict,
        set_state_dict,
    )

    options = StateDictOptions(ignore_frozen_params=True)
    if not stepped:
        weights = _trainable(get_model_state_dict(model, options=options), model)
        dcp.load({"model": weights}, checkpoint_id=Path(folder) / SHARDED)
        set_model_state_dict(
            model, weights, options=StateDictOptions(ignore_frozen_params=True, strict=False)
        )
        optimizer.state.clear()
        return
    model_state, optimizer_state = get_state_dict(model, optimizer, options=options)
    state = {"model": _trainable(model_state, model), "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=Path(folder) / SHARDED)
    # Not strict: the frozen base weights are not in the checkpoint (the identity matched).
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
        options=StateDictOptions(ignore_frozen_params=True, strict=False),
    )


def read_full(folder: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """A sharded checkpoint read whole in this process (no process group needed): its
    ``state.json``, the trainable weights by name, and the optimizer state keyed by parameter
    name (``{"state": {name: ...}, "param_groups": [{..., "params": [name, ...]}]}``)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    source = Path(folder)
    state = json.loads((source / STATE).read_text(encoding="utf-8"))
    if state.get("format") != SHARDED_FORMAT or state.get("layout") != SHARDED:
        raise CheckpointError(
            f"{source} is not a sharded checkpoint (state.json format {state.get('format')!r},"
            f" layout {state.get('layout')!r}); load it with load_state"
        )
    with tempfile.TemporaryDirectory() as scratch:
        whole = Path(scratch) / "whole.pt"
        dcp_to_torch_save(source / SHARDED, whole)
        loaded = torch.load(whole, map_location="cpu", weights_only=False)
    optimizer = loaded.get("optimizer")
    if optimizer is None:
        # Saved before the first step: no optimizer state, the hyperparameters from rank 0.
        trainer = torch.load(source / TRAINER, map_location="cpu", weights_only=True)
        optimizer = to_named(
            {"state": {}, "param_groups": trainer["param_groups"]}, trainer["parameter_names"]
        )
    return state, dict(loaded["model"]), optimizer


def to_indexed(named: Mapping[str, Any], order: list[str]) -> dict[str, Any]:
    """An optimizer state keyed by parameter name as ``Optimizer.state_dict()`` keys it (by
    the parameters' positions in ``order``, the optimizer's parameter order)."""
    position = {name: index for index, name in enumerate(order)}
    groups = []
    for group in named["param_groups"]:
        groups.append({**group, "params": [position[name] for name in group["params"]]})
    state = {position[name]: dict(values) for name, values in named["state"].items()}
    return {"state": state, "param_groups": groups}


def to_named(indexed: Mapping[str, Any], order: list[str]) -> dict[str, Any]:
    """The inverse of :func:`to_indexed`."""
    groups = []
    for group in indexed["param_groups"]:
        groups.append({**group, "params": [order[index] for index in group["params"]]})
    state = {order[int(index)]: dict(values) for index, values in indexed["state"].items()}
    return {"state": state, "param_groups": groups}


def consolidate(folder: str | os.PathLike[str], target: str | os.PathLike[str]) -> Path:
    """Write the sharded checkpoint in ``folder`` as a single-process checkpoint in ``target``
    (``weights.safetensors``, ``trainer.pt``, ``state.json`` format 1) and return ``target``.
    Runs in one process without a process group; ``load_state`` of a backend at any world size
    reads the result, and its ``weights.safetensors`` holds every trainable weight."""
    state, weights, optimizer = read_full(folder)
    order = [name for group in optimizer["param_groups"] for name in group["params"]]
    trainer = torch.load(Path(folder) / TRAINER, map_location="cpu", weights_only=True)
    out = Path(target)
    out.mkdir(parents=True, exist_ok=True)
    (out / STATE).unlink(missing_ok=True)
    save_file({name: tensor.contiguous() for name, tensor in weights.items()}, str(out / WEIGHTS))
    torch.save(
        {
            "optimizer": to_indexed(optimizer, order),
            "scheduler": trainer["scheduler"],
            "rng": trainer["rng"],
        },
        out / TRAINER,
    )
    write_state_file(
        out,
        {
            "format": FORMAT,
            "counters": state["counters"],
            "identity": state["identity"],
            "digest": state["digest"],
        },
    )
    return out


def read_into_group(
    folder: str | os.PathLike[str],
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    identity: Mapping[str, Any],
    names: list[str],
) -> dict[str, int]:
    """Every rank of a group: restore a sharded or single-process checkpoint into ``model``
    (sharded or replicated), ``optimizer`` (over the parameters ``names``, in order) and
    ``scheduler``, and return its counters. Raises :class:`CheckpointError` as
    :func:`~rllm_trainer_backend_torch.checkpoint.read_state` does."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_state_dict,
    )

    source = Path(folder)
    state = read_state_file(source)
    check_identity(source, state.get("identity", {}), identity)
    check_format(source, state)
    trainer = torch.load(source / TRAINER, map_location="cpu", weights_only=True)
    if state.get("layout") == SHARDED:
        stepped = state.get("optimizer", True)
        load_sharded_into(source, model=model, optimizer=optimizer, stepped=stepped)
        if not stepped:
            _set_hyperparameters(optimizer, trainer["param_groups"])
    else:
        weights = load_file(str(source / WEIGHTS))
        if sorted(weights) != sorted(names):
            raise CheckpointError(
                f"{source}/{WEIGHTS} holds {len(weights)} tensors whose names differ from the"
                f" {len(names)} parameters this backend trains; the file is damaged or from"
                " another model"
            )
        options = StateDictOptions(full_state_dict=True, strict=False)
        if trainer["optimizer"]["state"]:
            set_state_dict(
                model,
                optimizer,
                model_state_dict=weights,
                optim_state_dict=to_named(trainer["optimizer"], names),
                options=options,
            )
        else:
            set_model_state_dict(model, weights, options=options)
            optimizer.state.clear()
            _set_hyperparameters(optimizer, trainer["optimizer"]["param_groups"])
    scheduler.load_state_dict(trainer["scheduler"])
    set_rng_state(trainer["rng"])
    return {key: int(value) for key, value in state["counters"].items()}


def _trainable(state: Mapping[str, Any], model: torch.nn.Module) -> dict[str, Any]:
    """``state`` without the frozen weights ``ignore_frozen_params`` keeps: a weight tied to a
    frozen one (a LoRA model's ``lm_head`` tied to the embeddings) is listed under its own name
    although it is not trained."""
    trained = {name for name, param in model.named_parameters() if param.requires_grad}
    return {name: value for name, value in state.items() if name in trained}


def _set_hyperparameters(optimizer: torch.optim.Optimizer, groups: list[dict[str, Any]]) -> None:
    for group, saved in zip(optimizer.param_groups, groups, strict=True):
        group.update({key: value for key, value in saved.items() if key != "params"})
