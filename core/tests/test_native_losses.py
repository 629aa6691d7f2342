"""The managed services' native loss kernels as the kit sees them: the aggregation folded into
per-token weights (equal to the objective's aggregate in every mode, however the call is split
into micro-batches), the route between the native and the custom path with its reasons, the
kernel's own validation, and how a route is shown and recorded."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from rllm_core.algorithms.aggregation import (  # noqa: E402
    AGGREGATION_MODES,
    StepAggregate,
    step_normalizers,
)
from rllm_core.algorithms.native_losses import (  # noqa: E402
    LOSS_PATH_FILE,
    NATIVE_KERNELS,
    LossRoute,
    NativeLoss,
    NativeLossError,
    NativeLossSettings,
    aggregation_weights,
    native_form,
    route,
    route_objective,
)
from rllm_core.algorithms.objective import Objective, RolloutCorrection, Term  # noqa: E402

ALL = NATIVE_KERNELS
NORM = 7.0


# ------------------------------------------------------------------ aggregation weights


def random_call(rng: random.Random) -> tuple[list[list[bool]], list[list[float]]]:
    """Datums of random lengths, some without an action token, with random values."""
    masks, values = [], []
    for _ in range(rng.randint(1, 6)):
        length = rng.randint(1, 12)
        none = rng.random() < 0.2
        masks.append([not none and rng.random() < 0.6 for _ in range(length)])
        values.append([rng.uniform(-3.0, 3.0) for _ in range(length)])
    return masks, values


def padded(rows: list[list[Any]], fill: Any) -> list[list[Any]]:
    width = max(len(row) for row in rows)
    return [row + [fill] * (width - len(row)) for row in rows]


def aggregate(mode: str, masks: list[list[bool]], values: list[list[float]], split: int) -> float:
    """The objective's aggregate of the call, reduced micro-batch by micro-batch with the
    normalizers of the whole call, as a trainer does."""
    chunks = [(masks[i : i + split], values[i : i + split]) for i in range(0, len(masks), split)]
    tensors = [
        (
            torch.tensor(padded(m, False), dtype=torch.float64),
            torch.tensor(padded(v, 0.0), dtype=torch.float64),
        )
        for m, v in chunks
    ]
    tokens, sequences = step_normalizers([mask for mask, _ in tensors])
    reduce = StepAggregate(mode, tokens, sequences, NORM if mode.endswith("-norm") else None)
    return float(sum(reduce(value, mask) for mask, value in tensors))


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
@pytest.mark.parametrize("seed", range(25))
def test_the_weights_reproduce_the_aggregate_of_every_mode(mode, seed):
    rng = random.Random(seed)
    masks, values = random_call(rng)
    weights = aggregation_weights(mode, masks, norm_length=NORM)
    assert [len(w) for w in weights] == [len(m) for m in masks]
    for row, mask in zip(weights, masks, strict=True):
        assert all(w > 0 if m else w == 0.0 for w, m in zip(row, mask, strict=True))
    folded = sum(
        w * v
        for row, value in zip(weights, values, strict=True)
        for w, v in zip(row, value, strict=True)
    )
    for split in (1, 2, len(masks)):
        assert folded == pytest.approx(aggregate(mode, masks, values, split), abs=1e-6)


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_a_call_without_action_tokens_weighs_nothing(mode):
    masks = [[False, False], [False]]
    assert aggregation_weights(mode, masks, norm_length=NORM) == [[0.0, 0.0], [0.0]]
    assert aggregate(mode, masks, [[1.0, 2.0], [3.0]], 2) == 0.0


def test_hand_computed_weights():
    masks = [[False, True, True], [True, True, True, True], [False]]
    assert aggregation_weights("token-mean", masks) == [
        [0.0, 1 / 6, 1 / 6],
        [1 / 6] * 4,
        [0.0],
    ]
    assert aggregation_weights("seq-mean-token-mean", masks) == [
        [0.0, 1 / 4, 1 / 4],
        [1 / 8] * 4,
        [0.0],
    ]
    assert aggregation_weights("seq-mean-token-sum", masks)[1] == [1 / 2] * 4
    assert aggregation_weights("seq-mean-token-sum-norm", masks, norm_length=4.0)[1] == [1 / 8] * 4


def test_bad_modes_are_refused():
    with pytest.raises(ValueError, match="unknown aggregation mode 'mean'; valid: token-mean"):
        aggregation_weights("mean", [[True]])
    with pytest.raises(ValueError, match="'seq-mean-token-sum-norm' needs norm_length"):
        aggregation_weights("seq-mean-token-sum-norm", [[True]])


# ------------------------------------------------------------------ NativeLoss


def test_native_loss_configs():
    assert NativeLoss("ppo", 0.8, 1.28).loss_fn_config() == {
        "clip_low_threshold": 0.8,
        "clip_high_threshold": 1.28,
    }
    assert NativeLoss("cispo", 0.0, 1.28).loss_fn_config()["clip_low_threshold"] == 0.0
    assert NativeLoss("importance_sampling").loss_fn_config() == {}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("gspo",), "unknown native kernel 'gspo'; known: importance_sampling, ppo, cispo"),
        (("ppo",), "the 'ppo' kernel needs ratio_low and ratio_high"),
        (("cispo", 0.8), "the 'cispo' kernel needs ratio_low and ratio_high"),
        (("importance_sampling", 0.8, 1.2), "'importance_sampling' kernel has no ratio bounds"),
        (("ppo", 1.1, 1.2), r"ratio bounds \[1.1, 1.2\] must satisfy 0 <= low <= 1 <= high"),
        (("ppo", 0.8, 0.9), r"ratio bounds \[0.8, 0.9\]"),
        (("ppo", -0.1, 1.2), r"ratio bounds \[-0.1, 1.2\]"),
        (("ppo", 0.8, float("inf")), r"ratio bounds \[0.8, inf\]"),
    ],
)
def test_native_loss_refuses_what_no_kernel_computes(args, message):
    with pytest.raises(ValueError, match=message):
        NativeLoss(*args)


def test_the_loss_path_setting():
    assert NativeLossSettings().loss_path == "auto"
    assert NativeLossSettings(loss_path="native").loss_path == "native"
    with pytest.raises(ValueError, match="loss_path"):
        NativeLossSettings(loss_path="fused")


# ------------------------------------------------------------------ route


@dataclass
class Clipped:
    """A loss config with the ``ppo`` kernel (none with ``dual``)."""

    low: float = 0.2
    high: float = 0.28
    dual: bool = False

    def native_loss(self) -> NativeLoss | str:
        if self.dual:
            return "the dual clip has no parameter in the 'ppo' kernel"
        return NativeLoss("ppo", 1 - self.low, 1 + self.high)


class Weighted:
    def native_loss(self) -> NativeLoss:
        return NativeLoss("cispo", 0.0, 1.28)


class Plain:
    """A loss config without a server-side form."""


class Wrong:
    def native_loss(self) -> dict:
        return {"kernel": "ppo"}


def decide(**options: Any) -> LossRoute:
    arguments: dict[str, Any] = {
        "service": "svc",
        "available": ALL,
        "requested": "auto",
        "loss_name": "ppo-clip",
        "loss_config": Clipped(),
    }
    return route(**(arguments | options))


def test_a_plain_policy_loss_with_a_listed_kernel_runs_natively():
    chosen = decide()
    assert (chosen.path, chosen.kernel, chosen.service, chosen.loss) == (
        "native",
        "ppo",
        "svc",
        "ppo-clip",
    )
    assert chosen.config == {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28}
    assert chosen.reason == "loss 'ppo-clip' is the service's 'ppo' kernel"
    forced = decide(requested="native")
    assert forced.path == "native" and forced.requested == "native"
    assert forced.reason.endswith("(forced by loss_path = 'native')")


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        (
            {"aux_losses": ["echo", "kl"]},
            "auxiliary loss 'echo', 'kl' has no server-side kernel (a service kernel computes"
            " the policy loss alone)",
        ),
        (
            {"corrections": ["tis_cap"]},
            "rollout correction tis_cap weighs tokens by the current policy's ratio",
        ),
        ({"corrections": ["mask_low/mask_high"]}, "rollout correction mask_low/mask_high"),
        (
            {"proximal": "recompute"},
            "proximal = 'recompute'; the service's kernels take the sampler's logprobs as the"
            " ratio's denominator",
        ),
        ({"loss_config": Plain(), "loss_name": "dppo-tv"}, "loss 'dppo-tv' declares no"),
        ({"loss_config": None}, "loss 'ppo-clip' declares no server-side form"),
        (
            {"loss_config": Clipped(dual=True)},
            "loss 'ppo-clip': the dual clip has no parameter in the 'ppo' kernel",
        ),
        (
            {"loss_config": Weighted(), "loss_name": "cispo", "available": ("ppo",)},
            "loss 'cispo' runs as the 'cispo' kernel, which the installed svc SDK does not"
            " list (it lists ppo)",
        ),
        ({"available": ()}, "which the installed svc SDK does not list (it lists none)"),
    ],
)
def test_what_keeps_an_objective_on_the_custom_path_and_why(options, reason):
    chosen = decide(**options)
    assert chosen.path == "custom" and chosen.kernel is None and chosen.config == {}
    assert reason in chosen.reason
    with pytest.raises(NativeLossError) as caught:
        decide(requested="native", **options)
    assert str(caught.value).startswith(
        "loss_path = 'native', but svc cannot run this objective in its own kernel: "
    )
    assert reason in str(caught.value)


def test_the_first_reason_is_the_one_given():
    chosen = decide(aux_losses=["echo"], corrections=["tis_cap"], proximal="recompute")
    assert chosen.reason.startswith("auxiliary loss 'echo'")


def test_custom_is_forced_whatever_the_objective():
    chosen = decide(requested="custom")
    assert (chosen.path, chosen.requested) == ("custom", "custom")
    assert chosen.reason == "forced by loss_path = 'custom'"


def test_a_requested_path_outside_the_three_is_refused():
    with pytest.raises(ValueError, match="loss_path must be one of auto, native, custom, not 'x'"):
        decide(requested="x")
    with pytest.raises(NativeLossError):
        decide(requested="native", loss_config=Plain())
    assert issubclass(NativeLossError, ValueError)


def test_a_native_loss_method_returning_something_else_is_a_type_error():
    with pytest.raises(TypeError, match=r"Wrong.native_loss\(\) returned dict"):
        native_form("odd", Wrong())
    assert native_form("cispo", Weighted()) == NativeLoss("cispo", 0.0, 1.28)


class LossWithConfig:
    def __init__(self, config: Any) -> None:
        self.config = config


def test_route_objective_reads_the_built_objective():
    policy = Term("ppo-clip", LossWithConfig(Clipped()))
    plain = Objective(policy=policy)
    assert route_objective(plain, service="svc", available=ALL, requested="auto").kernel == "ppo"

    silent = Objective(policy=policy, aux=(Term("echo", object(), 0.0),))
    assert route_objective(silent, service="svc", available=ALL, requested="auto").path == (
        "native"
    )
    cases = {
        "auxiliary loss 'echo'": Objective(policy=policy, aux=(Term("echo", object(), 0.1),)),
        "rollout correction tis_cap, mask_low/mask_high": Objective(
            policy=policy,
            correction=RolloutCorrection(tis_cap=2.0, mask_low=0.5, mask_high=2.0),
        ),
        "proximal = 'recompute'": Objective(policy=policy, proximal="recompute"),
        "loss 'reinforce' declares no server-side form": Objective(
            policy=Term("reinforce", object())
        ),
    }
    for reason, objective in cases.items():
        chosen = route_objective(objective, service="svc", available=ALL, requested="auto")
        assert chosen.path == "custom" and reason in chosen.reason, (reason, chosen.reason)


# ------------------------------------------------------------------ LossRoute


def test_the_start_up_lines():
    assert decide().line() == (
        "loss path: native (svc 'ppo', clip_low_threshold=0.8, clip_high_threshold=1.28),"
        " loss_path = 'auto': loss 'ppo-clip' is the service's 'ppo' kernel"
    )
    assert decide(loss_config=Plain()).line() == (
        "loss path: custom (svc forward_backward_custom), loss_path = 'auto': loss 'ppo-clip'"
        " declares no server-side form"
    )
    unbounded = LossRoute("native", "native", "svc", "reinforce", "why", "importance_sampling")
    assert unbounded.line() == (
        "loss path: native (svc 'importance_sampling'), loss_path = 'native': why"
    )


def test_the_record_and_the_file(tmp_path):
    chosen = decide()
    record = {
        "path": "native",
        "requested": "auto",
        "service": "svc",
        "loss": "ppo-clip",
        "kernel": "ppo",
        "loss_fn_config": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28},
        "reason": "loss 'ppo-clip' is the service's 'ppo' kernel",
    }
    assert chosen.record() == record
    folder = tmp_path / "runs" / "r"
    written = chosen.write(folder)
    assert written == folder / LOSS_PATH_FILE
    assert json.loads(written.read_text()) == record
    custom = decide(requested="custom")
    custom.write(folder)
    assert json.loads(written.read_text())["kernel"] is None
    assert json.loads(written.read_text())["loss_fn_config"] == {}
