"""The supervised update: the core NLL objective on a backend's ``forward_backward``, the
dispatch to a backend's own supervised path, held-out NLL, and the batches of each step
(eval split, epochs, shuffling, packing)."""

from __future__ import annotations

import asyncio
import json
import math

import pytest
import torch
from rllm_core.algorithms.nll import nll_objective
from rllm_core.ports import SupervisedTrainer, TrainerBackend
from rllm_core.run.checkpoints import checkpoint_steps
from rllm_core.sft.batches import batch_datums, epoch_batches, split_eval, steps_per_epoch
from rllm_core.sft.data import TokenExample
from rllm_core.sft.step import eval_nll, supervised_forward_backward
from rllm_core.sft.tokens import supervised_datum

VOCAB = 7


class BigramBackend:
    """A bigram model (logits of token t from token t-1) trained as the TrainerBackend
    contract says: one objective step over every micro-batch's masks, a backward per
    micro-batch of ``micro`` datums."""

    def __init__(self, micro: int = 1) -> None:
        torch.manual_seed(0)
        self.table = torch.nn.Parameter(torch.randn(VOCAB, VOCAB))
        self.micro = micro
        self.weight_version = 0

    def logprobs(self, ids: list[int]) -> torch.Tensor:
        tokens = torch.tensor(ids)
        rows = torch.log_softmax(self.table[tokens[:-1]], dim=-1)
        picked = rows.gather(1, tokens[1:, None])[:, 0]
        return torch.cat([torch.zeros(1), picked])

    def forward_backward(self, datums, objective):
        chunks = [datums[i : i + self.micro] for i in range(0, len(datums), self.micro)]
        padded = []
        for chunk in chunks:
            width = max(len(d.token_ids) for d in chunk)

            def pad(values, fill=0.0, width=width):
                return torch.tensor([list(v) + [fill] * (width - len(v)) for v in values])

            lp = torch.stack(
                [
                    torch.cat([self.logprobs(d.token_ids), torch.zeros(width - len(d.token_ids))])
                    for d in chunk
                ]
            )
            padded.append(
                dict(
                    logprobs=lp,
                    rollout_logprobs=pad([d.logprobs for d in chunk]),
                    advantages=pad([d.advantages for d in chunk]),
                    action_mask=pad([[float(m) for m in d.action_mask] for d in chunk]),
                    observation_mask=pad([[float(m) for m in d.observation_mask] for d in chunk]),
                )
            )
        from rllm_core.algorithms.objective import LossInputs

        step = objective.begin(
            [p["action_mask"] for p in padded], [p["observation_mask"] for p in padded]
        )
        for p in padded:
            step.evaluate(LossInputs(**p)).backward()
        metrics = step.metrics()
        metrics |= {"tokens": 999.0, "sequences": float(len(datums)), "bigram/extra": 1.5}
        return metrics

    def compute_logprobs(self, datums):
        with torch.no_grad():
            return [self.logprobs(d.token_ids).tolist() for d in datums]

    def sampler(self):
        raise NotImplementedError

    def optim_step(self):
        self.weight_version += 1
        return {}

    def save_state(self, path):
        pass

    def load_state(self, path):
        pass

    def close(self):
        pass


EXAMPLES = [
    TokenExample(token_ids=(1, 2, 3, 4), trained=(False, False, True, True), origin="a"),
    TokenExample(token_ids=(5, 1, 6), trained=(False, True, True), origin="b"),
    TokenExample(token_ids=(2, 2, 2, 2, 3), trained=(False, True, False, True, True), origin="c"),
]


def manual_nll(backend: BigramBackend, examples) -> torch.Tensor:
    values = [
        -backend.logprobs(list(e.token_ids))[i]
        for e in examples
        for i, trained in enumerate(e.trained)
        if trained
    ]
    return torch.stack(values).mean()


@pytest.mark.parametrize("micro", [1, 2, 3])
def test_nll_objective_is_the_mean_over_trained_tokens_whatever_the_micro_batches(micro):
    backend = BigramBackend(micro)
    assert isinstance(backend, TrainerBackend) and not isinstance(backend, SupervisedTrainer)
    datums = batch_datums(EXAMPLES, packing=False, max_length=None)
    metrics = supervised_forward_backward(backend, datums)
    gradient = backend.table.grad.clone()

    reference = BigramBackend()
    expected = manual_nll(reference, EXAMPLES)
    expected.backward()
    assert metrics["nll"] == pytest.approx(float(expected.detach()), rel=1e-6)
    assert metrics["tokens"] == 7.0
    assert metrics["sequences"] == 3.0
    assert metrics["bigram/extra"] == 1.5
    assert not any(k.startswith(("offpolicy/", "nll/")) for k in metrics)
    torch.testing.assert_close(gradient, reference.table.grad)


def test_untrained_tokens_get_no_gradient():
    backend = BigramBackend()
    only = TokenExample(token_ids=(1, 2, 3), trained=(False, False, True), origin="x")
    supervised_forward_backward(backend, [supervised_datum([only])])
    rows_with_gradient = {i for i in range(VOCAB) if backend.table.grad[i].abs().sum() > 0}
    assert rows_with_gradient == {2}  # only the row predicting the trained token 3 from 2


def test_the_nll_objective_ignores_advantages_and_logprobs():
    datum = supervised_datum([EXAMPLES[0]])
    assert set(datum.advantages) == {0.0}
    objective = nll_objective()
    assert objective.aggregation == "token-mean" and objective.names == ["nll"]


class SupervisedBackend(BigramBackend):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[int] = []

    def forward_backward(self, datums, objective):
        raise AssertionError("a supervised backend is trained through its own path")

    def forward_backward_supervised(self, datums):
        self.calls.append(len(datums))
        return {"nll": 1.25, "tokens": 4, "sequences": len(datums), "svc/kernel_ms": 3}


def test_a_backend_with_a_supervised_path_is_called_with_it():
    backend = SupervisedBackend()
    assert isinstance(backend, SupervisedTrainer)
    metrics = supervised_forward_backward(
        backend, batch_datums(EXAMPLES, packing=False, max_length=None)
    )
    assert backend.calls == [3]
    assert metrics == {"nll": 1.25, "tokens": 4.0, "sequences": 3.0, "svc/kernel_ms": 3.0}


def test_eval_nll_matches_the_training_mean_without_gradient():
    backend = BigramBackend()
    datums = batch_datums(EXAMPLES, packing=False, max_length=None)
    scored = eval_nll(backend, datums, chunk=2)
    expected = float(manual_nll(BigramBackend(), EXAMPLES).detach())
    assert scored["nll"] == pytest.approx(expected, rel=1e-6)
    assert scored["ppl"] == pytest.approx(math.exp(expected), rel=1e-6)
    assert scored["tokens"] == 7.0
    assert backend.table.grad is None


def test_eval_split_is_seeded_and_disjoint():
    items = list(range(20))
    train, held = split_eval(items, 0.25, seed=3)
    assert len(held) == 5 and sorted(train + held) == items
    assert (train, held) == split_eval(items, 0.25, seed=3)
    assert held != split_eval(items, 0.25, seed=4)[1]
    assert split_eval(items, 0.0, seed=3) == (items, [])
    assert len(split_eval([1, 2], 0.01, seed=0)[1]) == 1


def test_epochs_visit_every_example_once_in_a_seeded_order():
    assert steps_per_epoch(10, 4) == 3
    first = epoch_batches(10, 4, seed=0, epoch=0)
    assert [len(b) for b in first] == [4, 4, 2]
    assert sorted(i for b in first for i in b) == list(range(10))
    assert first == epoch_batches(10, 4, seed=0, epoch=0)
    assert first != epoch_batches(10, 4, seed=0, epoch=1)
    assert first != epoch_batches(10, 4, seed=1, epoch=0)


def test_packing_fills_rows_up_to_max_length_and_records_each_length():
    examples = [
        TokenExample(token_ids=tuple(range(n)), trained=(False,) + (True,) * (n - 1), origin=str(n))
        for n in (5, 4, 3, 6, 2)
    ]
    datums = batch_datums(examples, packing=True, max_length=9)
    assert [d.metadata["packed_lengths"] for d in datums] == [[5, 4], [3, 6], [2]]
    for datum in datums:
        assert len(datum.token_ids) == sum(datum.metadata["packed_lengths"]) <= 9
    assert datums[0].action_mask == [False, True, True, True, True, False, True, True, True]
    plain = batch_datums(examples, packing=False, max_length=9)
    assert len(plain) == 5 and all("packed_lengths" not in d.metadata for d in plain)


def run_loop(tmp_path, backend, **sft):
    import io

    from rich.console import Console
    from rllm_core.cli.sft_display import SftDisplay
    from rllm_core.plan import ResolvedPlan
    from rllm_core.plan.schema import Plan
    from rllm_core.run.folder import RunFolder
    from rllm_core.sft.loop import SftLoop

    plan = Plan.model_validate({"run": {"save_every": 2}, "sft": {"data": "x", **sft}})
    folder = RunFolder.create(tmp_path, "sft")
    out = io.StringIO()
    console = Console(file=out, width=200)
    loop = SftLoop(
        resolved=ResolvedPlan(path="sft.toml", plan=plan),
        trainer=backend,
        loggers=[],
        folder=folder,
        display=SftDisplay(console, console, 0, quiet=False),
        train=EXAMPLES,
        held_out=EXAMPLES[:1],
    )
    return loop, folder, out


def test_the_loop_writes_a_line_per_step_checkpoints_and_a_summary(tmp_path):
    backend = BigramBackend()
    loop, folder, out = run_loop(tmp_path, backend, epochs=3, batch_size=2, eval_every=4)
    result = asyncio.run(loop.run())
    assert (result.status, result.exit_code, result.step) == ("finished", 0, 6)
    lines = folder.read_jsonl(folder.metrics)
    assert [line["step"] for line in lines] == [1, 2, 3, 4, 5, 6]
    assert [line["epoch"] for line in lines] == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
    assert [line["train/sequences"] for line in lines] == [2.0, 1.0] * 3
    assert [("eval/nll" in line) for line in lines] == [False] * 3 + [True, False, True]
    assert backend.weight_version == 6
    assert checkpoint_steps(folder.checkpoints) == [2, 4, 6]
    summary = json.loads(folder.summary.read_text())
    assert summary["kind"] == "sft" and summary["last_step"] == 6 and summary["examples"] == 3
    assert "step 6/0  epoch 3  nll" in out.getvalue()  # the display was told 0 steps


def test_held_out_examples_need_a_backend_that_scores_them(tmp_path):
    from rllm_core.run.lifecycle import ResumeError

    class Blind(BigramBackend):
        compute_logprobs = None  # type: ignore[assignment]

    loop, folder, _ = run_loop(tmp_path, Blind(), eval_fraction=0.5)
    with pytest.raises(ResumeError, match=r"\[sft\]\.eval_fraction: .*no LogprobScorer"):
        asyncio.run(loop.run())
    assert not folder.metrics.exists()
