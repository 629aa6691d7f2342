"""``share_prefixes``: rows that share prefixes run as one tree; every logprob and gradient
equals the one the rows get right-padded, and the pass holds each shared token once."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from rllm_core.algorithms.objective import Objective
from rllm_core.ports import LossContext, LossOutput
from rllm_core.types import Datum
from rllm_trainer_backend_torch.backend import TorchBackend
from rllm_trainer_backend_torch.collate import collate
from rllm_trainer_backend_torch.logprobs import shared_prefix_logprobs, token_logprobs
from rllm_trainer_backend_torch.plugin import TorchBackendConfig
from rllm_trainer_backend_torch.prefix_tree import PrefixTree

VOCAB = 300
TOLERANCE = {"atol": 1e-5, "rtol": 1e-4}


def rows_sharing_prefixes() -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded rows: two with a common 6-token prompt, one that repeats the first
    exactly, one that is a prefix of the second, one that shares only its first token, one
    that shares nothing."""
    rng = random.Random(3)
    prompt = [rng.randrange(VOCAB) for _ in range(6)]
    first = prompt + [rng.randrange(VOCAB) for _ in range(5)]
    second = prompt + [rng.randrange(VOCAB) for _ in range(7)]
    alone = [(prompt[0] + 1) % VOCAB, *[rng.randrange(VOCAB) for _ in range(8)]]
    rows = [first, second, list(first), second[:9], [*prompt[:1], 7, 8, 9], alone]
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.int64)
    for index, row in enumerate(rows):
        ids[index, : len(row)] = torch.tensor(row)
    return ids, torch.tensor([len(row) for row in rows])


@pytest.fixture(scope="module", params=["full", "lora"])
def model(request, tmp_path_factory, tiny_llama) -> torch.nn.Module:
    from rllm_trainer_backend_torch.loading import load_policy, seed_everything

    folder = tmp_path_factory.mktemp("tiny-llama-tree")
    tiny_llama(5, vocab_size=VOCAB, max_position_embeddings=64).save_pretrained(folder)
    rank = 0 if request.param == "full" else 4
    seed_everything(0)
    loaded = load_policy(
        TorchBackendConfig(model=str(folder), device="cpu", lora={"rank": rank}),
        torch.device("cpu"),
    )
    if rank:  # fresh adapters add nothing; move them so their gradients are not trivial
        with torch.no_grad():
            for name, param in loaded.named_parameters():
                if "lora_B" in name:
                    param.normal_(0, 0.1)
    return loaded


def test_the_tree_holds_each_distinct_prefix_once():
    ids, lengths = rows_sharing_prefixes()
    tree = PrefixTree.of(ids, lengths)
    # 11 + (7 new after the prompt) + 0 (a repeat) + 0 (a prefix) + 3 + 9
    assert tree.size == 11 + 7 + 0 + 0 + 3 + 9
    assert torch.equal(tree.index[0], tree.index[2])
    assert torch.equal(tree.index[3, :9], tree.index[1, :9])
    for row, length in enumerate(lengths.tolist()):
        nodes = tree.index[row, :length]
        assert torch.equal(tree.token_ids[nodes], ids[row, :length])
        assert tree.position_ids[nodes].tolist() == list(range(length))
        assert tree.parents[nodes].tolist() == [-1, *nodes[:-1].tolist()]
        assert bool((tree.index[row, length:] == -1).all())
    allowed = tree.attention_mask(torch.float32)[0, 0] == 0
    # A node sees exactly its ancestors and itself: row 1's tokens after the prompt never see
    # row 0's.
    assert allowed.sum(dim=1).tolist() == (tree.position_ids + 1).tolist()
    assert not allowed[tree.index[1, 6], tree.index[0, 6]]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_tree_logprobs_and_gradients_equal_the_padded_ones(model, temperature):
    ids, lengths = rows_sharing_prefixes()
    positions = torch.arange(ids.shape[1])
    valid = positions.unsqueeze(0) < lengths.unsqueeze(1)
    needed = valid & (positions.unsqueeze(0) >= 4)
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(2)) * needed
    params = [p for p in model.parameters() if p.requires_grad]

    padded = token_logprobs(model, ids, temperature=temperature, needed=needed)
    padded_grads = torch.autograd.grad((padded * weights).sum(), params)
    tree = shared_prefix_logprobs(model, ids, lengths, temperature=temperature, needed=needed)
    tree_grads = torch.autograd.grad((tree * weights).sum(), params)

    torch.testing.assert_close(tree[needed], padded[needed], **TOLERANCE)
    assert torch.all(tree[~needed] == 0)
    for got, expected in zip(tree_grads, padded_grads, strict=True):
        torch.testing.assert_close(got, expected, **TOLERANCE)
    with torch.no_grad():
        every = shared_prefix_logprobs(model, ids, lengths, temperature=temperature)
        full = token_logprobs(model, ids, temperature=temperature)
    torch.testing.assert_close(every[valid], full[valid], **TOLERANCE)


def test_the_model_sees_one_row_of_distinct_prefixes(model):
    ids, lengths = rows_sharing_prefixes()
    seen = []
    embeddings = model.get_input_embeddings()
    hook = embeddings.register_forward_hook(lambda m, args, out: seen.append(tuple(args[0].shape)))
    try:
        with torch.no_grad():
            shared_prefix_logprobs(model, ids, lengths)
    finally:
        hook.remove()
    assert seen == [(1, PrefixTree.of(ids, lengths).size)]


def test_the_check_can_fail_without_the_tree_mask(model):
    """The same packed row under a plain causal mask: tokens after the shared prompt see
    another row's tokens, and their logprobs change."""
    ids, lengths = rows_sharing_prefixes()
    tree = PrefixTree.of(ids, lengths)
    with torch.no_grad():
        logits = model(
            input_ids=tree.token_ids.unsqueeze(0),
            position_ids=tree.position_ids.unsqueeze(0),
            use_cache=False,
        ).logits[0]
        padded = token_logprobs(model, ids)
    causal = torch.log_softmax(logits.float(), dim=-1)
    second = tree.index[1, :11]
    read = causal[second[6:-1], ids[1, 7:11]]
    assert (read - padded[1, 7:11]).abs().max() > 1e-3


def test_a_model_that_ignores_custom_masks_is_refused(model):
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = "flash_attention_2"
    try:
        ids, lengths = rows_sharing_prefixes()
        with pytest.raises(ValueError, match="share_prefixes = false"):
            shared_prefix_logprobs(model, ids, lengths)
    finally:
        config._attn_implementation = before


def test_micro_batches_count_shared_tokens_once():
    ids, lengths = rows_sharing_prefixes()
    datums = [
        Datum(
            token_ids=ids[row, :length].tolist(),
            logprobs=[0.0] * length,
            advantages=[1.0] * length,
            action_mask=[False] * (length - 1) + [True],
            observation_mask=[False] * length,
        )
        for row, length in enumerate(lengths.tolist())
    ]
    batch = collate(datums, vocab_size=VOCAB, max_length=None)
    padded = [len(m.lengths) for m in batch.micro_batches(8, 20)]
    shared = [len(m.lengths) for m in batch.micro_batches(8, 20, shared=True)]
    # Padded, two rows of 11 or 13 tokens pass 20 (only rows 3 and 4 fit 2 x 9); shared,
    # rows 0-3 hold 11 + 7 distinct tokens.
    assert padded == [1, 1, 1, 2, 1]
    assert shared == [4, 2]
    assert [len(m.lengths) for m in batch.micro_batches(3, None, shared=True)] == [3, 3]


class Nll:
    name = "nll"

    def __call__(self, ctx: LossContext) -> LossOutput:
        return LossOutput(loss=ctx.aggregate(-ctx.logprobs * ctx.advantages, ctx.action_mask))


def group_datums() -> list[Datum]:
    """Two groups of three episodes, each episode's datums starting with its group's prompt."""
    rng = random.Random(11)
    datums = []
    for _ in range(2):
        prompt = [rng.randrange(VOCAB) for _ in range(10)]
        for _ in range(3):
            reply = [rng.randrange(VOCAB) for _ in range(rng.randrange(3, 8))]
            tokens = prompt + reply
            advantage = rng.uniform(-1, 1)
            datums.append(
                Datum(
                    token_ids=tokens,
                    logprobs=[-rng.uniform(0.5, 5.0) for _ in tokens],
                    advantages=[advantage] * len(tokens),
                    action_mask=[i >= len(prompt) for i in range(len(tokens))],
                    observation_mask=[False] * len(tokens),
                )
            )
    return datums


@pytest.mark.parametrize("lora", [{"rank": 0}, {"rank": 4, "alpha": 8.0}], ids=["full", "lora"])
def test_the_backend_trains_the_same_with_shared_prefixes(tmp_path: Path, tiny_llama, lora):
    tiny_llama(8, vocab_size=VOCAB, max_position_embeddings=64).save_pretrained(tmp_path)
    trainers = [
        TorchBackend(
            TorchBackendConfig(
                model=str(tmp_path),
                device="cpu",
                lora=lora,
                micro_batch_size=4,
                micro_batch_tokens=40,
                share_prefixes=share,
            )
        )
        for share in (False, True)
    ]
    objective = Objective.of(Nll())
    for _ in range(2):  # the second step runs on weights (and adapters) the first one moved
        metrics = [t.forward_backward(group_datums(), objective) for t in trainers]
        grads = [
            {n: p.grad.clone() for n, p in t.trainable_parameters.items() if p.grad is not None}
            for t in trainers
        ]
        assert grads[0].keys() == grads[1].keys() and grads[0]
        for name in grads[0]:
            torch.testing.assert_close(grads[1][name], grads[0][name], **TOLERANCE, msg=name)
        assert metrics[1]["nll/loss"] == pytest.approx(metrics[0]["nll/loss"], abs=1e-5)
        assert metrics[1]["tokens"] == metrics[0]["tokens"]
        for trainer in trainers:
            trainer.optim_step()
    plain, shared = (t.compute_logprobs(group_datums()) for t in trainers)
    for mine, theirs in zip(shared, plain, strict=True):
        torch.testing.assert_close(torch.tensor(mine), torch.tensor(theirs), **TOLERANCE)
    for trainer in trainers:
        trainer.close()
