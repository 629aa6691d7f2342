"""Datums to Tinker datums: the shift by one and the padded tensors."""

from __future__ import annotations

import pytest
import torch
from rllm_core.types import Datum
from rllm_trainer_backend_tinker.batch import build_batch, logprobs_matrix


def _datum(tokens, action, observation=None, logprobs=None, advantages=None):
    n = len(tokens)
    return Datum(
        token_ids=tokens,
        logprobs=logprobs or [0.0] * n,
        advantages=advantages or [0.0] * n,
        action_mask=action,
        observation_mask=observation or [False] * n,
    )


def test_tinker_datum_is_the_sequence_shifted_by_one():
    batch = build_batch([_datum([5, 1, 2, 3], [False, False, True, True])])
    (datum,) = batch.tinker_datums
    assert datum.model_input.to_ints() == [5, 1, 2]
    assert datum.loss_fn_inputs["target_tokens"].tolist() == [1, 2, 3]
    assert datum.loss_fn_inputs["target_tokens"].dtype == "int64"
    assert datum.loss_fn_inputs["weights"].tolist() == [0.0, 1.0, 1.0]


def test_tensors_are_right_padded_with_zeros():
    batch = build_batch(
        [
            _datum(
                [1, 2, 3],
                [False, True, True],
                logprobs=[0.0, -0.5, -0.25],
                advantages=[0.0, 2.0, 2.0],
            ),
            _datum([4, 5], [False, False], observation=[False, True]),
        ]
    )
    assert batch.lengths == [3, 2]
    assert batch.rollout_logprobs.tolist() == [[0.0, -0.5, -0.25], [0.0, 0.0, 0.0]]
    assert batch.advantages.tolist() == [[0.0, 2.0, 2.0], [0.0, 0.0, 0.0]]
    assert batch.action_mask.tolist() == [[0.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    assert batch.observation_mask.tolist() == [[0.0, 0.0, 0.0], [0.0, 1.0, 0.0]]


def test_logprobs_matrix_aligns_target_logprobs_with_tokens_and_keeps_gradients():
    batch = build_batch([_datum([1, 2, 3], [False, True, True]), _datum([4, 5], [False, True])])
    first = torch.tensor([-1.0, -2.0], requires_grad=True)
    second = torch.tensor([-3.0], requires_grad=True)
    matrix = logprobs_matrix([first, second], batch)
    assert matrix.tolist() == [[0.0, -1.0, -2.0], [0.0, -3.0, 0.0]]
    (matrix * torch.tensor([[5.0, 6.0, 7.0], [8.0, 9.0, 10.0]])).sum().backward()
    assert first.grad.tolist() == [6.0, 7.0]
    assert second.grad.tolist() == [9.0]


def test_logprobs_matrix_refuses_a_wrong_count():
    batch = build_batch([_datum([1, 2, 3], [False, True, True])])
    with pytest.raises(RuntimeError, match="returned 1 logprobs for datum 0, which has 2"):
        logprobs_matrix([torch.tensor([-1.0])], batch)


@pytest.mark.parametrize(
    ("datums", "fragment"),
    [
        ([], "no datums"),
        ([_datum([7], [False])], "datum 0 has 1 token"),
        (
            [_datum([1, 2], [False, True]), _datum([1, -2], [False, True])],
            "datum 1 has token id -2",
        ),
        ([_datum([1, 2], [True, True])], "datum 0 marks its first token as an action"),
    ],
)
def test_invalid_datums_are_named(datums, fragment):
    with pytest.raises(ValueError, match=fragment):
        build_batch(datums)
