"""Aggregation modes: hand-computed values and gradients, guards, and micro-batch split
invariance."""

from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from rllm_core.algorithms.aggregation import (  # noqa: E402
    AGGREGATION_MODES,
    MaskAwareAggregate,
    make_aggregate,
    seq_reduce,
    step_normalizers,
)
from rllm_core.ports import LossContext  # noqa: E402

# Row 0 has 2 selected tokens, row 1 has 4, row 2 none: the step has 6 tokens, 2 sequences.
VALUES = [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 10.0, 11.0, 12.0]]
MASK = [[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]]

# mode -> (value, per-token gradient on a selected token of row 0, of row 1)
EXPECTED = {
    # (1 + 2 + 5 + 6 + 7 + 8) / 6
    "token-mean": (29 / 6, 1 / 6, 1 / 6),
    # ((1 + 2) / 2 + (5 + 6 + 7 + 8) / 4) / 2 = (1.5 + 6.5) / 2
    "seq-mean-token-mean": (4.0, 1 / 4, 1 / 8),
    # (3 + 26) / 2
    "seq-mean-token-sum": (14.5, 1 / 2, 1 / 2),
    # 29 / (2 * 4)
    "seq-mean-token-sum-norm": (3.625, 1 / 8, 1 / 8),
}


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    values = torch.tensor(VALUES, dtype=torch.float64, requires_grad=True)
    return values, torch.tensor(MASK, dtype=torch.float64)


def test_modes_are_the_documented_four() -> None:
    assert AGGREGATION_MODES == (
        "token-mean",
        "seq-mean-token-mean",
        "seq-mean-token-sum",
        "seq-mean-token-sum-norm",
    )


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_value_and_gradient_are_hand_computed(mode: str) -> None:
    values, mask = _batch()
    aggregate = make_aggregate(mode, total_tokens=6, total_sequences=2, norm_length=4)
    out = aggregate(values, mask)
    (grad,) = torch.autograd.grad(out, values)

    value, row0, row1 = EXPECTED[mode]
    assert out.dim() == 0
    assert out.item() == pytest.approx(value, abs=1e-12)
    expected_grad = torch.tensor(
        [[row0, row0, 0.0, 0.0], [row1, row1, row1, row1], [0.0, 0.0, 0.0, 0.0]],
        dtype=torch.float64,
    )
    torch.testing.assert_close(grad, expected_grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_bool_mask_equals_float_mask(mode: str) -> None:
    values, mask = _batch()
    aggregate = make_aggregate(mode, total_tokens=6, total_sequences=2, norm_length=4)
    assert aggregate(values, mask.bool()).item() == aggregate(values, mask).item()


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_non_finite_values_outside_the_mask_do_not_leak(mode: str) -> None:
    values = torch.tensor(
        [[1.0, 2.0, float("inf"), float("nan")], [5.0, 6.0, 7.0, 8.0], [float("-inf")] * 4],
        dtype=torch.float64,
        requires_grad=True,
    )
    mask = torch.tensor(MASK, dtype=torch.float64)
    aggregate = make_aggregate(mode, total_tokens=6, total_sequences=2, norm_length=4)
    out = aggregate(values, mask)
    (grad,) = torch.autograd.grad(out, values)

    assert out.item() == pytest.approx(EXPECTED[mode][0], abs=1e-12)
    assert torch.all(grad[mask == 0] == 0)


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_empty_step_gives_zero_not_nan(mode: str) -> None:
    values = torch.randn(2, 3, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(2, 3)
    total_tokens, total_sequences = step_normalizers([mask])
    aggregate = make_aggregate(
        mode, total_tokens=total_tokens, total_sequences=total_sequences, norm_length=3
    )
    out = aggregate(values, mask)
    (grad,) = torch.autograd.grad(out, values)

    assert (total_tokens, total_sequences) == (0, 0)
    assert out.item() == 0.0
    assert torch.all(grad == 0)


def test_step_normalizers_divide_a_micro_batch_by_the_whole_step() -> None:
    values, mask = _batch()
    # The step also holds a second micro-batch with 4 more tokens in 2 more sequences.
    aggregate = make_aggregate("token-mean", total_tokens=10, total_sequences=4)
    assert aggregate(values, mask).item() == pytest.approx(29 / 10, abs=1e-12)


def test_step_normalizers_count_tokens_and_non_empty_rows() -> None:
    first = torch.tensor([[1, 1, 0], [0, 0, 0]])
    second = torch.tensor([[True, True, True], [False, True, False], [False, False, False]])
    assert step_normalizers([first, second]) == (6, 3)
    assert step_normalizers([]) == (0, 0)


def test_step_normalizers_reject_a_one_dimensional_mask() -> None:
    with pytest.raises(ValueError, match=r"mask 1 has shape \(3,\)"):
        step_normalizers([torch.ones(2, 3), torch.ones(3)])


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
@pytest.mark.parametrize("sizes", [(2, 4), (1, 5), (3, 3), (1, 1, 1, 1, 1, 1)])
def test_micro_batch_split_invariance(mode: str, sizes: tuple[int, ...]) -> None:
    generator = torch.Generator().manual_seed(7)
    lengths = [5, 2, 7, 0, 3, 6]
    positions = torch.arange(7)
    mask = (positions[None, :] < torch.tensor(lengths)[:, None]).double()
    base = torch.randn(6, 7, dtype=torch.float64, generator=generator)

    full_values = base.clone().requires_grad_(True)
    total_tokens, total_sequences = step_normalizers([mask])
    aggregate = make_aggregate(
        mode, total_tokens=total_tokens, total_sequences=total_sequences, norm_length=7
    )
    full = aggregate(full_values, mask)
    (full_grad,) = torch.autograd.grad(full, full_values)

    split_values = base.clone().requires_grad_(True)
    micro_masks = torch.split(mask, list(sizes))
    micro_totals = step_normalizers(micro_masks)
    assert micro_totals == (total_tokens, total_sequences) == (23, 5)
    step_aggregate = make_aggregate(
        mode, total_tokens=micro_totals[0], total_sequences=micro_totals[1], norm_length=7
    )
    summed = sum(
        step_aggregate(values, micro_mask)
        for values, micro_mask in zip(
            torch.split(split_values, list(sizes)), micro_masks, strict=True
        )
    )
    (split_grad,) = torch.autograd.grad(summed, split_values)

    assert summed.item() == pytest.approx(full.item(), abs=1e-12)
    torch.testing.assert_close(split_grad, full_grad, rtol=0, atol=1e-12)


def test_unknown_mode_names_the_mode_and_the_valid_ones() -> None:
    with pytest.raises(ValueError) as info:
        make_aggregate("sequence-mean", total_tokens=1, total_sequences=1)
    message = str(info.value)
    assert "'sequence-mean'" in message
    for mode in AGGREGATION_MODES:
        assert mode in message


def test_norm_mode_requires_a_norm_length() -> None:
    with pytest.raises(ValueError, match="needs norm_length"):
        make_aggregate("seq-mean-token-sum-norm", total_tokens=4, total_sequences=2)


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "4"])
def test_norm_length_must_be_finite_and_positive(bad: object) -> None:
    with pytest.raises(ValueError, match="norm_length must be a finite positive number"):
        make_aggregate(
            "seq-mean-token-sum-norm", total_tokens=4, total_sequences=2, norm_length=bad
        )


def test_norm_length_is_kept_for_a_call_that_names_the_norm_mode() -> None:
    aggregate = make_aggregate("token-mean", total_tokens=6, total_sequences=2, norm_length=4)
    values, mask = _batch()
    assert aggregate(values, mask, mode="seq-mean-token-sum-norm").item() == 3.625
    assert make_aggregate("token-mean", total_tokens=6, total_sequences=2).norm_length is None


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_a_call_may_name_another_mode_with_the_same_normalizers(mode: str) -> None:
    # Built for token-mean, asked for each mode: the hand-computed values of that mode.
    aggregate = make_aggregate("token-mean", total_tokens=6, total_sequences=2, norm_length=4)
    values, mask = _batch()
    value, grad_row0, grad_row1 = EXPECTED[mode]
    out = aggregate(values, mask, mode=mode)
    out.backward()
    assert out.item() == pytest.approx(value, abs=1e-12)
    assert values.grad is not None
    assert values.grad[0, 0].item() == pytest.approx(grad_row0, abs=1e-12)
    assert values.grad[1, 3].item() == pytest.approx(grad_row1, abs=1e-12)
    assert values.grad[2].abs().sum().item() == 0.0 and values.grad[0, 2:].abs().sum() == 0.0


def test_a_call_naming_an_unknown_mode_or_the_norm_mode_without_a_length_is_refused() -> None:
    aggregate = make_aggregate("token-mean", total_tokens=6, total_sequences=2)
    values, mask = _batch()
    with pytest.raises(ValueError, match=r"aggregate\(mode='token-sum'\).*valid modes"):
        aggregate(values, mask, mode="token-sum")
    with pytest.raises(ValueError, match=r"\[algorithm\]\.norm_length"):
        aggregate(values, mask, mode="seq-mean-token-sum-norm")


def test_the_mask_aware_aggregate_passes_the_mode_to_the_side_it_picks() -> None:
    values, mask = _batch()
    observation = torch.zeros_like(mask)
    observation[2, 0] = 1.0
    aggregate = MaskAwareAggregate(
        action=make_aggregate("token-mean", total_tokens=6, total_sequences=2),
        observation=make_aggregate("token-mean", total_tokens=1, total_sequences=1),
        action_mask=mask,
        observation_mask=observation,
    )
    assert aggregate(values, mask, mode="seq-mean-token-sum").item() == 14.5
    assert aggregate(values, observation, mode="seq-mean-token-sum").item() == 9.0


@pytest.mark.parametrize(
    ("how", "expected"), [("sum", [3.0, 26.0, 0.0]), ("mean", [1.5, 6.5, 0.0])]
)
def test_seq_reduce_gives_one_value_per_sequence(how: str, expected: list[float]) -> None:
    values, mask = _batch()
    values.data[0, 3] = float("nan")  # outside the mask: never reaches the result
    out = seq_reduce(values, mask, how)
    assert out.tolist() == expected
    out.sum().backward()
    assert values.grad is not None
    per_token = [1.0, 1.0] if how == "sum" else [0.5, 0.25]
    assert values.grad[0].tolist() == [per_token[0], per_token[0], 0.0, 0.0]
    assert values.grad[1].tolist() == [per_token[1]] * 4
    assert values.grad[2].tolist() == [0.0] * 4


def test_seq_reduce_refuses_an_unknown_reduction_and_mismatched_shapes() -> None:
    values, mask = _batch()
    with pytest.raises(ValueError, match=r"how='max'.*valid: sum, mean"):
        seq_reduce(values, mask, "max")
    with pytest.raises(ValueError, match=r"\(3, 4\) and mask \(3,\)"):
        seq_reduce(values, mask[:, 0])


def test_the_loss_context_reduces_over_its_action_mask_by_default() -> None:
    values, mask = _batch()
    ctx = LossContext(
        logprobs=values,
        old_logprobs=values.detach(),
        rollout_logprobs=values.detach(),
        advantages=torch.zeros_like(mask),
        action_mask=mask,
        observation_mask=torch.ones_like(mask) - mask,
        aggregate=make_aggregate("token-mean", total_tokens=6, total_sequences=2),
    )
    assert ctx.seq_reduce(values, how="sum").tolist() == [3.0, 26.0, 0.0]
    assert ctx.seq_reduce(values, ctx.observation_mask).tolist() == [3.5, 0.0, 10.5]


@pytest.mark.parametrize(
    ("field", "bad"), [("total_tokens", -1), ("total_sequences", 2.5), ("total_tokens", None)]
)
def test_counts_must_be_non_negative_integers(field: str, bad: object) -> None:
    counts: dict[str, object] = {"total_tokens": 4, "total_sequences": 2, field: bad}
    with pytest.raises(ValueError, match=f"{field} must be a non-negative integer"):
        make_aggregate("token-mean", **counts)  # type: ignore[arg-type]


def test_shape_mismatch_names_both_shapes() -> None:
    aggregate = make_aggregate("token-mean", total_tokens=4, total_sequences=2)
    with pytest.raises(ValueError, match=r"values \(2, 3\) and mask \(2, 4\)"):
        aggregate(torch.zeros(2, 3), torch.zeros(2, 4))


def test_importing_the_module_or_the_core_does_not_import_torch() -> None:
    code = (
        "import sys, rllm_core\n"
        "assert 'rllm_core.algorithms.aggregation' not in sys.modules\n"
        "from rllm_core.algorithms.aggregation import AGGREGATION_MODES\n"
        "assert 'torch' not in sys.modules, 'aggregation imported torch'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
