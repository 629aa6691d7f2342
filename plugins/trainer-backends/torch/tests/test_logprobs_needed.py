"""token_logprobs with ``needed``: the output layer runs on each row's needed positions only."""

from __future__ import annotations

import pytest
import torch
from rllm_trainer_backend_torch.logprobs import token_logprobs
from rllm_trainer_backend_torch.plugin import TorchBackendConfig


@pytest.fixture(scope="module", params=["full", "lora"])
def model(request, tmp_path_factory, tiny_llama) -> torch.nn.Module:
    from rllm_trainer_backend_torch.loading import load_policy, seed_everything

    folder = tmp_path_factory.mktemp("tiny-llama")
    tiny_llama(7, vocab_size=300, max_position_embeddings=64).save_pretrained(folder)
    rank = 0 if request.param == "full" else 4
    seed_everything(0)
    loaded = load_policy(
        TorchBackendConfig(model=str(folder), device="cpu", lora={"rank": rank}),
        torch.device("cpu"),
    )
    if rank:  # LoRA starts as a no-op; move the adapters so their gradients are not trivial
        with torch.no_grad():
            for name, param in loaded.named_parameters():
                if "lora_B" in name:
                    param.normal_(0, 0.1)
    return loaded


IDS = torch.tensor([[3, 17, 250, 9, 44, 2, 0, 0], [8, 8, 100, 11, 12, 13, 14, 15]])
NEEDED = torch.tensor([[0, 0, 0, 1, 1, 1, 0, 0], [0, 0, 0, 0, 1, 0, 1, 1]])


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_needed_positions_match_the_full_computation_in_value_and_gradient(model, temperature):
    params = [p for p in model.parameters() if p.requires_grad]
    weights = torch.randn(IDS.shape, generator=torch.Generator().manual_seed(1)) * NEEDED

    full = token_logprobs(model, IDS, temperature=temperature)
    full_grads = torch.autograd.grad((full * weights).sum(), params)
    part = token_logprobs(model, IDS, temperature=temperature, needed=NEEDED)
    part_grads = torch.autograd.grad((part * weights).sum(), params)

    mask = NEEDED.bool()
    torch.testing.assert_close(part[mask], full[mask], atol=1e-5, rtol=0)
    # Only the positions a row needs are computed; the rest of the row holds 0 (column 3 is
    # needed by row 0 alone).
    assert torch.all(part[~mask] == 0)
    assert part[0, 3] != 0 and part[1, 3] == 0
    for got, expected in zip(part_grads, full_grads, strict=True):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_nothing_needed_or_every_position_takes_the_full_path(model):
    with torch.no_grad():
        full = token_logprobs(model, IDS)
        none = token_logprobs(model, IDS, needed=torch.zeros_like(IDS))
        every = token_logprobs(model, IDS, needed=torch.ones_like(IDS))
    torch.testing.assert_close(none, full, atol=0, rtol=0)
    torch.testing.assert_close(every, full, atol=0, rtol=0)


def test_the_output_layer_sees_only_the_needed_positions(model):
    seen = []
    head = model.get_output_embeddings()
    hook = head.register_forward_hook(lambda module, args, out: seen.append(tuple(out.shape)))
    try:
        with torch.no_grad():
            token_logprobs(model, IDS, needed=NEEDED)
    finally:
        hook.remove()
    assert seen == [(1, int(NEEDED.sum()), 300)]
