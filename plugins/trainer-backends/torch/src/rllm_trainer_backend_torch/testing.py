"""Checks for tests of this backend and of code that drives it (cuts, resumes, releases)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from rllm_core.types import Datum

if TYPE_CHECKING:
    from rllm_trainer_backend_torch.backend import TorchBackend
    from rllm_trainer_backend_torch.gate import WeightGate

__all__ = ["ForwardRecorder", "assert_gate_free", "assert_same_state", "random_datums"]


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


def assert_gate_free(gate: WeightGate) -> None:
    """The trainer can take the weights: every sequence gave its shared access back."""
    entered = threading.Event()

    def take() -> None:
        with gate.exclusive():
            entered.set()

    taker = threading.Thread(target=take, daemon=True)
    taker.start()
    assert entered.wait(5), "exclusive() still waits: a sequence kept the gate"
    taker.join()


class ForwardRecorder:
    """A forward pre-hook on ``model`` that records the ``input_ids`` shape of each call made
    with keyword arguments (the sampler's), and can slow calls (``delay_s``) or fail those
    that ``fail(input_ids)`` picks. ``remove()`` takes it off."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.shapes: list[tuple[int, ...]] = []
        self.fail: Callable[[torch.Tensor], bool] = lambda ids: False
        self.delay_s = 0.0
        self.called = threading.Event()
        self._handle = model.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        ids = kwargs["input_ids"]
        self.shapes.append(tuple(ids.shape))
        self.called.set()
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.fail(ids):
            raise RuntimeError(f"injected failure on a {tuple(ids.shape)} batch")

    def remove(self) -> None:
        self._handle.remove()
