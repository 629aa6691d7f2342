"""The KL to the reference model and the entropy bonus: estimators and entropy against verl's
formulas (``core_algos.kl_penalty``, ``torch_functional.entropy_from_logits``, restated here
in plain torch), each term's gradient against hand-computed values, invariance to micro-batch
splitting, a coefficient of 0 leaving the objective bitwise unchanged, the reward placement,
the step's calls and ``plan check``'s refusals."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch
from rllm_core.algorithms.objective import LossInputs, Objective
from rllm_core.algorithms.reference_kl import (
    ReferenceKL,
    entropy_from_logits,
    kl_estimate,
    penalize_advantages,
)
from rllm_core.errors import PlanError
from rllm_core.plan.schema import KL_ESTIMATORS
from rllm_core.plugins import ComponentSpec, hookimpl
from rllm_core.ports import LossContext, LossOutput
from rllm_core.run.metric_names import Reduction, pass_rule
from rllm_core.testing.suites.reference import REFERENCE_MODES, reference_inputs, verl_agg_loss
from rllm_core.training.update import build_objective, update_policy
from rllm_core.types import Datum

# ---------------------------------------------------------------- verl's formulas


def verl_kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, mode: str) -> torch.Tensor:
    """verl's ``kl_penalty`` (modes ``kl``, ``mse``, ``low_var_kl``), restated."""
    if mode == "kl":
        return logprob - ref_logprob
    if mode == "mse":
        return 0.5 * (logprob - ref_logprob).square()
    if mode == "low_var_kl":
        kl = (ref_logprob - logprob).clamp(min=-20, max=20)
        ratio = torch.exp(kl)
        return (ratio - kl - 1).clamp(min=-10, max=10)
    raise AssertionError(mode)


def verl_entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    pd = torch.nn.functional.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(pd * logits, dim=-1)


class Zero:
    """A policy loss of exactly 0 (so a test sees the regularizer alone)."""

    def __call__(self, ctx: LossContext) -> LossOutput:
        return LossOutput(loss=ctx.aggregate(ctx.logprobs * 0.0, ctx.action_mask))


class Reinforce:
    def __call__(self, ctx: LossContext) -> LossOutput:
        return LossOutput(loss=ctx.aggregate(-ctx.advantages * ctx.logprobs, ctx.action_mask))


def test_the_estimators_are_verls_kl_penalty_and_k3_its_unclamped_form():
    inputs = reference_inputs(seed=3, spread=1.5)
    logprobs, ref = inputs["logprobs"], inputs["old_logprobs"]
    # Far-apart tokens engage low-var-kl's clamps.
    logprobs = logprobs.clone()
    logprobs[0, 1], ref[0, 1] = -0.01, -25.0
    logprobs[1, 2], ref[1, 2] = -14.0, -0.5
    assert KL_ESTIMATORS == ("k1", "k2", "k3", "low-var-kl")
    for ours, theirs in (("k1", "kl"), ("k2", "mse"), ("low-var-kl", "low_var_kl")):
        torch.testing.assert_close(
            kl_estimate(logprobs, ref, ours), verl_kl_penalty(logprobs, ref, theirs)
        )
    low_var = kl_estimate(logprobs, ref, "low-var-kl")
    assert low_var.max() == 10.0, "the result clamp engaged"
    k3 = kl_estimate(logprobs, ref, "k3")
    assert k3.max() > 10.0
    near = k3 < 10
    torch.testing.assert_close(k3[near], low_var[near])
    torch.testing.assert_close(k3, (ref - logprobs).exp() - (ref - logprobs) - 1)
    assert (k3 >= 0).all()


def test_entropy_is_verls_entropy_from_logits():
    logits = torch.randn(4, 7, 50, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    logits[0, 0] *= 40  # nearly one-hot
    torch.testing.assert_close(entropy_from_logits(logits), verl_entropy_from_logits(logits))
    half = entropy_from_logits(logits.to(torch.bfloat16))
    assert half.dtype == torch.float32


@pytest.mark.parametrize("mode", REFERENCE_MODES)
@pytest.mark.parametrize("estimator", [("k1", "kl"), ("k2", "mse"), ("low-var-kl", "low_var_kl")])
def test_the_kl_term_reduces_as_verls_agg_loss(mode, estimator):
    ours, theirs = estimator
    inputs = reference_inputs(seed=1)
    ref = inputs["old_logprobs"]
    mask = inputs["action_mask"]
    objective = Objective.of(Zero(), aggregation=mode, kl=ReferenceKL(0.25, ours))
    logprobs = inputs["logprobs"].clone().requires_grad_()
    step = objective.begin([mask], [inputs["observation_mask"]])
    total = step.evaluate(_loss_inputs(inputs, logprobs, ref_logprobs=ref))
    total.backward()
    reference_logprobs = inputs["logprobs"].clone().requires_grad_()
    expected = 0.25 * verl_agg_loss(verl_kl_penalty(reference_logprobs, ref, theirs), mask, mode)
    expected.backward()
    torch.testing.assert_close(total, expected)
    torch.testing.assert_close(logprobs.grad, reference_logprobs.grad)
    assert logprobs.grad[mask > 0].abs().min() > 0
    assert logprobs.grad[mask == 0].abs().max() == 0


def test_the_kl_gradient_by_hand():
    """token-mean over 3 action tokens (position 0 is the prompt): d/d lp of coef * mean(k)."""
    lp = torch.tensor([[0.0, -0.5, -1.0, -2.0]], dtype=torch.float64)
    ref = torch.tensor([[0.0, -0.7, -0.4, -2.0]], dtype=torch.float64)
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    d = [0.2, -0.6, 0.0]  # lp - ref at the action tokens
    hand = {
        "k1": [0.5 / 3] * 3,
        "k2": [0.5 * x / 3 for x in d],
        "k3": [0.5 * (1 - math.exp(-x)) / 3 for x in d],
    }
    for estimator, grads in hand.items():
        logprobs = lp.clone().requires_grad_()
        objective = Objective.of(Zero(), kl=ReferenceKL(0.5, estimator))
        step = objective.begin([mask], [torch.zeros_like(mask)])
        step.evaluate(_inputs(logprobs, mask, ref_logprobs=ref)).backward()
        torch.testing.assert_close(logprobs.grad[0, 1:], torch.tensor(grads, dtype=torch.float64))
        assert logprobs.grad[0, 0] == 0


def test_the_entropy_bonus_gradient_by_hand():
    """-c * mean(H) over action tokens: dH/dz = -p (log p + H), so the gradient on each logit
    is c * p (log p + H) / N."""
    logits = torch.tensor(
        [[[0.0, 0.0, 0.0], [1.0, 0.0, -1.0], [2.0, 0.5, 0.1]]], dtype=torch.float64
    ).requires_grad_()
    mask = torch.tensor([[0.0, 1.0, 1.0]], dtype=torch.float64)
    objective = Objective.of(Zero(), entropy_coef=0.3)
    step = objective.begin([mask], [torch.zeros_like(mask)])
    entropy = entropy_from_logits(logits)
    lp = torch.zeros(1, 3, dtype=torch.float64, requires_grad=True)
    total = step.evaluate(_inputs(lp, mask, entropy=entropy))
    total.backward()
    p = logits.detach().softmax(-1)
    h = -(p * p.log()).sum(-1, keepdim=True)
    hand = 0.3 * p * (p.log() + h) / 2
    hand[0, 0] = 0
    torch.testing.assert_close(logits.grad, hand)
    torch.testing.assert_close(total, -0.3 * h[0, 1:].mean())
    assert step.metrics()["entropy/mean"] == pytest.approx(float(h[0, 1:].mean()))


def test_a_coefficient_of_zero_leaves_the_objective_bitwise_unchanged_and_needs_no_input():
    inputs = reference_inputs(seed=5)
    mask, observation = inputs["action_mask"], inputs["observation_mask"]
    results = []
    for objective in (
        Objective.of(Reinforce()),
        Objective.of(Reinforce(), kl=ReferenceKL(0.0, "k3"), entropy_coef=0.0),
    ):
        assert not objective.needs_reference and not objective.needs_entropy
        logprobs = inputs["logprobs"].clone().requires_grad_()
        step = objective.begin([mask], [observation])
        total = step.evaluate(_loss_inputs(inputs, logprobs))
        total.backward()
        results.append((total.detach(), logprobs.grad, step.metrics()))
    (a, ga, ma), (b, gb, mb) = results
    assert torch.equal(a, b) and torch.equal(ga, gb)
    assert ma == mb and "kl/ref_mean" not in mb and "entropy/mean" not in mb


def test_regularizers_do_not_depend_on_the_micro_batch_split():
    inputs = reference_inputs(seed=7)
    mask, observation = inputs["action_mask"], inputs["observation_mask"]
    ref = inputs["old_logprobs"]
    logits = torch.randn(*mask.shape, 5, generator=torch.Generator().manual_seed(1))
    objective = Objective.of(
        Reinforce(),
        aggregation="seq-mean-token-mean",
        kl=ReferenceKL(0.1, "low-var-kl"),
        entropy_coef=0.01,
    )

    def run(splits):
        logprobs = inputs["logprobs"].clone().requires_grad_()
        z = logits.double().clone().requires_grad_()
        step = objective.begin([mask[s] for s in splits], [observation[s] for s in splits])
        for rows in splits:
            micro = {name: value[rows] for name, value in inputs.items()}
            step.evaluate(
                _loss_inputs(
                    micro,
                    logprobs[rows],
                    ref_logprobs=ref[rows],
                    entropy=entropy_from_logits(z[rows]),
                )
            ).backward()
        return logprobs.grad, z.grad, step.metrics()

    whole_lp, whole_z, whole = run([slice(0, 8)])
    split_lp, split_z, split = run([slice(0, 3), slice(3, 8)])
    torch.testing.assert_close(whole_lp, split_lp)
    torch.testing.assert_close(whole_z, split_z)
    for name in ("kl/ref_mean", "kl/ref_max", "entropy/mean", "loss"):
        assert split[name] == pytest.approx(whole[name]), name
    selected = kl_estimate(inputs["logprobs"], ref, "low-var-kl")[mask > 0]
    assert whole["kl/ref_max"] == pytest.approx(float(selected.max()))
    assert whole["kl/ref_mean"] == pytest.approx(float(selected.mean()))


def test_missing_inputs_are_named():
    inputs = reference_inputs(seed=2)
    mask = inputs["action_mask"]
    for objective, needed in (
        (Objective.of(Zero(), kl=ReferenceKL(0.1)), "ref_logprobs"),
        (Objective.of(Zero(), entropy_coef=0.1), "entropy"),
    ):
        step = objective.begin([mask], [inputs["observation_mask"]])
        with pytest.raises(ValueError, match=needed):
            step.evaluate(_loss_inputs(inputs, inputs["logprobs"]))
    with pytest.raises(ValueError, match="entropy_coef"):
        Objective.of(Zero(), entropy_coef=-1.0)
    with pytest.raises(ValueError, match="unknown KL estimator 'k4'"):
        ReferenceKL(0.1, "k4")


def test_the_entropy_bonus_raises_a_toy_policys_entropy():
    """A four-token policy trained by REINFORCE toward token 0 collapses; with the bonus its
    entropy stays higher, and the bonus alone raises it."""
    sampled = torch.tensor([[0, 0, 1, 0, 2, 0, 0, 3]])
    advantages = torch.where(sampled == 0, 1.0, 0.0).float()
    mask = torch.ones(1, 8)
    mask[0, 0] = 0

    def train(objective: Objective, steps: int = 30) -> float:
        torch.manual_seed(0)
        logits = torch.nn.Parameter(torch.randn(4) * 0.1)
        optimizer = torch.optim.SGD([logits], lr=0.5)
        for _ in range(steps):
            z = logits.expand(1, 8, 4)
            logprobs = z.log_softmax(-1).gather(-1, sampled.unsqueeze(-1)).squeeze(-1)
            step = objective.begin([mask], [torch.zeros_like(mask)])
            total = step.evaluate(
                LossInputs(
                    logprobs=logprobs,
                    rollout_logprobs=logprobs.detach(),
                    advantages=advantages,
                    action_mask=mask,
                    observation_mask=torch.zeros_like(mask),
                    entropy=entropy_from_logits(z),
                )
            )
            optimizer.zero_grad()
            total.backward()
            optimizer.step()
        return float(entropy_from_logits(logits.detach()))

    plain = train(Objective.of(Reinforce()))
    bonus = train(Objective.of(Reinforce(), entropy_coef=2.0))
    assert plain < 0.5 < 1.2 < bonus < math.log(4), (plain, bonus)
    peaked = Objective.of(Zero(), entropy_coef=1.0)
    torch.manual_seed(0)
    z = torch.nn.Parameter(torch.tensor([3.0, 0.0, -1.0, -2.0]))
    before = float(entropy_from_logits(z.detach()))
    optimizer = torch.optim.SGD([z], lr=0.5)
    for _ in range(10):
        step = peaked.begin([mask], [torch.zeros_like(mask)])
        lp = torch.zeros(1, 8, requires_grad=True)
        total = step.evaluate(_inputs(lp, mask, entropy=entropy_from_logits(z.expand(1, 8, 4))))
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
    assert float(entropy_from_logits(z.detach())) > before + 0.3


# ---------------------------------------------------------------- in the reward


def _datum(logprobs, advantages, mask, proximal=None) -> Datum:
    n = len(logprobs)
    return Datum(
        token_ids=list(range(n)),
        logprobs=logprobs,
        advantages=advantages,
        action_mask=mask,
        observation_mask=[False] * n,
        proximal_logprobs=proximal,
    )


def test_in_the_reward_each_action_tokens_advantage_drops_by_coef_times_kl():
    datums = [
        _datum([0.0, -0.5, -1.0], [1.0, 1.0, 1.0], [False, True, True]),
        _datum([0.0, -3.0, -0.2], [-1.0, -1.0, -1.0], [False, True, False], [0.0, -2.0, -0.1]),
    ]
    refs = [[0.0, -0.7, -1.0], [0.0, -2.5, -9.0]]
    out, metrics = penalize_advantages(datums, refs, ReferenceKL(0.5, "k1", "reward"))
    assert out[0].advantages == pytest.approx([1.0, 1.0 - 0.5 * 0.2, 1.0])
    # The second datum carries recomputed logprobs: they are the policy's side of the ratio.
    assert out[1].advantages == pytest.approx([-1.0, -1.0 - 0.5 * 0.5, -1.0])
    assert metrics == pytest.approx({"kl/ref_mean": (0.2 + 0.0 + 0.5) / 3, "kl/ref_max": 0.5})
    with pytest.raises(ValueError, match="datum 0 has 3 tokens but 2 reference logprobs"):
        penalize_advantages(datums[:1], [[0.0, 0.0]], ReferenceKL(0.5, "k1", "reward"))


class ScoringTrainer:
    """Records what the step's calls received; reference logprobs are the sampler's minus
    0.1."""

    def __init__(self) -> None:
        self.ref_calls = 0
        self.seen: list[list[Datum]] = []

    def compute_ref_logprobs(self, datums):
        self.ref_calls += 1
        return [[v - 0.1 for v in d.logprobs] for d in datums]

    def forward_backward(self, datums, objective):
        self.seen.append(list(datums))
        return {"action_tokens": 1.0, "kl/ref_max": 0.0}

    def optim_step(self):
        return {}


async def _call(fn):
    return fn()


@pytest.mark.parametrize("placement", ["loss", "reward"])
def test_the_step_scores_the_reference_once_before_its_first_update(placement):
    datums = [_datum([0.0, -0.5, -1.0], [1.0] * 3, [False, True, True]) for _ in range(4)]
    trainer = ScoringTrainer()
    objective = Objective.of(Zero(), kl=ReferenceKL(0.5, "k1", placement))
    metrics = asyncio.run(
        update_policy(trainer, datums, objective, epochs=2, mini_batches=2, call=_call)
    )
    assert trainer.ref_calls == 1 and len(trainer.seen) == 4
    first = trainer.seen[0][0]
    if placement == "loss":
        assert first.ref_logprobs == pytest.approx([-0.1, -0.6, -1.1])
        assert first.advantages == [1.0] * 3
    else:
        assert first.ref_logprobs is None
        assert first.advantages == pytest.approx([1.0, 0.95, 0.95])
        assert metrics["kl/ref_mean"] == pytest.approx(0.1)
        assert metrics["kl/ref_max"] == pytest.approx(0.1)


def test_a_trainer_without_a_reference_scorer_is_refused_by_name():
    class Plain:
        pass

    objective = Objective.of(Zero(), kl=ReferenceKL(0.5))
    datums = [_datum([0.0, -0.5], [1.0, 1.0], [False, True])]
    with pytest.raises(TypeError, match="trainer Plain cannot compute"):
        asyncio.run(update_policy(Plain(), datums, objective, epochs=1, mini_batches=1, call=_call))


def test_the_metrics_pass_rules():
    assert pass_rule("kl/ref_max").reduction is Reduction.MAX
    assert pass_rule("kl/ref_mean").reduction is Reduction.MEAN
    assert pass_rule("entropy/mean").reduction is Reduction.MEAN
    assert not pass_rule("kl/ref_mean").first_epoch


# ---------------------------------------------------------------- plan check


class RegularizerTrainers:
    @hookimpl
    def rllm_trainer_backends(self):
        yield ComponentSpec(
            kind="trainer_backend", name="bare", factory=dict, summary="no reference model"
        )
        yield ComponentSpec(
            kind="trainer_backend",
            name="service",
            factory=dict,
            summary="reference in the reward only",
            traits={
                "reference_kl": ("reward",),
                "entropy_refusal": "the service returns logprobs, not logits",
            },
        )
        yield ComponentSpec(
            kind="trainer_backend",
            name="full",
            factory=dict,
            summary="everything",
            traits={"reference_kl": ("loss", "reward"), "entropy": True},
        )


@pytest.fixture
def regularizer_trainers(register_plugin):
    return register_plugin(
        RegularizerTrainers(), name="regularizer-trainers", distribution="rllm-test-regularizers"
    )


def test_plan_check_refuses_what_the_trainer_cannot_compute(plan_builder, regularizer_trainers):
    with pytest.raises(PlanError) as info:
        plan_builder.resolve(
            {"algorithm": {"kl": {"coef": 0.1}, "entropy_coef": 0.01}, "trainer": "bare"}
        )
    kl, entropy = info.value.issues
    assert kl.location == "[algorithm.kl].coef"
    assert "trainer backend 'bare' cannot compute the KL to the reference model" in str(kl)
    assert "set [algorithm.kl] coef = 0" in str(kl)
    assert entropy.location == "[algorithm].entropy_coef"
    assert "trainer backend 'bare' cannot add the entropy bonus" in str(entropy)
    with pytest.raises(PlanError) as info:
        plan_builder.resolve(
            {"algorithm": {"kl": {"coef": 0.1}, "entropy_coef": 0.01}, "trainer": "service"}
        )
    kl, entropy = info.value.issues
    assert 'in = "loss"' in str(kl) and "(it offers in = 'reward')" in str(kl)
    assert "the service returns logprobs, not logits" in str(entropy)
    resolved = plan_builder.resolve(
        {"algorithm": {"kl": {"coef": 0.1, "in": "reward"}}, "trainer": "service"}
    )
    assert resolved.plan.algorithm.kl.apply_in == "reward"
    resolved = plan_builder.resolve(
        {"algorithm": {"kl": {"coef": 0.1}, "entropy_coef": 0.01}, "trainer": "full"}
    )
    assert resolved.plan.algorithm.entropy_coef == 0.01
    objective = build_objective(resolved, Zero(), [])
    assert objective.kl == ReferenceKL(0.1, "low-var-kl", "loss")
    assert objective.entropy_coef == 0.01 and objective.needs_reference
    plan_builder.resolve({"algorithm": {"kl": {"coef": 0.0}}, "trainer": "bare"})


# ---------------------------------------------------------------- helpers


def _loss_inputs(inputs, logprobs, *, ref_logprobs=None, entropy=None) -> LossInputs:
    return LossInputs(
        logprobs=logprobs,
        rollout_logprobs=inputs["rollout_logprobs"],
        advantages=inputs["advantages"],
        action_mask=inputs["action_mask"],
        observation_mask=inputs["observation_mask"],
        ref_logprobs=ref_logprobs,
        entropy=entropy,
    )


def _inputs(logprobs, mask, *, ref_logprobs=None, entropy=None) -> LossInputs:
    return LossInputs(
        logprobs=logprobs,
        rollout_logprobs=logprobs.detach(),
        advantages=torch.zeros_like(mask),
        action_mask=mask,
        observation_mask=torch.zeros_like(mask),
        ref_logprobs=ref_logprobs,
        entropy=entropy,
    )


def test_the_installed_backends_declare_what_they_compute(installed_plugin_manager):
    """torch computes both; the hosted backends are refused, each issue saying why."""
    from types import SimpleNamespace

    from rllm_core.plan.regularizer_check import regularizer_issues
    from rllm_core.plan.schema import AlgorithmSection

    plan = SimpleNamespace(
        algorithm=AlgorithmSection(kl={"coef": 0.1, "in": "reward"}, entropy_coef=0.1)
    )
    specs = {
        record.spec.name: record.spec
        for record in installed_plugin_manager.components("trainer_backend")
    }
    assert {"torch", "tinker", "fireworks"} <= set(specs)
    for name, spec in specs.items():
        trainer = SimpleNamespace(name=name, spec=spec)
        issues = regularizer_issues(plan, {"[trainer]": trainer}, "plan.toml")
        if name == "torch":
            assert issues == []
        elif name in ("tinker", "fireworks"):
            kl, entropy = issues
            assert "asks its service for no base-model logprobs" in str(kl)
            assert "not the logits an entropy needs" in str(entropy)
