"""situ_glu (torch) against a per-element math loop and the oracle (§4.8)."""

import math

import pytest
import torch

from atomk31.ops.activation import situ_glu_torch
from atomk31.reference.mlp import situ_glu as reference_situ_glu


def naive_situ(a: float, b: float, beta: float, linear_beta: float | None) -> float:
    gate = beta * math.tanh(a / beta) / (1 + math.exp(-a))
    up = b if linear_beta is None else linear_beta * math.tanh(b / linear_beta)
    return gate * up


CAPS = {"beta4-lin25": (4.0, 25.0), "beta4-nolin": (4.0, None), "beta1-lin3": (1.0, 3.0)}


@pytest.mark.parametrize("caps", CAPS.values(), ids=CAPS.keys())
@pytest.mark.parametrize("shape", [(0, 5), (1, 1), (3, 37)], ids=["T0-F5", "T1-F1", "T3-F37"])
def test_situ_glu_torch_matches_element_loop(shape, caps):
    torch.manual_seed(0)
    beta, linear_beta = caps
    gate, up = torch.randn(shape) * 10, torch.randn(shape) * 40
    out = situ_glu_torch(gate, up, beta, linear_beta)
    expected = [naive_situ(a, b, beta, linear_beta)
                for a, b in zip(gate.reshape(-1).tolist(), up.reshape(-1).tolist())]
    assert out.shape == shape and out.dtype == torch.float32
    torch.testing.assert_close(out.reshape(-1).double(), torch.tensor(expected, dtype=torch.float64),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, reference_situ_glu(gate, up, beta, linear_beta), rtol=1e-6, atol=1e-6)


def test_situ_glu_torch_caps_both_branches():
    out = situ_glu_torch(torch.tensor([100.0, -100.0]), torch.tensor([1000.0, 1000.0]), 4.0, 25.0)
    torch.testing.assert_close(out, torch.tensor([100.0, 0.0]), rtol=1e-6, atol=1e-6)


def test_situ_glu_torch_bf16_rounds_once():
    torch.manual_seed(1)
    gate, up = torch.randn(4, 64).bfloat16(), torch.randn(4, 64).bfloat16()
    out = situ_glu_torch(gate, up, 4.0, 25.0)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, situ_glu_torch(gate.float(), up.float(), 4.0, 25.0).bfloat16())


def test_situ_glu_torch_rejects_bad_inputs():
    with pytest.raises(ValueError, match="gate and up must have the same shape and dtype"):
        situ_glu_torch(torch.randn(2, 4), torch.randn(2, 5), 4.0, None)
    with pytest.raises(ValueError, match="beta and linear_beta must be positive"):
        situ_glu_torch(torch.randn(2, 4), torch.randn(2, 4), 0.0, None)
