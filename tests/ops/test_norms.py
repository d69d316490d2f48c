"""rms_norm / gated_rms_norm / layer_norm (torch) against per-row loops and the oracle (§4.2, §4.4)."""

import math

import pytest
import torch

from atomk31.ops.norms import gated_rms_norm_torch, layer_norm_torch, rms_norm_torch
from atomk31.reference import norms as reference

SHAPES = {"T0-D7": (0, 7), "T1-D7": (1, 7), "T5-D33": (5, 33), "B2-T3-H4-D16": (2, 3, 4, 16)}


def naive_rms_norm_row(row: list[float], weight: list[float], eps: float) -> list[float]:
    inverse = 1.0 / math.sqrt(sum(x * x for x in row) / len(row) + eps)
    return [w * x * inverse for x, w in zip(row, weight)]


def naive_layer_norm_row(row: list[float], weight: list[float], bias: list[float], eps: float) -> list[float]:
    mean = sum(row) / len(row)
    variance = sum((x - mean) ** 2 for x in row) / len(row)
    return [w * (x - mean) / math.sqrt(variance + eps) + b for x, w, b in zip(row, weight, bias)]


def rows_of(x: torch.Tensor) -> list[list[float]]:
    return x.reshape(-1, x.shape[-1]).double().tolist()


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_rms_norm_torch_matches_row_loop(shape):
    torch.manual_seed(0)
    x, weight = torch.randn(shape) * 3, torch.randn(shape[-1])
    out = rms_norm_torch(x, weight, 1e-5)
    expected = [naive_rms_norm_row(r, weight.tolist(), 1e-5) for r in rows_of(x)]
    assert out.shape == x.shape and out.dtype == torch.float32
    torch.testing.assert_close(out.reshape(-1, shape[-1]).double(),
                               torch.tensor(expected, dtype=torch.float64).reshape(-1, shape[-1]),
                               rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out, reference.rms_norm(x, weight, 1e-5), rtol=1e-6, atol=1e-6)


def test_rms_norm_torch_bf16_rounds_once_from_fp32():
    torch.manual_seed(1)
    x, weight = torch.randn(4, 64).bfloat16(), torch.randn(64).bfloat16()
    out = rms_norm_torch(x, weight, 1e-5)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, rms_norm_torch(x.float(), weight.float(), 1e-5).bfloat16())


def test_rms_norm_torch_eps_dominates_zero_rows():
    out = rms_norm_torch(torch.zeros(2, 8), torch.ones(8), 1e-5)
    assert torch.equal(out, torch.zeros(2, 8))


def test_gated_rms_norm_torch_matches_loop_per_head():
    torch.manual_seed(2)
    x, gate, weight = torch.randn(3, 4, 20), torch.randn(3, 4, 20) * 4, torch.randn(20)
    out = gated_rms_norm_torch(x, gate, weight, 1e-5)
    for t in range(3):
        for h in range(4):
            normed = naive_rms_norm_row(x[t, h].double().tolist(), weight.tolist(), 1e-5)
            expected = [n / (1 + math.exp(-gv)) for n, gv in zip(normed, gate[t, h].tolist())]
            torch.testing.assert_close(out[t, h].double(), torch.tensor(expected, dtype=torch.float64),
                                       rtol=1e-6, atol=1e-6)


def test_gated_rms_norm_torch_empty_and_bf16():
    empty = gated_rms_norm_torch(torch.zeros(0, 2, 8), torch.zeros(0, 2, 8), torch.ones(8), 1e-5)
    assert empty.shape == (0, 2, 8)
    x, gate = torch.randn(2, 2, 8).bfloat16(), torch.randn(2, 2, 8).bfloat16()
    assert gated_rms_norm_torch(x, gate, torch.ones(8), 1e-5).dtype == torch.bfloat16


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_layer_norm_torch_matches_row_loop(shape):
    torch.manual_seed(3)
    x, weight, bias = torch.randn(shape) + 2, torch.randn(shape[-1]), torch.randn(shape[-1])
    out = layer_norm_torch(x, weight, bias, 1e-6)
    expected = [naive_layer_norm_row(r, weight.tolist(), bias.tolist(), 1e-6) for r in rows_of(x)]
    torch.testing.assert_close(out.reshape(-1, shape[-1]).double(),
                               torch.tensor(expected, dtype=torch.float64).reshape(-1, shape[-1]),
                               rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, reference.layer_norm(x, weight, bias, 1e-6), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out, torch.nn.functional.layer_norm(x, (shape[-1],), weight, bias, 1e-6),
                               rtol=1e-5, atol=1e-5)


def test_norms_reject_wrong_weight_shapes():
    x = torch.randn(2, 8)
    with pytest.raises(ValueError, match=r"rms_norm: weight must have shape \[8\].*got \(7,\)"):
        rms_norm_torch(x, torch.ones(7), 1e-5)
    with pytest.raises(ValueError, match=r"layer_norm: bias must have shape \[8\]"):
        layer_norm_torch(x, torch.ones(8), torch.ones(2, 8), 1e-6)
    with pytest.raises(ValueError, match="gated_rms_norm: gate must have the shape of x"):
        gated_rms_norm_torch(torch.randn(2, 2, 8), torch.randn(2, 8), torch.ones(8), 1e-5)
