"""The binary divergences against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch
from rllm_loss_dppo.divergence import binary_kl, binary_tv

# (p current, q old) as logs: ln 0.8 = -0.2231435513142097, ln 0.5 = -0.6931471805599453,
# ln 0.1 = -2.3025850929940455, ln 0.01 = -4.605170185988091
LOGP = torch.tensor(
    [[-0.2231435513142097, -0.6931471805599453, -2.3025850929940455]], dtype=torch.float64
)
LOGQ = torch.tensor(
    [[-0.6931471805599453, -0.2231435513142097, -4.605170185988091]], dtype=torch.float64
)


def test_tv():
    torch.testing.assert_close(
        binary_tv(LOGP.double(), LOGQ.double()),
        torch.tensor([[0.3, 0.3, 0.09]], dtype=torch.float64),
    )


def test_kl_is_old_to_current():
    """KL(old || current) = q ln(q / p) + (1 - q) ln((1 - q + 1e-8) / (1 - p + 1e-8)), with p
    the current and q the old probability (the DPPO reference implementation's direction)."""
    # 0.5 ln(0.5/0.8) + 0.5 ln(0.5/0.2); 0.8 ln 1.6 + 0.2 ln(0.2/0.5);
    # 0.01 ln 0.1 + 0.99 ln(0.99/0.9), each second logarithm with 1e-8 added to both terms
    torch.testing.assert_close(
        binary_kl(LOGP.double(), LOGQ.double()),
        torch.tensor(
            [[0.2231435363142104, 0.1927447630217573, 0.07133122607634115]], dtype=torch.float64
        ),
        rtol=1e-12,
        atol=0.0,
    )


def test_kl_is_not_symmetric():
    # Swapping the arguments gives the other direction: KL(current || old).
    forward = binary_kl(LOGP.double(), LOGQ.double())
    backward = binary_kl(LOGQ.double(), LOGP.double())
    assert not torch.allclose(forward, backward)


def test_identical_distributions_have_zero_divergence():
    logs = torch.tensor([[-0.1, -3.0, -20.0, 0.0]])
    assert torch.equal(binary_tv(logs, logs), torch.zeros_like(logs))
    assert torch.equal(binary_kl(logs, logs), torch.zeros_like(logs))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kl_is_finite_at_probability_one(dtype):
    # q = 1 (old), p = 0.5 (current): the (1 - q) term vanishes, KL = ln 2
    logp = torch.tensor([[-0.6931471805599453]], dtype=dtype)
    logq = torch.tensor([[0.0]], dtype=dtype)
    assert binary_kl(logp, logq).item() == pytest.approx(0.6931471805599453, rel=1e-6)
    # p = 1, q = 0.5: infinite in exact arithmetic; with the 1e-8 it is
    # 0.5 ln 0.5 + 0.5 ln((0.5 + 1e-8) / 1e-8) = 8.517193201416239
    reverse = binary_kl(logq, logp).item()
    assert math.isfinite(reverse)
    assert reverse == pytest.approx(8.517193201416239, rel=1e-6)


def test_positive_logprobs_count_as_probability_one():
    assert binary_tv(torch.tensor([[0.5]]), torch.tensor([[0.0]])).item() == 0.0
    assert binary_kl(torch.tensor([[0.5]]), torch.tensor([[0.0]])).item() == 0.0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_inputs_are_computed_in_float32(dtype):
    logp = torch.tensor([[-0.2231435513142097]], dtype=dtype, requires_grad=True)
    logq = torch.tensor([[-0.6931471805599453]], dtype=dtype)
    for divergence in (binary_tv, binary_kl):
        value = divergence(logp, logq)
        assert value.dtype == torch.float32
        assert not value.requires_grad
