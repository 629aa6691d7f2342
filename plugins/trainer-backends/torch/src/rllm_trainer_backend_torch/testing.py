"""Checks for tests of this backend and of code that drives it (cuts, resumes, releases)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from rllm_core.types import Datum

if TYPE_CHECKING:
    from rllm_trainer_backend_torch.backend import TorchBackend

__all__ = ["assert_same_state", "random_datums"]


def random_datums(seed: int, lengths: Sequence[int], *, vocab: int) -> list[Datum]:
    """One seeded random datum per length: two prompt tokens, then alternating pairs of action
    and observation tokens. Padding-free values everywhere (advantages and logprobs are nonzero
    off the masks too), so a leak of an unmasked position into the loss would show."""
    rng = random.Random(seed)
    datums = []
    for length in lengths:
        action = [i >= 2 and i % 4 in (2, 3) for i in range(length)]
        observation = [i >= 2 and not a for i, a in enumerate(action)]
        advantage = rng.uniform(-1.0, 1.0)
        datums.append(
            Datum(
                token_ids=[rng.randrange(vocab) for _ in range(length)],
                logprobs=[-rng.uniform(0.5, 6.0) for _ in range(length)],
                advantages=[advantage] * length,
                action_mask=action,
                observation_mask=observation,
            )
        )
    return datums


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
