"""The native loss path: which objectives run in the trainer's own kernels, what a kernel
request carries, that the kernel's gradient is the custom path's, and that both paths report
the same metrics.

The fake trainer's current logprob of target ``t`` is ``-0.1 * t``; the datums' sampler
logprobs are set so that each action token has a chosen ratio ``r = pi / pi_sampler``, some
inside the clip range and some outside it on either side.
"""

from __future__ import annotations

import math

import pytest
import torch
from fake_fireworks import NATIVE_INPUTS, Done, FakeService, logprob_of
from fireworks.training.sdk import types as fw
from fireworks.training.sdk.types.loss_fn_type import LossFnType
from rllm_core.algorithms.aggregation import AGGREGATION_MODES
from rllm_core.algorithms.native_losses import NativeLossError
from rllm_core.algorithms.objective import Objective, RolloutCorrection
from rllm_core.ports import LossContext, LossOutput
from rllm_core.types import Datum
from rllm_loss_ppo.cispo import CISPO
from rllm_loss_ppo.gspo import GSPO
from rllm_loss_ppo.plugin import CISPOConfig, GSPOConfig, PPOClipConfig, ReinforceLossConfig
from rllm_loss_ppo.ppo_clip import PPOClip
from rllm_loss_ppo.reinforce import Reinforce
from rllm_trainer_backend_fireworks import backend as backend_module
from rllm_trainer_backend_fireworks.backend import FireworksBackend
from rllm_trainer_backend_fireworks.native import available_kernels
from rllm_trainer_backend_fireworks.plugin import FireworksBackendConfig

MODEL = "accounts/fireworks/models/qwen3-8b"
NORM_LENGTH = 4.0


def backend_over(service: FakeService, **config: object) -> FireworksBackend:
    return FireworksBackend(FireworksBackendConfig(model=MODEL, **config), service=service)


def datum(
    tokens: list[int],
    action: list[bool],
    ratios: dict[int, float],
    advantage: float,
    observation: list[bool] | None = None,
) -> Datum:
    """A datum whose action token at position ``p`` has ratio ``ratios[p]`` under the fake's
    current logprobs; its advantage is ``advantage`` on every token, prompt included, so the
    request shows that only action tokens keep one."""
    logprobs = [
        logprob_of(t) - math.log(ratios[p]) if action[p] else 0.0 for p, t in enumerate(tokens)
    ]
    return Datum(
        token_ids=tokens,
        logprobs=logprobs,
        advantages=[advantage] * len(tokens),
        action_mask=action,
        observation_mask=observation or [False] * len(tokens),
    )


def datums() -> list[Datum]:
    return [
        datum([5, 6, 7, 8, 9], [False, False, True, True, True], {2: 1.5, 3: 0.7, 4: 1.05}, 1.0),
        datum(
            [5, 9, 3, 4, 2, 8],
            [False, False, True, False, False, True],
            {2: 0.6, 5: 1.3},
            -2.0,
            observation=[False, False, False, True, True, False],
        ),
        datum([4, 11], [False, True], {1: 1.0}, 0.5),
    ]


def ppo(**config: object) -> Objective:
    return Objective.of(PPOClip(PPOClipConfig(**config)), name="ppo-clip")


def cispo(**options: object) -> Objective:
    return Objective.of(CISPO(CISPOConfig()), name="cispo", **options)


def reinforce(**config: object) -> Objective:
    return Objective.of(Reinforce(ReinforceLossConfig(**config)), name="reinforce")


class MeanLogprob:
    name = "mean-lp"

    def __call__(self, ctx: LossContext) -> LossOutput:
        return LossOutput(loss=ctx.aggregate(ctx.logprobs, ctx.action_mask))


# ---------------------------------------------------------------- routing


def test_the_available_kernels_are_the_mapped_ones_the_sdk_lists() -> None:
    assert available_kernels() == {"importance_sampling", "ppo", "cispo"}
    assert available_kernels() <= set(LossFnType.__args__)


@pytest.mark.parametrize(
    ("objective", "kernel"),
    [(ppo(), "ppo"), (cispo(), "cispo"), (reinforce(), "importance_sampling")],
)
def test_auto_runs_natively_when_the_loss_has_a_kernel(objective: Objective, kernel: str) -> None:
    service = FakeService()
    backend = backend_over(service)
    route = backend.loss_route(objective)
    assert (route.path, route.kernel, route.requested) == ("native", kernel, "auto")
    assert backend.loss_route(objective) is route
    metrics = backend.forward_backward(datums(), objective)
    assert [(name, len(sent)) for sent, name, _ in service.training.native] == [(kernel, 3)]
    assert service.training.custom_calls == 0
    assert metrics["fireworks/native"] == 1.0
    assert metrics["fireworks/loss:sum"] == 2.5


@pytest.mark.parametrize(
    ("objective", "reason"),
    [
        (Objective.of(GSPO(GSPOConfig()), name="gspo"), "loss 'gspo'"),
        (reinforce(ratio_cap=2.0), "ratio_cap"),
        (ppo(dual_clip_c=3.0), "dual_clip_c"),
        (Objective.of(PPOClip(PPOClipConfig()), [(MeanLogprob(), 0.1)]), "'mean-lp'"),
        (cispo(correction=RolloutCorrection(tis_cap=2.0)), "tis_cap"),
    ],
)
def test_auto_runs_on_the_custom_path_otherwise(objective: Objective, reason: str) -> None:
    service = FakeService()
    backend = backend_over(service)
    route = backend.loss_route(objective)
    assert route.path == "custom" and reason in route.reason
    assert "custom (fireworks forward_backward_custom)" in route.line()
    metrics = backend.forward_backward(datums(), objective)
    assert service.training.native == [] and service.training.custom_calls == 1
    assert metrics["fireworks/native"] == 0.0


def test_an_auxiliary_loss_with_coefficient_0_stays_native() -> None:
    objective = Objective.of(PPOClip(PPOClipConfig()), [(MeanLogprob(), 0.0)])
    assert backend_over(FakeService()).loss_route(objective).path == "native"


def test_loss_path_custom_forces_the_custom_path() -> None:
    service = FakeService()
    backend = backend_over(service, loss_path="custom")
    route = backend.loss_route(ppo())
    assert route.path == "custom" and "forced by loss_path = 'custom'" in route.reason
    backend.forward_backward(datums(), ppo())
    assert service.training.native == [] and service.training.custom_calls == 1


def test_loss_path_native_refuses_an_objective_without_a_kernel() -> None:
    service = FakeService()
    backend = backend_over(service, loss_path="native")
    assert backend.loss_route(ppo()).path == "native"
    gspo = Objective.of(GSPO(GSPOConfig()), name="gspo")
    with pytest.raises(NativeLossError, match=r"cannot run this objective.*loss 'gspo'"):
        backend.loss_route(gspo)
    with pytest.raises(NativeLossError, match="ratio_cap has no parameter"):
        backend.forward_backward(datums(), reinforce(ratio_cap=2.0))
    assert service.training.native == [] and service.training.custom_calls == 0


def test_a_kernel_the_installed_sdk_does_not_list_runs_custom(monkeypatch) -> None:
    monkeypatch.setattr(backend_module, "available_kernels", lambda: frozenset({"ppo"}))
    route = backend_over(FakeService()).loss_route(cispo())
    assert route.path == "custom"
    assert "'cispo' kernel, which the installed fireworks SDK does not list" in route.reason


def test_the_start_up_line_names_the_kernel_and_its_parameters() -> None:
    line = backend_over(FakeService()).loss_route(ppo(eps_high=0.28)).line()
    assert line.startswith(
        "loss path: native (fireworks 'ppo', clip_low_threshold=0.8, clip_high_threshold=1.28),"
        " loss_path = 'auto'"
    )


# ---------------------------------------------------------------- what a request carries


def test_the_request_carries_the_kernel_its_thresholds_and_weighted_advantages() -> None:
    service = FakeService()
    objective = ppo(eps_low=0.1, eps_high=0.28)
    backend_over(service).forward_backward(datums(), objective)
    [(sent, loss_fn, config)] = service.training.native
    assert loss_fn == "ppo"
    assert config == {"clip_low_threshold": 1.0 - 0.1, "clip_high_threshold": 1.0 + 0.28}
    weight = 1 / 6  # token-mean over the call's 6 action tokens
    for original, item in zip(datums(), sent, strict=True):
        assert set(item.loss_fn_inputs) == NATIVE_INPUTS
        assert item.model_input.to_ints() == original.token_ids[:-1]
        assert item.loss_fn_inputs["target_tokens"].tolist() == original.token_ids[1:]
        assert item.loss_fn_inputs["logprobs"].tolist() == pytest.approx(original.logprobs[1:])
        expected = [
            a * weight if m else 0.0
            for a, m in zip(original.advantages[1:], original.action_mask[1:], strict=True)
        ]
        assert item.loss_fn_inputs["advantages"].tolist() == pytest.approx(expected)


def test_importance_sampling_sends_no_config() -> None:
    service = FakeService()
    backend_over(service).forward_backward(datums(), reinforce())
    assert [(name, config) for _, name, config in service.training.native] == [
        ("importance_sampling", None)
    ]


# ---------------------------------------------------------------- same numbers


def kernel_loss(
    kernel: str,
    config: dict[str, float] | None,
    logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    advantages: torch.Tensor,
) -> torch.Tensor:
    """The trainer's kernels on one datum, as the services document them: summed over every
    token, with ``r = exp(logp - sampler_logprobs)``."""
    ratio = torch.exp(logprobs - sampler_logprobs)
    if kernel == "importance_sampling":
        return -(ratio * advantages).sum()
    assert config is not None
    clipped = ratio.clamp(config["clip_low_threshold"], config["clip_high_threshold"])
    if kernel == "ppo":
        return -torch.minimum(ratio * advantages, clipped * advantages).sum()
    assert kernel == "cispo"
    return -(clipped.detach() * logprobs * advantages).sum()


def kernel_gradients(service: FakeService) -> list[list[float]]:
    """The gradient of the recorded request's kernel loss w.r.t. each datum's target
    logprobs, at the fake's current logprobs."""
    [(sent, kernel, config)] = service.training.native
    grads = []
    for item in sent:
        targets = item.loss_fn_inputs["target_tokens"].tolist()
        logprobs = torch.tensor([logprob_of(t) for t in targets], requires_grad=True)
        loss = kernel_loss(
            kernel,
            config,
            logprobs,
            torch.tensor(item.loss_fn_inputs["logprobs"].tolist()),
            torch.tensor(item.loss_fn_inputs["advantages"].tolist()),
        )
        loss.backward()
        assert logprobs.grad is not None
        grads.append(logprobs.grad.tolist())
    return grads


LOSSES = {
    "ppo-clip": lambda: PPOClip(PPOClipConfig()),
    "ppo-clip-higher": lambda: PPOClip(PPOClipConfig(eps_low=0.1, eps_high=0.28)),
    "cispo": lambda: CISPO(CISPOConfig()),
    "reinforce": lambda: Reinforce(ReinforceLossConfig()),
}


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_the_kernel_gradient_is_the_custom_path_gradient(loss: str, mode: str) -> None:
    def objective() -> Objective:
        return Objective.of(LOSSES[loss](), name=loss, aggregation=mode, norm_length=NORM_LENGTH)

    native, custom = FakeService(), FakeService()
    backend_over(native).forward_backward(datums(), objective())
    backend_over(custom, loss_path="custom").forward_backward(datums(), objective())
    custom_grads = [[-w for w in row] for row in custom.training.sent_weights[0]]
    native_grads = kernel_gradients(native)
    assert any(any(abs(g) > 1e-3 for g in row) for row in custom_grads)
    for got, want in zip(native_grads, custom_grads, strict=True):
        assert got == pytest.approx(want, abs=1e-6)


def test_clipping_reaches_both_sides_of_the_range() -> None:
    """The datums exercise the clip: ppo's kernel gives zero gradient to the tokens whose
    ratio left the range in the advantage's favour and a nonzero one to the others."""
    service = FakeService()
    backend_over(service).forward_backward(datums(), ppo())
    first, second, third = kernel_gradients(service)
    assert first[1] == 0.0 and first[2] != 0.0 and first[3] != 0.0  # r = 1.5 clipped, A > 0
    assert second[1] == 0.0 and second[4] != 0.0  # r = 0.6 clipped, A < 0; r = 1.3 is not
    assert third[0] != 0.0


@pytest.mark.parametrize("objective", [ppo(), cispo(), reinforce()], ids=["ppo", "cispo", "is"])
def test_both_paths_report_the_same_metrics(objective: Objective) -> None:
    native = backend_over(FakeService()).forward_backward(datums(), objective)
    custom = backend_over(FakeService(), loss_path="custom").forward_backward(datums(), objective)
    ours = {key for key in custom if not key.startswith("fireworks/")}
    assert ours == {key for key in native if not key.startswith("fireworks/")}
    assert {"loss", "offpolicy/k3", "tokens", "sequences"} <= ours
    assert any(key.endswith("/ratio_mean") for key in ours)
    for key in ours:
        assert native[key] == pytest.approx(custom[key], rel=1e-6, abs=1e-7), key
    assert (native["fireworks/native"], custom["fireworks/native"]) == (1.0, 0.0)


def test_ppo_clip_fraction_is_reported_on_the_native_path() -> None:
    metrics = backend_over(FakeService()).forward_backward(datums(), ppo())
    # 2 of 6 action tokens are clipped in the advantage's favour (r = 1.5 with A > 0,
    # r = 0.6 with A < 0).
    assert metrics["ppo-clip/clip_fraction"] == pytest.approx(2 / 6)


def test_a_kernel_answer_without_logprobs_names_the_way_out(monkeypatch) -> None:
    service = FakeService()
    answer = Done(
        fw.ForwardBackwardOutput(
            loss_fn_output_type="ArrayRecord", loss_fn_outputs=[{}, {}, {}], metrics={}
        )
    )
    monkeypatch.setattr(service.training, "forward_backward", lambda *args: answer)
    with pytest.raises(RuntimeError, match=r"datum 0 has no logprobs.*loss_path = 'custom'"):
        backend_over(service).forward_backward(datums(), ppo())
