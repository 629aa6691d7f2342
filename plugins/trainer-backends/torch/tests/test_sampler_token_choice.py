"""choose_tokens: temperature, greedy rows, nucleus truncation and inverse-CDF draws."""

from __future__ import annotations

import math
import random

import pytest
import torch
from rllm_trainer_backend_torch.token_choice import choose_tokens

LOG3 = math.log(3.0)
QUARTERS = torch.tensor([[0.0, LOG3]])
"""Two tokens with probabilities 1/4 and 3/4."""


@pytest.mark.parametrize(("draw", "token"), [(0.0, 0), (0.2499, 0), (0.2501, 1), (0.9999, 1)])
def test_the_draw_picks_the_token_whose_cumulative_mass_covers_it(draw: float, token: int) -> None:
    tokens, logprobs = choose_tokens(QUARTERS, [1.0], [1.0], [draw])
    assert tokens.tolist() == [token]
    assert logprobs.item() == pytest.approx(math.log(0.25 if token == 0 else 0.75), abs=1e-6)


def test_top_p_drops_tokens_outside_the_nucleus_but_not_their_logprob_mass() -> None:
    # The mass ranked above token 0 is 0.75 >= 0.5, so only token 1 remains: a draw that
    # picks token 0 on the full distribution picks token 1 here, reported as log 3/4.
    tokens, logprobs = choose_tokens(QUARTERS, [1.0], [0.5], [0.1])
    assert tokens.tolist() == [1]
    assert logprobs.item() == pytest.approx(math.log(0.75), abs=1e-6)


def test_top_p_keeps_a_token_while_the_mass_above_it_is_below_p() -> None:
    # Both kept: sorted order is [token 1, token 0], so draws below 0.75 pick token 1.
    assert choose_tokens(QUARTERS, [1.0], [0.8], [0.7])[0].tolist() == [1]
    assert choose_tokens(QUARTERS, [1.0], [0.8], [0.8])[0].tolist() == [0]


def test_temperature_scales_the_logits_of_its_own_row_only() -> None:
    # Row 0 at T=2: logits [0, 2 ln 3] -> [0, ln 3] -> probs [1/4, 3/4].
    # Row 1 at T=1: logits [0, 2 ln 3] -> probs [1/10, 9/10]. A draw of 0.2 splits them.
    logits = torch.tensor([[0.0, 2 * LOG3], [0.0, 2 * LOG3]])
    tokens, logprobs = choose_tokens(logits, [2.0, 1.0], [1.0, 1.0], [0.2, 0.2])
    assert tokens.tolist() == [0, 1]
    assert logprobs.tolist() == pytest.approx([math.log(0.25), math.log(0.9)], abs=1e-6)


def test_greedy_rows_take_the_argmax_with_the_untempered_logprob() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0], [1.0, 3.0, 2.0]])
    tokens, logprobs = choose_tokens(logits, [0.0, 1.0], [1.0, 1.0], [0.0, 0.0])
    total = math.log(math.exp(1.0) + math.exp(3.0) + math.exp(2.0))
    assert tokens.tolist() == [1, 0]
    assert logprobs.tolist() == pytest.approx([3.0 - total, 1.0 - total], abs=1e-6)


def test_mixed_groups_in_one_batch_each_follow_their_rule() -> None:
    logits = QUARTERS.expand(3, 2).clone()
    tokens, _ = choose_tokens(logits, [0.0, 1.0, 1.0], [1.0, 1.0, 0.5], [0.1, 0.1, 0.1])
    assert tokens.tolist() == [1, 0, 1]


def test_a_token_with_zero_probability_is_never_drawn() -> None:
    logits = torch.tensor([[float("-inf"), 0.0, float("-inf")]])
    for draw in (0.0, 0.5, 1.0 - 2**-53):
        assert choose_tokens(logits, [1.0], [1.0], [draw])[0].tolist() == [1]


@pytest.mark.parametrize(
    ("top_p", "expected"), [(1.0, [0.2, 0.3, 0.5]), (0.6, [0.0, 0.375, 0.625])]
)
def test_draws_follow_the_distribution(top_p: float, expected: list[float]) -> None:
    # top_p 0.6 keeps tokens 2 (0.5) and 1 (0.3), renormalized to 5/8 and 3/8.
    rows, probs = 40_000, torch.tensor([0.2, 0.3, 0.5])
    logits = probs.log().expand(rows, 3).clone()
    draws = random.Random(0)
    tokens, _ = choose_tokens(
        logits, [1.0] * rows, [top_p] * rows, [draws.random() for _ in range(rows)]
    )
    frequencies = torch.bincount(tokens, minlength=3).double() / rows
    # Three standard errors at p=0.5 and 40k draws is 0.0075.
    assert frequencies.tolist() == pytest.approx(expected, abs=0.0075)
    if expected[0] == 0.0:
        assert frequencies[0].item() == 0.0
