"""The objective composed once: ratio denominators, rollout corrections, off-policy
diagnostics, term names and coefficients, the mask-aware aggregate, and the step's merge of
epochs and mini-batches."""

from __future__ import annotations

import math
import pickle

import pytest
import torch
from rllm_core.algorithms.aggregation import MaskAwareAggregate, make_aggregate
from rllm_core.algorithms.objective import (
    LossInputs,
    Objective,
    RolloutCorrection,
    Term,
)
from rllm_core.ports import LossContext, LossOutput
from rllm_core.training.update import merge_pass_metrics, split_mini_batches
from rllm_core.types import Datum


class Recorder:
    """Keeps every context and reduces ``-A * logprobs`` over action tokens."""

    def __init__(self) -> None:
        self.contexts: list[LossContext] = []

    def __call__(self, ctx: LossContext) -> LossOutput:
        self.contexts.append(ctx)
        per_token = -ctx.advantages * ctx.logprobs
        return LossOutput(loss=ctx.aggregate(per_token, ctx.action_mask), metrics={"seen": 1.0})


class ObservationNll:
    def __call__(self, ctx: LossContext) -> LossOutput:
        return LossOutput(loss=ctx.aggregate(-ctx.logprobs, ctx.observation_mask))


def inputs(seed: int = 0, *, shift: float = 0.3, proximal: bool = False) -> LossInputs:
    """Two rows: action tokens at 1..3 and 1..2, observation tokens at 4 and 3..4; the sampler's
    logprobs differ from the current ones by ``shift`` on alternate tokens."""
    generator = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand((2, 6), generator=generator) * 3 - 0.1
    offsets = torch.tensor([shift, -shift, shift, -shift, shift, -shift])
    rollout = (logprobs + offsets).detach()
    action = torch.tensor([[0, 1, 1, 1, 0, 0], [0, 1, 1, 0, 0, 0]], dtype=torch.float32)
    observation = torch.tensor([[0, 0, 0, 0, 1, 0], [0, 0, 0, 1, 1, 0]], dtype=torch.float32)
    advantages = torch.tensor([[0.5] * 6, [-1.0] * 6])
    return LossInputs(
        logprobs=logprobs.requires_grad_(),
        rollout_logprobs=rollout,
        advantages=advantages,
        action_mask=action,
        observation_mask=observation,
        proximal_logprobs=(logprobs.detach() - 0.05) if proximal else None,
    )


def evaluate(objective: Objective, batch: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    step = objective.begin([batch.action_mask], [batch.observation_mask])
    total = step.evaluate(batch)
    return total, step.metrics()


# ---------------------------------------------------------------- ratio denominator


def test_rollout_proximal_puts_the_samplers_logprobs_in_old_logprobs():
    recorder = Recorder()
    batch = inputs()
    evaluate(Objective.of(recorder), batch)
    ctx = recorder.contexts[0]
    assert ctx.old_logprobs is batch.rollout_logprobs
    assert not torch.equal(ctx.old_logprobs, ctx.logprobs.detach())


def test_recompute_proximal_puts_the_trainers_logprobs_in_old_logprobs():
    recorder = Recorder()
    batch = inputs(proximal=True)
    evaluate(Objective.of(recorder, proximal="recompute"), batch)
    assert recorder.contexts[0].old_logprobs is batch.proximal_logprobs


def test_recompute_without_the_trainers_logprobs_is_an_error():
    with pytest.raises(ValueError, match="proximal_logprobs"):
        evaluate(Objective.of(Recorder(), proximal="recompute"), inputs())


def test_an_unknown_proximal_mode_is_refused():
    with pytest.raises(ValueError, match="unknown proximal mode 'behaviour'"):
        Objective.of(Recorder(), proximal="behaviour")


# ---------------------------------------------------------------- terms


def test_terms_are_named_and_weighted_and_zero_coefficients_left_out():
    echo, echo2, unused = ObservationNll(), ObservationNll(), ObservationNll()
    objective = Objective(
        policy=Term("reinforce", Recorder()),
        aux=(Term("echo", echo, 0.5), Term("echo", echo2, 0.25), Term("gone", unused, 0.0)),
    )
    assert objective.names == ["reinforce", "echo", "echo-2"]
    total, metrics = evaluate(objective, inputs())
    expected = (
        metrics["reinforce/loss"] + 0.5 * metrics["echo/loss"] + 0.25 * metrics["echo-2/loss"]
    )
    assert float(total.detach()) == pytest.approx(expected)
    assert metrics["loss"] == pytest.approx(expected)
    assert metrics["reinforce/seen"] == 1.0
    assert "gone/loss" not in metrics


def test_a_zero_coefficient_reproduces_the_policy_loss_bitwise():
    batch = inputs()
    alone, _ = evaluate(Objective.of(Recorder()), batch)
    alone.backward()
    grad_alone = batch.logprobs.grad.clone()
    batch.logprobs.grad = None
    stacked, _ = evaluate(Objective.of(Recorder(), [(ObservationNll(), 0.0)]), batch)
    stacked.backward()
    assert torch.equal(alone, stacked)
    assert torch.equal(grad_alone, batch.logprobs.grad)


@pytest.mark.parametrize("coef", [float("nan"), float("inf"), True, "0.1"])
def test_a_coefficient_that_is_not_a_finite_number_is_refused(coef):
    with pytest.raises(ValueError, match=r"aux_losses\[0\] has coefficient"):
        Objective.of(Recorder(), [(ObservationNll(), coef)])


def test_a_loss_that_is_not_a_scalar_is_named():
    class PerToken:
        name = "per-token"

        def __call__(self, ctx):
            return LossOutput(loss=ctx.logprobs)

    with pytest.raises(TypeError, match=r"loss 'per-token' returned \(2, 6\)"):
        evaluate(Objective.of(PerToken()), inputs())


# ---------------------------------------------------------------- corrections


def test_truncated_importance_sampling_weighs_action_tokens_without_gradient():
    batch = inputs(shift=0.5)
    cap = 1.2
    total, metrics = evaluate(
        Objective.of(Recorder(), correction=RolloutCorrection(tis_cap=cap)), batch
    )
    total.backward()
    action = batch.action_mask != 0
    ratio = (batch.logprobs.detach() - batch.rollout_logprobs).exp()
    weights = ratio.clamp(max=cap)
    # d/dlogprobs of sum(-A * w * logprobs) / N_tok with w held constant.
    expected = torch.where(action, -batch.advantages * weights / action.sum(), 0.0)
    torch.testing.assert_close(batch.logprobs.grad, expected)
    assert 0 < metrics["correction/tis_capped_fraction"] < 1


class SeqSumReinforce:
    """``-A * logprobs`` reduced with ``seq-mean-token-sum`` whatever the plan's mode."""

    def __call__(self, ctx: LossContext) -> LossOutput:
        per_token = -ctx.advantages * ctx.logprobs
        return LossOutput(loss=ctx.aggregate(per_token, ctx.action_mask, mode="seq-mean-token-sum"))


def test_a_loss_naming_its_mode_gets_the_steps_normalizers_and_the_correction_weights():
    correction = RolloutCorrection(tis_cap=1.2)
    named, _ = evaluate(
        Objective.of(SeqSumReinforce(), correction=correction, aggregation="token-mean"),
        inputs(shift=0.5),
    )
    plan_mode, _ = evaluate(
        Objective.of(Recorder(), correction=correction, aggregation="seq-mean-token-sum"),
        inputs(shift=0.5),
    )
    assert named.item() == plan_mode.item()
    token_mean, _ = evaluate(
        Objective.of(Recorder(), correction=correction, aggregation="token-mean"),
        inputs(shift=0.5),
    )
    assert named.item() != token_mean.item()


def test_icepop_masks_tokens_whose_ratio_leaves_the_range():
    batch = inputs(shift=0.5)
    total, metrics = evaluate(
        Objective.of(Recorder(), correction=RolloutCorrection(mask_low=0.8, mask_high=1.25)),
        batch,
    )
    total.backward()
    action = batch.action_mask != 0
    ratio = (batch.logprobs.detach() - batch.rollout_logprobs).exp()
    kept = (ratio >= 0.8) & (ratio <= 1.25)
    assert (action & ~kept).any(), "the inputs must put some action token outside the range"
    assert torch.all(batch.logprobs.grad[action & ~kept] == 0)
    assert torch.all(batch.logprobs.grad[action & kept] != 0)
    assert metrics["correction/masked_fraction"] == pytest.approx(
        float((action & ~kept).sum()) / float(action.sum())
    )


def test_corrections_leave_observation_reductions_alone():
    batch = inputs(shift=2.0)
    plain, _ = evaluate(Objective.of(ObservationNll()), batch)
    corrected, _ = evaluate(
        Objective.of(
            ObservationNll(),
            correction=RolloutCorrection(tis_cap=0.1, mask_low=0.9, mask_high=1.1),
        ),
        batch,
    )
    assert torch.equal(plain, corrected)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tis_cap": 0.0}, "tis_cap must be a finite positive"),
        ({"mask_low": 0.5}, "set both mask_low and mask_high"),
        ({"mask_low": 1.2, "mask_high": 2.0}, "must contain 1"),
    ],
)
def test_bad_corrections_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        RolloutCorrection(**options)


# ---------------------------------------------------------------- diagnostics


def test_identical_logprobs_give_zero_divergence():
    batch = inputs(shift=0.0)
    _, metrics = evaluate(Objective.of(Recorder()), batch)
    assert abs(metrics["offpolicy/k3"]) < 1e-6
    assert abs(metrics["offpolicy/k1"]) < 1e-6
    assert abs(metrics["offpolicy/chi2"]) < 1e-6
    assert metrics["offpolicy/ratio_min"] == pytest.approx(1.0)
    assert metrics["offpolicy/ratio_max"] == pytest.approx(1.0)
    assert metrics["offpolicy/trainer_ppl"] == pytest.approx(metrics["offpolicy/sampler_ppl"])


def test_a_temperature_mismatch_gives_a_positive_k3():
    generator = torch.Generator().manual_seed(7)
    logits = torch.randn((4, 12, 50), generator=generator) * 3
    tokens = torch.distributions.Categorical(logits=logits / 0.7).sample()
    sampler = torch.log_softmax(logits / 0.7, -1).gather(-1, tokens[..., None]).squeeze(-1)
    trainer = torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)
    action = torch.ones((4, 12))
    action[:, 0] = 0
    batch = LossInputs(
        logprobs=trainer.clone().requires_grad_(),
        rollout_logprobs=sampler,
        advantages=torch.ones((4, 12)),
        action_mask=action,
        observation_mask=torch.zeros((4, 12)),
    )
    _, metrics = evaluate(Objective.of(Recorder()), batch)
    mask = action != 0
    log_r = (trainer - sampler)[mask].double()
    assert metrics["offpolicy/k3"] > 0.01
    assert metrics["offpolicy/k3"] == pytest.approx(float((log_r.exp() - 1 - log_r).mean()))
    assert metrics["offpolicy/k1"] == pytest.approx(float(-log_r.mean()))
    assert metrics["offpolicy/chi2"] == pytest.approx(float((2 * log_r).exp().mean() - 1))
    assert metrics["offpolicy/ratio_min"] == pytest.approx(float(log_r.exp().min()))
    assert metrics["offpolicy/trainer_ppl"] == pytest.approx(
        math.exp(-float(trainer[mask].double().mean()))
    )
    assert metrics["offpolicy/sampler_ppl"] == pytest.approx(
        math.exp(-float(sampler[mask].double().mean()))
    )


def test_diagnostics_use_the_recomputed_policy_when_there_is_one():
    batch = inputs(shift=0.0, proximal=True)
    _, metrics = evaluate(Objective.of(Recorder(), proximal="recompute"), batch)
    # proximal = current - 0.05 and rollout = current: log r = -0.05 on every action token.
    assert metrics["offpolicy/k1"] == pytest.approx(0.05, abs=1e-6)
    assert metrics["offpolicy/ratio_mean"] == pytest.approx(math.exp(-0.05), abs=1e-6)


def test_micro_batches_give_the_metrics_of_the_whole_call():
    batch = inputs(shift=0.4)
    objective = Objective.of(Recorder())
    whole_total, whole = evaluate(objective, batch)
    step = objective.begin([batch.action_mask], [batch.observation_mask])
    parts = []
    for rows in (slice(0, 1), slice(1, 2)):
        parts.append(
            step.evaluate(
                LossInputs(
                    logprobs=batch.logprobs[rows],
                    rollout_logprobs=batch.rollout_logprobs[rows],
                    advantages=batch.advantages[rows],
                    action_mask=batch.action_mask[rows],
                    observation_mask=batch.observation_mask[rows],
                )
            )
        )
    split = step.metrics()
    assert float(sum(parts)) == pytest.approx(float(whole_total))
    for key in whole:
        if key.startswith("offpolicy/") or key.endswith("tokens") or key == "loss":
            assert split[key] == pytest.approx(whole[key]), key


def test_partials_of_several_steps_merge_into_the_metrics_of_one():
    batch = inputs(shift=0.4)
    objective = Objective.of(
        Recorder(),
        [(ObservationNll(), 0.5)],
        correction=RolloutCorrection(tis_cap=1.2, mask_low=0.5, mask_high=1.4),
    )
    masks = ([batch.action_mask], [batch.observation_mask])
    single = objective.begin(*masks)
    for rows in (slice(0, 1), slice(1, 2)):
        single.evaluate(rows_of(batch, rows))
    expected = single.metrics()
    # Two processes, one micro-batch each, both counting the whole call's normalizers.
    steps = [objective.begin(*masks), objective.begin(*masks)]
    for step, rows in zip(steps, (slice(0, 1), slice(1, 2)), strict=True):
        step.evaluate(rows_of(batch, rows))
    partials = [pickle.loads(pickle.dumps(step.partial())) for step in steps]
    merged = objective.begin(*masks)
    merged.merge(partials)
    assert merged.metrics() == pytest.approx(expected, rel=1e-12)
    assert merged.metrics().keys() == expected.keys()
    assert steps[0].metrics() != pytest.approx(expected)


def test_merging_a_step_without_micro_batches_changes_nothing():
    batch = inputs(shift=0.2)
    objective = Objective.of(Recorder())
    masks = ([batch.action_mask], [batch.observation_mask])
    busy, idle = objective.begin(*masks), objective.begin(*masks)
    busy.evaluate(batch)
    expected = busy.metrics()
    busy.merge([busy.partial(), idle.partial()])
    assert busy.metrics() == expected


def rows_of(batch: LossInputs, rows: slice) -> LossInputs:
    return LossInputs(
        logprobs=batch.logprobs[rows],
        rollout_logprobs=batch.rollout_logprobs[rows],
        advantages=batch.advantages[rows],
        action_mask=batch.action_mask[rows],
        observation_mask=batch.observation_mask[rows],
    )


# ---------------------------------------------------------------- aggregate


def test_the_aggregate_picks_the_normalizers_of_the_mask_it_is_given():
    action = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    observation = torch.tensor([[0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 1.0]])
    aggregate = MaskAwareAggregate(
        action=make_aggregate("token-mean", total_tokens=3, total_sequences=2),
        observation=make_aggregate("token-mean", total_tokens=4, total_sequences=2),
        action_mask=action,
        observation_mask=observation,
    )
    values = torch.arange(8.0).reshape(2, 4)
    # action tokens 1 + 2 + 5 = 8 over the action total 3; observation tokens 3 + 6 + 7 = 16
    # over the observation total 4, also for a copy selecting the same tokens
    assert aggregate(values, action).item() == pytest.approx(8 / 3)
    assert aggregate(values, observation).item() == pytest.approx(4.0)
    assert aggregate(values, observation.clone()).item() == pytest.approx(4.0)
    assert aggregate.is_observation(observation.clone())
    assert not aggregate.is_observation(action * observation)


# ---------------------------------------------------------------- epochs and mini-batches


def datum(n: int) -> Datum:
    return Datum(
        token_ids=[n, n],
        logprobs=[0.0, 0.0],
        advantages=[0.0, 0.0],
        action_mask=[False, True],
        observation_mask=[False, False],
    )


def test_mini_batches_are_contiguous_and_balanced():
    datums = [datum(i) for i in range(7)]
    slices = split_mini_batches(datums, 3)
    assert [[d.token_ids[0] for d in s] for s in slices] == [[0, 1, 2], [3, 4], [5, 6]]
    assert split_mini_batches(datums[:2], 5) == [[datums[0]], [datums[1]]]


def test_pass_metrics_take_diagnostics_from_the_first_epoch():
    passes = [
        (
            0,
            {"loss": 1.0, "action_tokens": 10, "offpolicy/k3": 0.0, "x/ratio_max": 1.5},
            {"step": 1},
        ),
        (
            0,
            {"loss": 3.0, "action_tokens": 30, "offpolicy/k3": 0.4, "x/ratio_max": 1.1},
            {"step": 2},
        ),
        (
            1,
            {"loss": 5.0, "action_tokens": 10, "offpolicy/k3": 9.0, "x/ratio_max": 4.0},
            {"step": 3},
        ),
    ]
    merged = merge_pass_metrics(passes)
    assert merged["offpolicy/k3"] == pytest.approx(0.3)
    assert merged["action_tokens"] == 40
    assert merged["loss"] == pytest.approx((10 + 90 + 50) / 50)
    assert merged["x/ratio_max"] == 4.0
    assert merged["step"] == 3
    assert merged["optimizer_steps"] == 3
