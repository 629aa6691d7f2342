"""Checks for tests of this backend and of code that drives it (cuts, resumes, releases)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from rllm_trainer_backend_torch.backend import TorchBackend

__all__ = ["assert_same_state"]


def assert_same_state(a: TorchBackend, b: TorchBackend) -> None:
    """Both backends hold bitwise the same trainable weights, optimizer state, learning-rate
    schedule, weight version and optimizer step count; an ``AssertionError`` names the first
    difference."""
    pa, pb = a.trainable_parameters, b.trainable_parameters
    assert pa.keys() == pb.keys()
    for name in pa:
        assert torch.equal(pa[name], pb[name]), f"parameter {name} differs"
    sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    assert sa["state"].keys() == sb["state"].keys()
    for index, state in sa["state"].items():
        for key, value in state.items():
            assert torch.equal(value, sb["state"][index][key]), f"optimizer {index}.{key} differs"
    assert a.scheduler.state_dict() == b.scheduler.state_dict()
    assert (a.weight_version, a.optimizer_steps) == (b.weight_version, b.optimizer_steps)
