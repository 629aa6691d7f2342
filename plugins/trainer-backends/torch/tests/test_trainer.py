"""The trainer half of the torch backend on a tiny random Llama: collation, logprobs, the loss
context, gradient accumulation, optimizer steps and schedules."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
import torch
from msgspec.structs import replace
from rllm_core.algorithms.objective import Objective
from rllm_core.errors import ComponentError, ModelNotFoundError, TrainingInterrupted
from rllm_core.ports import Interruptible, LossContext, LossOutput
from rllm_core.types import Datum, SampleRequest, SamplingParams
from rllm_loss_echo.loss import Echo
from rllm_loss_echo.plugin import EchoConfig
from rllm_loss_ppo.plugin import ReinforceLossConfig
from rllm_loss_ppo.reinforce import Reinforce
from rllm_trainer_backend_torch.backend import TorchBackend
from rllm_trainer_backend_torch.collate import collate
from rllm_trainer_backend_torch.logprobs import target_logprobs, token_logprobs
from rllm_trainer_backend_torch.plugin import TorchBackendConfig
from rllm_trainer_backend_torch.schedule import lr_factor
from rllm_trainer_backend_torch.testing import random_datums

VOCAB = 512


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_llama) -> Path:
    """A seeded random Llama small enough that a training step takes milliseconds."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    tiny_llama(1234, vocab_size=VOCAB, max_position_embeddings=64).save_pretrained(folder)
    return folder


def backend(folder: Path, **overrides) -> TorchBackend:
    values = {"model": str(folder), "device": "cpu", "lora": {"rank": 0}, **overrides}
    return TorchBackend(TorchBackendConfig(**values))


def make_datums(seed: int = 0, lengths: tuple[int, ...] = (7, 4, 9, 5, 6)) -> list[Datum]:
    return random_datums(seed, lengths, vocab=VOCAB)


def grads(trainer: TorchBackend) -> dict[str, torch.Tensor]:
    return {
        name: param.grad.clone()
        for name, param in trainer.trainable_parameters.items()
        if param.grad is not None
    }


class Recorder:
    """A loss that keeps each context it sees and reduces ``-logprobs`` over action tokens."""

    name = "recorder"

    def __init__(self) -> None:
        self.contexts: list[LossContext] = []

    def __call__(self, ctx: LossContext) -> LossOutput:
        self.contexts.append(ctx)
        return LossOutput(loss=ctx.aggregate(-ctx.logprobs, ctx.action_mask))


REINFORCE = Reinforce(ReinforceLossConfig())


# ---------------------------------------------------------------- collation


def test_collate_right_pads_every_field():
    datums = [
        Datum(
            token_ids=[5, 6, 7],
            logprobs=[0.0, -0.5, 0.0],
            advantages=[0.25, 0.25, 0.25],
            action_mask=[False, True, False],
            observation_mask=[False, False, True],
        ),
        Datum(
            token_ids=[9, 8],
            logprobs=[0.0, -1.5],
            advantages=[-2.0, -2.0],
            action_mask=[False, True],
            observation_mask=[False, False],
        ),
    ]
    batch = collate(datums, vocab_size=10, max_length=8)
    assert batch.token_ids.tolist() == [[5, 6, 7], [9, 8, 0]]
    assert batch.token_ids.dtype == torch.int64
    assert batch.rollout_logprobs.tolist() == [[0.0, -0.5, 0.0], [0.0, -1.5, 0.0]]
    assert batch.advantages.tolist() == [[0.25, 0.25, 0.25], [-2.0, -2.0, 0.0]]
    assert batch.action_mask.tolist() == [[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]]
    assert batch.observation_mask.tolist() == [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]
    assert batch.action_mask.dtype == torch.float32
    assert batch.lengths.tolist() == [3, 2]


def test_micro_batches_are_trimmed_to_their_longest_row():
    datums = make_datums(lengths=(3, 2, 6, 4, 5))
    batch = collate(datums, vocab_size=VOCAB, max_length=None)
    parts = list(batch.micro_batches(2))
    assert [tuple(part.token_ids.shape) for part in parts] == [(2, 3), (2, 6), (1, 5)]
    assert parts[1].token_ids[1].tolist() == [*datums[3].token_ids, 0, 0]
    assert parts[2].action_mask[0].tolist() == [float(m) for m in datums[4].action_mask]


def test_a_token_budget_ends_micro_batches_early_and_sends_a_longer_row_alone():
    batch = collate(make_datums(lengths=(3, 2, 6, 4, 5, 2)), vocab_size=VOCAB, max_length=None)
    parts = list(batch.micro_batches(4, max_tokens=5))
    assert [tuple(part.token_ids.shape) for part in parts] == [
        (1, 3),
        (1, 2),
        (1, 6),
        (1, 4),
        (1, 5),
        (1, 2),
    ]
    parts = list(batch.micro_batches(4, max_tokens=12))
    assert [tuple(part.token_ids.shape) for part in parts] == [(2, 3), (2, 6), (2, 5)]
    assert sum(part.size for part in parts) == batch.size


@pytest.mark.parametrize(
    ("datum", "message"),
    [
        (dict(token_ids=[]), "datum 1 has no tokens"),
        (dict(token_ids=[1, 2, 600]), "datum 1 holds token id 600, outside"),
        (dict(token_ids=[1, -3, 2]), "datum 1 holds token id -3"),
        (dict(token_ids=list(range(9))), "datum 1 has 9 tokens but the model's context holds 8"),
        (dict(action_mask=[True, True, False]), "datum 1 has action_mask[0] set"),
        (dict(observation_mask=[True, False, False]), "datum 1 has observation_mask[0] set"),
        (dict(advantages=[0.0, math.nan, 0.0]), "datum 1 has advantages[1] = nan"),
        (dict(logprobs=[0.0, -math.inf, 0.0]), "datum 1 has logprobs[1] = -inf"),
    ],
)
def test_collate_names_the_bad_datum(datum, message):
    good = dict(
        token_ids=[1, 2, 3],
        logprobs=[0.0, -1.0, 0.0],
        advantages=[0.0, 1.0, 0.0],
        action_mask=[False, True, False],
        observation_mask=[False, False, False],
    )
    values = {**good, **datum}
    n = len(values["token_ids"])
    for key in ("logprobs", "advantages", "action_mask", "observation_mask"):
        if len(values[key]) != n:
            values[key] = ([0.0] if key in ("logprobs", "advantages") else [False]) * n
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        collate([Datum(**good), Datum(**values)], vocab_size=VOCAB, max_length=8)


def test_non_finite_values_off_the_masks_are_accepted():
    datum = Datum(
        token_ids=[1, 2, 3],
        logprobs=[math.nan, -1.0, math.inf],
        advantages=[math.nan, 1.0, 0.0],
        action_mask=[False, True, False],
        observation_mask=[False, False, False],
    )
    batch = collate([datum], vocab_size=VOCAB, max_length=None)
    assert batch.rollout_logprobs[0, 1].item() == -1.0


def test_no_datums_is_an_error(tiny_model_dir):
    with pytest.raises(ValueError, match="got no datums"):
        backend(tiny_model_dir).forward_backward([], Objective.of(REINFORCE))


# ---------------------------------------------------------------- logprobs


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_a_direct_log_softmax(tiny_model_dir, temperature):
    trainer = backend(tiny_model_dir)
    ids = torch.tensor([[3, 17, 250, 9, 44, 2], [8, 8, 100, 511, 0, 0]])
    with torch.no_grad():
        got = token_logprobs(trainer.model, ids, temperature=temperature)
        logits = trainer.model(input_ids=ids).logits.double() / temperature
        expected = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    assert got.dtype == torch.float32
    assert got[:, 0].tolist() == [0.0, 0.0]
    torch.testing.assert_close(got[:, 1:].double(), expected, atol=1e-5, rtol=0)


def test_target_logprobs_value_and_gradient():
    generator = torch.Generator().manual_seed(0)
    logits = (torch.randn(2, 3, 7, generator=generator, dtype=torch.float64) * 4).requires_grad_()
    targets = torch.tensor([[0, 6, 3], [2, 2, 5]])
    got = target_logprobs(logits, targets)
    expected = torch.log_softmax(logits, dim=-1).gather(-1, targets[..., None])[..., 0]
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)
    upstream = torch.randn(2, 3, generator=generator, dtype=torch.float64)
    (grad,) = torch.autograd.grad(got, logits, upstream)
    (reference,) = torch.autograd.grad(expected, logits, upstream)
    torch.testing.assert_close(grad, reference, atol=1e-12, rtol=0)
    assert torch.autograd.gradcheck(target_logprobs, (logits, targets))


def test_right_padding_does_not_change_real_positions(tiny_model_dir):
    trainer = backend(tiny_model_dir)
    short = torch.tensor([[3, 17, 250, 9]])
    padded = torch.tensor([[3, 17, 250, 9, 0, 0, 0], [1, 2, 3, 4, 5, 6, 7]])
    with torch.no_grad():
        alone = token_logprobs(trainer.model, short)
        together = token_logprobs(trainer.model, padded)
    torch.testing.assert_close(together[0, :4], alone[0], atol=1e-6, rtol=0)


# ---------------------------------------------------------------- the loss context


def test_context_holds_the_micro_batch(tiny_model_dir):
    datums = make_datums()
    recorder = Recorder()
    trainer = backend(tiny_model_dir, micro_batch_size=2, logprob_temperature=0.5)
    trainer.forward_backward(datums, Objective.of(recorder))
    assert [tuple(ctx.logprobs.shape) for ctx in recorder.contexts] == [(2, 7), (2, 9), (1, 6)]
    ctx = recorder.contexts[1]
    assert ctx.logprobs.requires_grad
    assert not ctx.old_logprobs.requires_grad
    assert torch.equal(ctx.old_logprobs, ctx.rollout_logprobs)
    assert ctx.rollout_logprobs[1].tolist() == pytest.approx(datums[3].logprobs + [0.0] * 4)
    assert ctx.advantages[0, :5].tolist() == pytest.approx(datums[2].advantages[:5])
    assert ctx.action_mask[1].tolist() == [float(m) for m in datums[3].action_mask] + [0.0] * 4
    assert ctx.observation_mask[0].tolist() == [float(m) for m in datums[2].observation_mask]
    with torch.no_grad():
        direct = token_logprobs(trainer.model, ctx_ids(datums[2:4]), temperature=0.5)
    assert trainer.model.training is False
    # Logits are computed only at the positions each row trains on; the rest hold 0.
    used = (ctx.action_mask != 0) | (ctx.observation_mask != 0)
    assert torch.any(used[0] != used[1])
    torch.testing.assert_close(ctx.logprobs.detach()[used], direct[used], atol=1e-6, rtol=0)
    assert torch.all(ctx.logprobs.detach()[~used] == 0)


class ActionOnlyRecorder(Recorder):
    reads_observations = False


def test_an_objective_that_reads_no_observations_computes_action_positions_only(tiny_model_dir):
    datums = make_datums()
    results = []
    for loss in (Recorder(), ActionOnlyRecorder()):
        trainer = backend(tiny_model_dir, micro_batch_size=2)
        trainer.forward_backward(datums, Objective.of(loss))
        results.append((loss.contexts, grads(trainer)))
    (both, both_grads), (actions, action_grads) = results
    for full, part in zip(both, actions, strict=True):
        action = full.action_mask != 0
        torch.testing.assert_close(part.logprobs[action], full.logprobs[action], atol=1e-6, rtol=0)
        only_observed = (full.observation_mask != 0).any(0) & ~action.any(0)
        assert torch.all(part.logprobs.detach()[:, only_observed] == 0)
        assert torch.any(full.logprobs.detach()[:, only_observed] != 0)
    for name, grad in both_grads.items():
        torch.testing.assert_close(action_grads[name], grad, atol=1e-6, rtol=1e-5)


def test_recomputed_logprobs_are_the_ratio_denominator(tiny_model_dir):
    datums = make_datums()
    trainer = backend(tiny_model_dir, micro_batch_size=2, logprob_temperature=0.5)
    scored = trainer.compute_logprobs(datums)
    assert [len(row) for row in scored] == [len(d.token_ids) for d in datums]
    assert all(row[0] == 0.0 for row in scored)
    with torch.no_grad():
        direct = token_logprobs(trainer.model, ctx_ids(datums[:1]), temperature=0.5)
    assert scored[0] == pytest.approx(direct[0].tolist(), abs=1e-6)
    recorder = Recorder()
    batch = [replace(d, proximal_logprobs=lp) for d, lp in zip(datums, scored, strict=True)]
    trainer.forward_backward(batch, Objective.of(recorder, proximal="recompute"))
    ctx = recorder.contexts[0]
    mask = ctx.action_mask != 0
    # Before any update the recomputed policy is the current one: every ratio is 1.
    torch.testing.assert_close(
        ctx.old_logprobs[mask], ctx.logprobs.detach()[mask], atol=1e-6, rtol=0
    )
    assert not torch.equal(ctx.old_logprobs[mask], ctx.rollout_logprobs[mask])


def test_recompute_without_proximal_logprobs_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match="proximal_logprobs"):
        backend(tiny_model_dir).forward_backward(
            make_datums(), Objective.of(REINFORCE, proximal="recompute")
        )


def ctx_ids(datums: list[Datum]) -> torch.Tensor:
    return collate(datums, vocab_size=VOCAB, max_length=None).token_ids


def test_aggregate_uses_the_normalizers_of_the_mask_it_is_given(tiny_model_dir):
    """Ones reduced with token-mean sum to exactly 1 over the call's micro-batches, for the
    action and the observation mask alike, only if each uses its own whole-call count."""
    sums = {"action": 0.0, "observation": 0.0, "observation copy": 0.0}

    class Probe:
        name = "probe"

        def __call__(self, ctx: LossContext) -> LossOutput:
            ones = torch.ones_like(ctx.logprobs)
            sums["action"] += ctx.aggregate(ones, ctx.action_mask).item()
            sums["observation"] += ctx.aggregate(ones, ctx.observation_mask).item()
            sums["observation copy"] += ctx.aggregate(ones, ctx.observation_mask > 0).item()
            return LossOutput(loss=ctx.aggregate(-ctx.logprobs, ctx.action_mask))

    # 5 datums: 13 action tokens and 8 observation tokens in all, split 2 + 2 + 1.
    backend(tiny_model_dir, micro_batch_size=2).forward_backward(
        make_datums(), Objective.of(Probe())
    )
    assert sums == pytest.approx({"action": 1.0, "observation": 1.0, "observation copy": 1.0})


def test_model_trains_in_train_mode_and_rests_in_eval_mode(tiny_model_dir):
    trainer = backend(tiny_model_dir, lora={"rank": 4, "dropout": 0.1})
    seen = []

    class Mode:
        name = "mode"

        def __call__(self, ctx: LossContext) -> LossOutput:
            seen.append(trainer.model.training)
            return LossOutput(loss=ctx.aggregate(-ctx.logprobs, ctx.action_mask))

    assert trainer.model.training is False
    trainer.forward_backward(make_datums(), Objective.of(Mode()))
    assert seen == [True, True]
    assert trainer.model.training is False
    assert not any(module.training for module in trainer.model.modules())


# ---------------------------------------------------------------- gradients


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("with_echo", [False, True], ids=["reinforce", "reinforce+echo"])
def test_gradient_does_not_depend_on_the_micro_batch_size(tiny_model_dir, aggregation, with_echo):
    datums = make_datums(lengths=(7, 4, 9, 5, 6, 3))
    aux = [(Echo(EchoConfig()), 0.3)] if with_echo else []
    splits = {
        "one": dict(micro_batch_size=1),
        "two": dict(micro_batch_size=2),
        "all": dict(micro_batch_size=6),
        "token budget": dict(micro_batch_size=6, micro_batch_tokens=16),
    }
    results = {}
    for name, split in splits.items():
        trainer = backend(tiny_model_dir, **split)
        metrics = trainer.forward_backward(
            datums, Objective.of(REINFORCE, aux, aggregation=aggregation)
        )
        results[name] = (grads(trainer), metrics)
    reference, reference_metrics = results.pop("all")
    assert len(reference) == len(backend(tiny_model_dir).trainable_parameters)
    for got, metrics in results.values():
        for name, grad in reference.items():
            torch.testing.assert_close(got[name], grad, atol=1e-6, rtol=1e-5, msg=name)
        assert metrics["loss"] == pytest.approx(reference_metrics["loss"], abs=1e-6)
        if with_echo:
            assert metrics["echo/nll"] == pytest.approx(reference_metrics["echo/nll"], abs=1e-5)


def test_echo_with_coefficient_zero_is_bitwise_the_base_loss(tiny_model_dir):
    datums = make_datums()
    base, stacked = backend(tiny_model_dir), backend(tiny_model_dir)
    base_metrics = base.forward_backward(datums, Objective.of(REINFORCE))
    stacked_metrics = stacked.forward_backward(
        datums, Objective.of(REINFORCE, [(Echo(EchoConfig()), 0.0)])
    )
    base_grads, stacked_grads = grads(base), grads(stacked)
    assert base_grads.keys() == stacked_grads.keys()
    assert all(torch.equal(base_grads[name], stacked_grads[name]) for name in base_grads)
    assert stacked_metrics == base_metrics
    assert not any(key.startswith("echo") for key in stacked_metrics)


def test_masked_tokens_get_no_gradient(tiny_model_dir):
    datums = make_datums()
    changed = list(datums)
    victim = datums[2]
    # Position 4 is an observation token, position 1 a prompt token: neither is an action.
    changed[2] = Datum(
        token_ids=victim.token_ids,
        logprobs=[-50.0 if i in (1, 4) else v for i, v in enumerate(victim.logprobs)],
        advantages=[1e6 if i in (1, 4) else v for i, v in enumerate(victim.advantages)],
        action_mask=victim.action_mask,
        observation_mask=victim.observation_mask,
    )
    first, second = backend(tiny_model_dir), backend(tiny_model_dir)
    first.forward_backward(datums, Objective.of(REINFORCE))
    second.forward_backward(changed, Objective.of(REINFORCE))
    a, b = grads(first), grads(second)
    assert all(torch.equal(a[name], b[name]) for name in a)


def test_loss_metrics_are_prefixed_and_weighted_by_tokens(tiny_model_dir):
    """The mean advantage over action tokens, computed per micro-batch and combined, equals
    the mean over the call's action tokens."""

    class MeanAdvantage:
        name = "mean-adv"

        def __call__(self, ctx: LossContext) -> LossOutput:
            mask = ctx.action_mask > 0
            value = ctx.advantages[mask].mean().item() if mask.any() else 0.0
            return LossOutput(
                loss=ctx.aggregate(-ctx.logprobs, ctx.action_mask), metrics={"advantage": value}
            )

    datums = make_datums()
    metrics = backend(tiny_model_dir, micro_batch_size=2).forward_backward(
        datums, Objective.of(MeanAdvantage())
    )
    actions = [(d.advantages[i]) for d in datums for i, m in enumerate(d.action_mask) if m]
    assert metrics["mean-adv/advantage"] == pytest.approx(sum(actions) / len(actions))
    assert metrics["tokens"] == 31.0
    assert metrics["sequences"] == 5.0
    assert metrics["action_tokens"] == float(len(actions)) == 13.0
    assert metrics["observation_tokens"] == 8.0
    assert metrics["loss"] == pytest.approx(metrics["mean-adv/loss"])


def test_losses_are_named_after_their_terms(tiny_model_dir):
    metrics = backend(tiny_model_dir).forward_backward(
        make_datums(),
        Objective.of(REINFORCE, [(Echo(EchoConfig()), 0.5), (Echo(EchoConfig()), 0.25)]),
    )
    prefixes = {key.split("/")[0] for key in metrics if "/" in key}
    assert prefixes == {"reinforce", "echo", "echo-2", "offpolicy"}
    expected = (
        metrics["reinforce/loss"] + 0.5 * metrics["echo/loss"] + 0.25 * metrics["echo-2/loss"]
    )
    assert metrics["loss"] == pytest.approx(expected, rel=1e-6)


def test_gradient_checkpointing_gives_the_same_gradient(tiny_model_dir):
    datums = make_datums()
    plain, checkpointed = (
        backend(tiny_model_dir),
        backend(tiny_model_dir, gradient_checkpointing=True),
    )
    plain.forward_backward(datums, Objective.of(REINFORCE))
    checkpointed.forward_backward(datums, Objective.of(REINFORCE))
    a, b = grads(plain), grads(checkpointed)
    for name in a:
        torch.testing.assert_close(b[name], a[name], atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize(
    ("aux", "error", "message"),
    [
        ([(Echo(EchoConfig()), math.nan)], ValueError, r"aux_losses\[0\] has coefficient nan"),
        ([(Echo(EchoConfig()), "0.1")], ValueError, "aux_losses.0. has coefficient '0.1'"),
    ],
)
def test_bad_coefficients_are_rejected(tiny_model_dir, aux, error, message):
    with pytest.raises(error, match=message):
        backend(tiny_model_dir).forward_backward(make_datums(), Objective.of(REINFORCE, aux))


def test_a_loss_that_is_not_a_scalar_is_rejected_and_leaves_no_gradient(tiny_model_dir):
    class PerToken:
        name = "per-token"

        def __call__(self, ctx: LossContext) -> LossOutput:
            return LossOutput(loss=-ctx.logprobs * ctx.action_mask)

    trainer = backend(tiny_model_dir, micro_batch_size=2)
    trainer.forward_backward(make_datums(), Objective.of(REINFORCE))
    with pytest.raises(TypeError, match=r"loss 'per-token' returned \(2, 7\)"):
        trainer.forward_backward(make_datums(), Objective.of(PerToken()))
    assert grads(trainer) == {}
    with pytest.raises(RuntimeError, match="without gradients"):
        trainer.optim_step()


def test_an_interrupt_stops_forward_backward_at_the_next_micro_batch_and_clears_it(
    tiny_model_dir, monkeypatch
):
    trainer = backend(tiny_model_dir, micro_batch_size=1)
    assert isinstance(trainer, Interruptible)
    trainer.forward_backward(make_datums(seed=1), Objective.of(REINFORCE))  # earlier, pending
    ran = []
    micro_step = trainer._micro_step

    def step_then_interrupt(micro, step):
        ran.append(micro.size)
        micro_step(micro, step)
        trainer.interrupt()  # as a signal handler on another thread would, mid-call

    monkeypatch.setattr(trainer, "_micro_step", step_then_interrupt)
    with pytest.raises(TrainingInterrupted, match="forward_backward was interrupted"):
        trainer.forward_backward(make_datums(), Objective.of(REINFORCE))
    assert ran == [1]  # of 5 micro-batches
    assert grads(trainer) == {}
    with pytest.raises(RuntimeError, match="without gradients"):
        trainer.optim_step()
    assert trainer.weight_version == 0
    monkeypatch.undo()
    # The request was used up: the next call runs whole.
    trainer.forward_backward(make_datums(), Objective.of(REINFORCE))
    assert trainer.optim_step()["step"] == 1.0


def test_an_interrupt_made_between_calls_stops_the_next_before_its_first_pass(tiny_model_dir):
    trainer = backend(tiny_model_dir)
    trainer.interrupt()
    with pytest.raises(TrainingInterrupted, match="compute_logprobs was interrupted"):
        trainer.compute_logprobs(make_datums())
    trainer.interrupt()
    with pytest.raises(TrainingInterrupted):
        trainer.forward_backward(make_datums(), Objective.of(REINFORCE))
    assert grads(trainer) == {}
    assert len(trainer.compute_logprobs(make_datums())) == 5


# ---------------------------------------------------------------- optimizer steps


def test_lora_trains_only_the_adapters(tiny_model_dir):
    trainer = backend(tiny_model_dir, lora={"rank": 4, "alpha": 8})
    names = list(trainer.trainable_parameters)
    assert names and all(".lora_A." in name or ".lora_B." in name for name in names)
    # 2 layers x 7 projections x (A, B)
    assert len(names) == 28
    frozen = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "lora" not in n}
    before = {n: p.detach().clone() for n, p in trainer.trainable_parameters.items()}
    trainer.forward_backward(make_datums(), Objective.of(REINFORCE))
    metrics = trainer.optim_step()
    assert metrics["step"] == 1.0 and trainer.weight_version == 1
    after = dict(trainer.model.named_parameters())
    assert all(torch.equal(after[n], p) for n, p in frozen.items())
    moved = [n for n, p in before.items() if not torch.equal(after[n], p)]
    # lora_B starts at zero, so lora_A has no gradient on the first step; lora_B moves.
    assert moved and all(".lora_B." in name for name in moved)


def test_gradients_accumulate_across_calls_until_optim_step(tiny_model_dir):
    datums = make_datums()
    once, twice = backend(tiny_model_dir), backend(tiny_model_dir)
    once.forward_backward(datums, Objective.of(REINFORCE))
    twice.forward_backward(datums, Objective.of(REINFORCE))
    twice.forward_backward(datums, Objective.of(REINFORCE))
    a, b = grads(once), grads(twice)
    for name in a:
        torch.testing.assert_close(b[name], 2 * a[name], atol=1e-7, rtol=1e-6)
    twice.optim_step()
    assert grads(twice) == {}


def test_optim_step_needs_gradients(tiny_model_dir):
    trainer = backend(tiny_model_dir)
    with pytest.raises(RuntimeError, match=r"call forward_backward\(...\) first"):
        trainer.optim_step()
    assert trainer.weight_version == 0


@pytest.mark.parametrize("max_grad_norm", [0.0, 1e-3, 1e6])
def test_grad_norm_is_reported_before_clipping(tiny_model_dir, max_grad_norm):
    trainer = backend(tiny_model_dir, max_grad_norm=max_grad_norm)
    trainer.forward_backward(make_datums(), Objective.of(REINFORCE))
    norm = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(g.double()) for g in grads(trainer).values()])
    ).item()
    seen = []

    def spy(optimizer, args, kwargs):
        norms = [torch.linalg.vector_norm(g.double()) for g in grads(trainer).values()]
        seen.append(torch.linalg.vector_norm(torch.stack(norms)).item())

    trainer.optimizer.register_step_pre_hook(spy)
    metrics = trainer.optim_step()
    assert metrics["grad_norm"] == pytest.approx(norm, rel=1e-5)
    limit = max_grad_norm if max_grad_norm > 0 else math.inf
    assert seen[0] == pytest.approx(min(norm, limit), rel=1e-4)
    if max_grad_norm == 0.0 or norm < max_grad_norm:
        assert seen[0] == pytest.approx(norm, rel=1e-12)


def test_a_non_finite_gradient_is_not_applied(tiny_model_dir):
    class Poisoned:
        name = "poisoned"

        def __call__(self, ctx: LossContext) -> LossOutput:
            return LossOutput(loss=ctx.aggregate(ctx.logprobs * math.nan, ctx.action_mask))

    trainer = backend(tiny_model_dir)
    before = {n: p.detach().clone() for n, p in trainer.trainable_parameters.items()}
    trainer.forward_backward(make_datums(), Objective.of(Poisoned()))
    with pytest.raises(FloatingPointError, match="gradient norm is nan at optimizer step 1"):
        trainer.optim_step()
    assert trainer.weight_version == 0
    assert all(torch.equal(p, before[n]) for n, p in trainer.trainable_parameters.items())
    assert grads(trainer) == {}


# ---------------------------------------------------------------- schedules


@pytest.mark.parametrize(
    ("schedule", "warmup", "total", "expected"),
    [
        ("constant", 0, None, [1.0, 1.0, 1.0]),
        ("constant", 4, None, [0.25, 0.5, 0.75, 1.0, 1.0]),
        ("linear", 2, 6, [0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0, 0.0]),
        ("linear", 0, 4, [1.0, 0.75, 0.5, 0.25, 0.0]),
        (
            "cosine",
            2,
            6,
            [0.5, 1.0, 1.0, 0.8535533905932737, 0.5, 0.14644660940672627, 0.0, 0.0],
        ),
    ],
)
def test_lr_factor(schedule, warmup, total, expected):
    got = [
        lr_factor(step, schedule=schedule, warmup_steps=warmup, total_steps=total)
        for step in range(len(expected))
    ]
    assert got == pytest.approx(expected, abs=1e-15)


def test_optim_step_follows_the_schedule(tiny_model_dir):
    trainer = backend(
        tiny_model_dir, learning_rate=0.01, lr_schedule="linear", warmup_steps=1, total_steps=4
    )
    rates = []
    for _ in range(5):
        trainer.forward_backward(make_datums(), Objective.of(REINFORCE))
        metrics = trainer.optim_step()
        rates.append(metrics["learning_rate"])
    assert rates == pytest.approx([0.01, 0.01, 0.01 * 2 / 3, 0.01 / 3, 0.0], abs=1e-12)
    assert trainer.weight_version == trainer.optimizer_steps == 5


# ---------------------------------------------------------------- building


def test_config_builds_through_the_plugin_spec(tiny_model_dir):
    from rllm_trainer_backend_torch import plugin

    (spec,) = list(plugin.rllm_trainer_backends())
    built = spec.build({"model": str(tiny_model_dir), "lora": {"rank": 2}})
    assert isinstance(built, TorchBackend)
    assert built.device == torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    built.close()
    with pytest.raises(RuntimeError, match="closed"):
        built.forward_backward(make_datums(), Objective.of(REINFORCE))


def test_bfloat16_weights_give_float32_logprobs(tiny_model_dir):
    trainer = backend(tiny_model_dir, dtype="bfloat16", lora={"rank": 4})
    assert next(trainer.model.get_input_embeddings().parameters()).dtype == torch.bfloat16
    recorder = Recorder()
    trainer.forward_backward(make_datums(), Objective.of(recorder))
    assert recorder.contexts[0].logprobs.dtype == torch.float32
    assert math.isfinite(trainer.optim_step()["grad_norm"])


def test_unknown_lora_target_names_the_linear_modules(tiny_model_dir):
    with pytest.raises(
        ComponentError, match=r"\['qkv'\].*linear modules are: down_proj, gate_proj"
    ):
        backend(tiny_model_dir, lora={"target_modules": ["q_proj", "qkv"]})


def test_missing_model_folder(tmp_path):
    with pytest.raises(ModelNotFoundError, match="not-here"):
        backend(tmp_path / "not-here")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is present")
def test_cuda_without_cuda_says_what_to_do(tiny_model_dir):
    with pytest.raises(ComponentError, match="sees no CUDA device; set device = 'auto' or 'cpu'"):
        backend(tiny_model_dir, device="cuda:1")


def test_sampler_shares_the_weights_and_the_gate(tiny_model_dir):
    """The sampler serves the trained weights, reports their version, and its logprobs are
    the ones the trainer recomputes for the same tokens."""
    sampler_module = pytest.importorskip("rllm_trainer_backend_torch.sampler")
    trainer = backend(tiny_model_dir, max_batch_size=3, logprob_temperature=0.8)
    try:
        sampler = trainer.sampler()
        assert isinstance(sampler, sampler_module.TorchSampler)
        assert trainer.sampler() is sampler
        trainer.forward_backward(make_datums(), Objective.of(REINFORCE))
        trainer.optim_step()
        assert sampler.weight_version == trainer.weight_version == 1
        prompt = [5, 77, 300, 12]
        params = SamplingParams(max_tokens=6, temperature=0.8, seed=3)
        result = asyncio.run(sampler.sample(SampleRequest(prompt_token_ids=prompt, params=params)))
        assert result.weight_version == 1
        ids = torch.tensor([prompt + result.completion_token_ids])
        with torch.no_grad():
            recomputed = token_logprobs(trainer.model, ids, temperature=0.8)[0, len(prompt) :]
        assert recomputed.tolist() == pytest.approx(result.logprobs, abs=1e-5)
    finally:
        trainer.close()


def test_cpu_threads_sets_torch_threads_and_unset_leaves_them(tiny_model_dir, monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    backend(tiny_model_dir, cpu_threads=1).close()
    backend(tiny_model_dir).close()
    assert calls == [1]
