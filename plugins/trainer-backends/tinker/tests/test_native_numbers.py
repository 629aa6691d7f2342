"""The native path trains the same objective as the custom path: Tinker's kernel formulas,
written out here, summed over the datums the backend builds, have the gradient of the plan's
objective (the real loss plugins, aggregated by the plan's mode) with respect to the current
logprobs; and the native path reports the custom path's metrics."""

from __future__ import annotations

import pytest
import torch
from rllm_core.algorithms.objective import Objective
from rllm_core.types import Datum
from rllm_loss_ppo.cispo import CISPO
from rllm_loss_ppo.plugin import CISPOConfig, PPOClipConfig, ReinforceLossConfig
from rllm_loss_ppo.ppo_clip import PPOClip
from rllm_loss_ppo.reinforce import Reinforce
from rllm_trainer_backend_tinker.backend import TinkerBackend
from rllm_trainer_backend_tinker.batch import build_batch
from rllm_trainer_backend_tinker.loss import CustomLoss
from rllm_trainer_backend_tinker.native import native_datums
from rllm_trainer_backend_tinker.plugin import TinkerBackendConfig
from rllm_trainer_backend_tinker_tests_fake import FakeService

F, T = False, True
NORM_LENGTH = 6.0


def datum(
    tokens: list[int],
    actions: list[bool],
    observations: list[bool],
    sampler: list[float],
    advantages: list[float],
) -> Datum:
    return Datum(
        token_ids=tokens,
        logprobs=[s if a else 0.0 for s, a in zip(sampler, actions, strict=True)],
        advantages=advantages,
        action_mask=actions,
        observation_mask=observations,
    )


# Prompt, action, observation and action tokens; three lengths; advantages of both signs,
# varying within a datum and set on every token (only action tokens may carry them to the
# kernel). Token ids stay below the fake's vocabulary of 8.
DATUMS = [
    datum(
        [0, 1, 2, 5, 3, 6, 7],
        [F, F, T, T, T, F, T],
        [F, F, F, F, F, T, F],
        [0.0, 0.0, -0.5, -2.2, -1.0, 0.0, -0.3],
        [1.3, 1.3, 1.3, 1.3, 0.9, 0.9, 1.1],
    ),
    datum(
        [4, 5, 6, 7, 1],
        [F, T, T, T, T],
        [F] * 5,
        [0.0, -0.9, -2.9, -0.4, -1.6],
        [-0.7, -0.7, -0.7, -0.2, -1.5],
    ),
    datum(
        [2, 3, 4, 0, 1, 5, 6, 7, 2],
        [F, F, F, T, T, F, F, T, T],
        [F, F, F, F, F, T, T, F, F],
        [0.0, 0.0, 0.0, -3.1, -0.2, 0.0, 0.0, -1.2, -0.6],
        [0.4, 0.4, 0.4, 0.4, -0.8, 0.4, 0.4, 0.4, 2.0],
    ),
]

# The trainer's current logprobs of each datum's targets (tokens 1..n-1): the sampler's plus
# shifts of up to +-0.6 on action tokens, so ratios range from about 0.55 to 1.8 and some
# leave every clip range below; arbitrary values elsewhere.
SHIFTS = [
    [-1.7, 0.45, -0.5, 0.1, -2.0, -0.35],
    [0.6, -0.25, -0.6, 0.05],
    [-0.8, -1.1, 0.3, -0.55, -1.9, -2.4, 0.5, 0.15],
]


def current_logprobs() -> list[torch.Tensor]:
    rows = []
    for d, shift in zip(DATUMS, SHIFTS, strict=True):
        values = [
            s + delta if a else delta
            for s, a, delta in zip(d.logprobs[1:], d.action_mask[1:], shift, strict=True)
        ]
        rows.append(torch.tensor(values, dtype=torch.float32, requires_grad=True))
    return rows


def kernel_loss(kernel: str, config: dict[str, float] | None, datums, logprobs) -> torch.Tensor:
    """Tinker's kernels on its wire contract: r = exp(logp - sampler logprobs), summed over
    every target token of every datum."""
    total = torch.zeros(())
    for sent, logp in zip(datums, logprobs, strict=True):
        sampler = sent.loss_fn_inputs["logprobs"].to_torch()
        advantages = sent.loss_fn_inputs["advantages"].to_torch()
        ratio = torch.exp(logp - sampler)
        if kernel == "importance_sampling":
            total = total - (ratio * advantages).sum()
            continue
        clipped = ratio.clamp(config["clip_low_threshold"], config["clip_high_threshold"])
        if kernel == "ppo":
            total = total - torch.minimum(ratio * advantages, clipped * advantages).sum()
        else:
            total = total - (clipped.detach() * logp * advantages).sum()
    return total


LOSSES = {
    "ppo-clip": (lambda: PPOClip(PPOClipConfig(eps_high=0.28)), "ppo"),
    "cispo": (lambda: CISPO(CISPOConfig()), "cispo"),
    "cispo-low": (lambda: CISPO(CISPOConfig(eps_low=0.2, eps_high=0.2)), "cispo"),
    "reinforce": (lambda: Reinforce(ReinforceLossConfig()), "importance_sampling"),
}
MODES = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]


def objective(loss: str, mode: str) -> Objective:
    make, _ = LOSSES[loss]
    return Objective.of(
        make(), name=loss.removesuffix("-low"), aggregation=mode, norm_length=NORM_LENGTH
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("loss", list(LOSSES))
def test_the_kernel_has_the_gradient_of_the_objective(loss, mode):
    plan = objective(loss, mode)
    chosen = TinkerBackend(TinkerBackendConfig(), service_client=FakeService()).loss_route(plan)
    assert (chosen.path, chosen.kernel) == ("native", LOSSES[loss][1])

    custom_logprobs = current_logprobs()
    custom = CustomLoss(build_batch(DATUMS), plan)
    custom_value, metrics = custom(build_batch(DATUMS).tinker_datums, custom_logprobs)
    custom_value.backward()
    name = plan.policy.name
    if name != "reinforce":
        # The fixture exercises both sides of the clip.
        assert 0.0 < metrics[f"{name}/clip_fraction"] < 1.0

    native_logprobs = current_logprobs()
    config = dict(chosen.config) or None
    native_value = kernel_loss(chosen.kernel, config, native_datums(DATUMS, plan), native_logprobs)
    native_value.backward()

    for ours, theirs in zip(custom_logprobs, native_logprobs, strict=True):
        torch.testing.assert_close(theirs.grad, ours.grad, atol=1e-6, rtol=0.0)
    assert any(float(g.grad.abs().max()) > 1e-3 for g in native_logprobs)
    if chosen.kernel == "ppo":
        assert float(native_value.detach()) == pytest.approx(float(custom_value.detach()), abs=1e-6)
    # cispo and importance_sampling: the kernel's value is -r * A (or -sg(clip r) * A * logp
    # with the logprob itself), the loss's -sg(w) * A * logp; the values differ by
    # construction, only the gradients agree.


@pytest.mark.parametrize("loss", ["ppo-clip", "cispo", "reinforce"])
def test_both_paths_train_the_fake_model_alike_and_report_the_same_metrics(loss):
    plan = objective(loss, "seq-mean-token-mean")
    services = {path: FakeService() for path in ("custom", "auto")}
    metrics = {}
    for path, service in services.items():
        backend = TinkerBackend(TinkerBackendConfig(loss_path=path), service_client=service)
        metrics[path] = backend.forward_backward(DATUMS, plan)
    assert len(services["auto"].training.kernel_calls) == 1
    assert services["custom"].training.kernel_calls == []
    torch.testing.assert_close(
        services["auto"].training.table.grad,
        services["custom"].training.table.grad,
        atol=1e-6,
        rtol=0.0,
    )

    native, custom = metrics["auto"], metrics["custom"]
    assert (native["tinker/native"], custom["tinker/native"]) == (1.0, 0.0)
    shared = {key for key in custom if not key.startswith("tinker/")}
    assert {"loss", f"{loss}/loss", "offpolicy/k3", "offpolicy/ratio_max", "tokens"} <= shared
    if loss != "reinforce":
        assert f"{loss}/clip_fraction" in shared
        assert 0.0 < native[f"{loss}/clip_fraction"] < 1.0
    assert shared <= set(native)
    for key in shared:
        assert native[key] == pytest.approx(custom[key], abs=1e-6), key
