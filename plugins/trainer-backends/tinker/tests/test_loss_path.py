"""Which path an objective trains on (Tinker's kernel or the client-side loss), and what the
native request carries."""

from __future__ import annotations

from typing import Literal

import pytest
import tinker
from reference.service_faults import DATUMS as ONE_DATUM
from rllm_core.algorithms.native_losses import NativeLossError
from rllm_core.algorithms.objective import Objective, RolloutCorrection
from rllm_core.ports import LossOutput
from rllm_loss_ppo.cispo import CISPO
from rllm_loss_ppo.gspo import GSPO
from rllm_loss_ppo.plugin import CISPOConfig, GSPOConfig, PPOClipConfig, ReinforceLossConfig
from rllm_loss_ppo.ppo_clip import PPOClip
from rllm_loss_ppo.reinforce import Reinforce
from rllm_trainer_backend_tinker.backend import TinkerBackend
from rllm_trainer_backend_tinker.plugin import TinkerBackendConfig
from rllm_trainer_backend_tinker_tests_fake import CHAIN_DATUMS as DATUMS
from rllm_trainer_backend_tinker_tests_fake import FakeService


class ObservationNll:
    name = "obs-nll"

    def __call__(self, ctx):
        return LossOutput(loss=ctx.aggregate(-ctx.logprobs, ctx.observation_mask))


def ppo(**config) -> Objective:
    return Objective.of(PPOClip(PPOClipConfig(**config)), name="ppo-clip")


def cispo(**config) -> Objective:
    return Objective.of(CISPO(CISPOConfig(**config)), name="cispo")


def reinforce(**config) -> Objective:
    return Objective.of(Reinforce(ReinforceLossConfig(**config)), name="reinforce")


def backend_over(service: FakeService, **config) -> TinkerBackend:
    return TinkerBackend(TinkerBackendConfig(**config), service_client=service)


@pytest.fixture
def service():
    return FakeService()


@pytest.mark.parametrize(
    ("objective", "kernel"),
    [(ppo(), "ppo"), (cispo(), "cispo"), (reinforce(), "importance_sampling")],
    ids=["ppo-clip", "cispo", "reinforce"],
)
def test_auto_routes_the_services_losses_to_their_kernel(service, objective, kernel):
    route = backend_over(service).loss_route(objective)
    assert (route.path, route.kernel, route.requested, route.service) == (
        "native",
        kernel,
        "auto",
        "tinker",
    )
    assert route.line().startswith(f"loss path: native (tinker {kernel!r}")


@pytest.mark.parametrize(
    ("objective", "reason"),
    [
        (Objective.of(GSPO(GSPOConfig()), name="gspo"), "'gspo'"),
        (reinforce(ratio_cap=2.0), "ratio_cap"),
        (ppo(dual_clip_c=3.0), "dual_clip_c"),
        (
            Objective.of(PPOClip(PPOClipConfig()), [(ObservationNll(), 0.1)], name="ppo-clip"),
            "auxiliary loss 'obs-nll'",
        ),
        (
            Objective.of(
                PPOClip(PPOClipConfig()), name="ppo-clip", correction=RolloutCorrection(tis_cap=2.0)
            ),
            "rollout correction tis_cap",
        ),
    ],
    ids=["gspo", "reinforce-ratio-cap", "ppo-dual-clip", "aux-loss", "tis-cap"],
)
def test_auto_keeps_what_no_kernel_computes_on_the_custom_path(service, objective, reason):
    backend = backend_over(service)
    route = backend.loss_route(objective)
    assert (route.path, route.kernel) == ("custom", None)
    assert reason in route.reason
    assert route.line().startswith("loss path: custom (tinker forward_backward_custom)")
    with pytest.raises(NativeLossError, match=reason):
        backend_over(FakeService(), loss_path="native").loss_route(objective)


def test_an_aux_loss_with_coefficient_zero_stays_native(service):
    objective = Objective.of(PPOClip(PPOClipConfig()), [(ObservationNll(), 0.0)], name="ppo-clip")
    assert backend_over(service).loss_route(objective).path == "native"


def test_custom_forces_the_custom_path(service):
    backend = backend_over(service, loss_path="custom")
    route = backend.loss_route(ppo())
    assert route.path == "custom" and "forced by loss_path = 'custom'" in route.reason
    metrics = backend.forward_backward(DATUMS, ppo())
    assert metrics["tinker/native"] == 0.0
    assert [kind for kind, _ in service.training.requests] == ["custom"]
    assert service.training.kernel_calls == []


def test_native_with_an_impossible_objective_fails_before_anything_is_sent(service):
    backend = backend_over(service, loss_path="native")
    with pytest.raises(NativeLossError, match=r"loss_path = 'native'.*'gspo'"):
        backend.forward_backward(DATUMS, Objective.of(GSPO(GSPOConfig()), name="gspo"))
    assert service.training.requests == []
    route = backend.loss_route(ppo())
    assert route.path == "native" and "forced by loss_path = 'native'" in route.reason


def test_a_kernel_the_installed_sdk_does_not_list_falls_back_to_custom(service, monkeypatch):
    monkeypatch.setattr(tinker.types, "LossFnType", Literal["cross_entropy", "ppo"])
    backend = backend_over(service)
    route = backend.loss_route(cispo())
    assert route.path == "custom"
    assert "'cispo' kernel, which the installed tinker SDK does not list" in route.reason
    assert backend.loss_route(ppo()).path == "native"


def test_the_route_is_chosen_once_per_objective(service):
    backend = backend_over(service)
    objective = ppo()
    assert backend.loss_route(objective) is backend.loss_route(objective)
    assert backend.loss_route(ppo()) is not backend.loss_route(objective)


def test_the_start_up_line_names_the_kernel_and_its_parameters(service):
    line = backend_over(service).loss_route(ppo(eps_high=0.28)).line()
    assert line == (
        "loss path: native (tinker 'ppo', clip_low_threshold=0.8, clip_high_threshold=1.28),"
        " loss_path = 'auto': loss 'ppo-clip' is the service's 'ppo' kernel"
    )


@pytest.mark.parametrize(
    ("objective", "kernel", "config"),
    [
        (
            ppo(eps_low=0.2, eps_high=0.28),
            "ppo",
            {"clip_low_threshold": 1 - 0.2, "clip_high_threshold": 1 + 0.28},
        ),
        (
            cispo(eps_low=0.5, eps_high=0.3),
            "cispo",
            {"clip_low_threshold": 1 - 0.5, "clip_high_threshold": 1 + 0.3},
        ),
        (reinforce(), "importance_sampling", None),
    ],
    ids=["ppo-clip", "cispo", "reinforce"],
)
def test_the_native_request_carries_the_kernel_and_the_losss_own_parameters(
    service, objective, kernel, config
):
    metrics = backend_over(service).forward_backward(DATUMS, objective)
    ((loss_fn, sent, loss_fn_config),) = service.training.kernel_calls
    assert (loss_fn, loss_fn_config) == (kernel, config)
    assert metrics["tinker/native"] == 1.0
    assert [d.model_input.to_ints() for d in sent] == [[0, 1, 2], [3, 4, 6]]
    inputs = [d.loss_fn_inputs for d in sent]
    assert [set(i) for i in inputs] == [{"target_tokens", "logprobs", "advantages"}] * 2
    assert [i["target_tokens"].tolist() for i in inputs] == [[1, 2, 5], [4, 6, 7]]
    # The sampler's logprobs of the targets; advantages times the token-mean weight 1/4 on
    # the 4 action tokens of the call, 0 on the prompt and the observation (token 6).
    assert [i["logprobs"].tolist() for i in inputs] == [
        pytest.approx([0.0, -0.5, -0.7]),
        pytest.approx([-0.1, 0.0, -0.2]),
    ]
    assert [i["advantages"].tolist() for i in inputs] == [[0.0, 0.25, 0.25], [-0.25, 0.0, -0.25]]


def test_the_advantages_carry_the_per_sequence_weights(service):
    objective = Objective.of(
        PPOClip(PPOClipConfig()), name="ppo-clip", aggregation="seq-mean-token-mean"
    )
    backend_over(service).forward_backward(DATUMS + ONE_DATUM, objective)
    ((_, sent, _),) = service.training.kernel_calls
    # 3 sequences, 2 action tokens each: weight 1 / (2 * 3).
    sixth = 1.0 / 6.0
    assert [d.loss_fn_inputs["advantages"].tolist() for d in sent] == [
        pytest.approx([0.0, sixth, sixth]),
        pytest.approx([-sixth, 0.0, -sixth]),
        pytest.approx([sixth, sixth]),
    ]
