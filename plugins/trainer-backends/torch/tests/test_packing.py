"""Packed datums (``metadata["packed_lengths"]``): each example's logprobs and gradients equal
those it gets as a datum of its own, and malformed packings are refused."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch
from rllm_core.algorithms.objective import Objective
from rllm_core.plugins.manager import get_plugin_manager
from rllm_core.plugins.specs import Kind
from rllm_core.ports import LossContext, LossOutput
from rllm_core.types import Datum
from rllm_trainer_backend_torch.backend import TorchBackend
from rllm_trainer_backend_torch.collate import collate
from rllm_trainer_backend_torch.plugin import TorchBackendConfig
from rllm_trainer_backend_torch.testing import random_datums

VOCAB = 512
TOLERANCE = {"atol": 1e-5, "rtol": 0.0}


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, tiny_llama) -> Path:
    folder = tmp_path_factory.mktemp("tiny-llama-packing")
    tiny_llama(99, vocab_size=VOCAB, max_position_embeddings=64).save_pretrained(folder)
    return folder


def backend(folder: Path, **overrides) -> TorchBackend:
    values = {"model": str(folder), "device": "cpu", "lora": {"rank": 0}, **overrides}
    return TorchBackend(TorchBackendConfig(**values))


class Nll:
    """The mean negative log-likelihood of the action tokens over the whole call."""

    name = "nll"

    def __call__(self, ctx: LossContext) -> LossOutput:
        return LossOutput(loss=ctx.aggregate(-ctx.logprobs, ctx.action_mask))


NLL = Objective.of(Nll())


def pack(datums: Sequence[Datum]) -> Datum:
    """``datums`` one after another in one datum, with their lengths as ``packed_lengths``."""

    def joined(field: str) -> list:
        return [value for datum in datums for value in getattr(datum, field)]

    return Datum(
        token_ids=joined("token_ids"),
        logprobs=joined("logprobs"),
        advantages=joined("advantages"),
        action_mask=joined("action_mask"),
        observation_mask=joined("observation_mask"),
        metadata={"packed_lengths": [len(datum.token_ids) for datum in datums]},
    )


def examples() -> list[Datum]:
    return random_datums(7, (9, 5, 12, 3, 8, 6, 11), vocab=VOCAB)


def packed(datums: list[Datum]) -> list[Datum]:
    """Three packed rows of different widths, and one datum left alone."""
    return [pack(datums[0:3]), pack(datums[3:5]), datums[5], pack(datums[6:7])]


def grads(trainer: TorchBackend) -> dict[str, torch.Tensor]:
    return {
        name: param.grad.clone()
        for name, param in trainer.trainable_parameters.items()
        if param.grad is not None
    }


LORA = {"rank": 4, "alpha": 8.0}


@pytest.mark.parametrize("lora", [{"rank": 0}, LORA], ids=["full", "lora"])
@pytest.mark.parametrize("micro_batch_size", [1, 3, 8])
def test_packed_examples_get_the_logprobs_they_get_alone(
    tiny_model_dir: Path, lora: dict, micro_batch_size: int
):
    trainer = backend(tiny_model_dir, lora=lora, micro_batch_size=micro_batch_size)
    if lora["rank"]:
        # Fresh adapters add nothing; one step makes them count.
        trainer.forward_backward(examples(), NLL)
        trainer.optim_step()
    datums = examples()
    alone = trainer.compute_logprobs(datums)
    rows = trainer.compute_logprobs(packed(datums))
    assert len(rows) == 4
    together = [*_split(rows[0], (9, 5, 12)), *_split(rows[1], (3, 8)), rows[2], rows[3]]
    for index, (mine, theirs) in enumerate(zip(together, alone, strict=True)):
        assert mine[0] == 0.0, f"example {index} starts with a logprob"
        torch.testing.assert_close(torch.tensor(mine), torch.tensor(theirs), **TOLERANCE)


def _split(row: list[float], lengths: tuple[int, ...]) -> list[list[float]]:
    out, start = [], 0
    for length in lengths:
        out.append(row[start : start + length])
        start += length
    return out


@pytest.mark.parametrize("lora", [{"rank": 0}, LORA], ids=["full", "lora"])
@pytest.mark.parametrize("micro_batch_size", [1, 2, 8])
def test_packed_examples_give_the_gradient_they_give_alone(
    tiny_model_dir: Path, lora: dict, micro_batch_size: int
):
    alone = backend(tiny_model_dir, lora=lora, micro_batch_size=micro_batch_size)
    together = backend(tiny_model_dir, lora=lora, micro_batch_size=micro_batch_size)
    if lora["rank"]:
        for trainer in (alone, together):
            trainer.forward_backward(examples(), NLL)
            trainer.optim_step()
    datums = examples()
    unpacked_metrics = alone.forward_backward(datums, NLL)
    packed_metrics = together.forward_backward(packed(datums), NLL)
    expected, got = grads(alone), grads(together)
    assert expected.keys() == got.keys() and expected
    assert any(float(g.abs().max()) > 1e-3 for g in expected.values())
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], **TOLERANCE, msg=name)
    assert packed_metrics["nll/loss"] == pytest.approx(unpacked_metrics["nll/loss"], abs=1e-6)
    assert packed_metrics["tokens"] == unpacked_metrics["tokens"] == 54.0
    assert packed_metrics["sequences"] == unpacked_metrics["sequences"] == 7.0


def test_without_restarted_positions_the_examples_would_see_each_other(tiny_model_dir: Path):
    """The check above can fail: the same row read as one sequence differs after its first
    example."""
    trainer = backend(tiny_model_dir)
    datums = examples()[:2]
    row = pack(datums)
    as_one = Datum(
        token_ids=row.token_ids,
        logprobs=row.logprobs,
        advantages=row.advantages,
        action_mask=row.action_mask,
        observation_mask=row.observation_mask,
    )
    split, joined = trainer.compute_logprobs([row, as_one])
    assert split[:9] == pytest.approx(joined[:9], abs=1e-6)
    assert max(abs(a - b) for a, b in zip(split[10:], joined[10:], strict=True)) > 1e-3


def test_position_ids_restart_per_example_and_count_on_through_padding():
    datums = examples()
    batch = collate([datums[2], pack(datums[:2])], vocab_size=VOCAB, max_length=None)
    assert batch.position_ids is not None
    assert batch.position_ids.tolist() == [list(range(14)), [*range(9), *range(5)]]
    assert [part.position_ids.tolist() for part in batch.micro_batches(1)] == [
        [list(range(12))],
        [[*range(9), *range(5)]],
    ]
    assert collate(datums[:2], vocab_size=VOCAB, max_length=None).position_ids is None


@pytest.mark.parametrize(
    ("lengths", "message"),
    [
        ([9, 4], "datum 1 has metadata['packed_lengths'] summing to 13, but it holds 14 tokens"),
        ([9, 6], "summing to 15, but it holds 14 tokens"),
        ([14, 0], "metadata['packed_lengths'] = [14, 0]; it must be a non-empty list of positive"),
        ([], "metadata['packed_lengths'] = []"),
        ([9.0, 5.0], "= [9.0, 5.0]; it must be"),
        ([True, 13], "= [True, 13]"),
        ("9,5", "= '9,5'"),
    ],
)
def test_bad_packed_lengths_are_refused(tiny_model_dir: Path, lengths, message: str):
    datums = examples()
    bad = pack(datums[:2])
    bad.metadata["packed_lengths"] = lengths
    trainer = backend(tiny_model_dir)
    with pytest.raises(ValueError, match=_escaped(message)):
        trainer.forward_backward([datums[2], bad], NLL)
    with pytest.raises(ValueError, match=_escaped(message)):
        trainer.compute_logprobs([datums[2], bad])
    assert not grads(trainer)


def _escaped(text: str) -> str:
    return re.escape(text)


@pytest.mark.parametrize("mask", ["action_mask", "observation_mask"])
def test_a_mask_on_an_examples_first_token_is_refused(mask: str):
    datums = examples()
    row = pack(datums[:2])
    getattr(row, mask)[9] = True
    with pytest.raises(ValueError, match=rf"datum 0 has {mask}\[9\] set at the start of packed"):
        collate([row], vocab_size=VOCAB, max_length=None)


def test_each_packed_example_must_fit_the_context_not_the_row():
    datums = random_datums(3, (40, 40), vocab=VOCAB)
    collate([pack(datums)], vocab_size=VOCAB, max_length=64)
    too_long = random_datums(3, (70, 5), vocab=VOCAB)
    with pytest.raises(ValueError, match="datum 0's packed example 0 has 70 tokens but the"):
        collate([pack(too_long)], vocab_size=VOCAB, max_length=64)


def test_the_torch_spec_says_it_packs_sequences():
    spec = get_plugin_manager().get_record(Kind.TRAINER_BACKEND, "torch").spec
    assert spec.trait("packs_sequences") is True
