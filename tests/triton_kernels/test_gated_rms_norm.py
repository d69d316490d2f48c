"""Triton gated RMSNorm (KDA o_norm) and its FP8-emitting variant vs the torch ops.

The interpreter truncates fp32 -> BF16 casts, so CPU runs use fp32 activations; the GPU test
(``-m gpu``) checks BF16 at real shapes.
"""

import pytest
import torch


from atomk31.ops.linear import ptpc_quantize_torch
from atomk31.ops.norms import gated_rms_norm_torch
from atomk31.triton_kernels.gated_rms_norm import (
    gated_rms_norm_fp8_triton, gated_rms_norm_triton,
)
from assertions import assert_relative_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def random_rows(num_tokens, num_heads, value_dim, seed, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_tokens, num_heads, value_dim, generator=generator) * 2
    gate = torch.randn(num_tokens, num_heads, value_dim, generator=generator)
    weight = torch.randn(value_dim, generator=generator)
    return x.to(DEVICE, dtype), gate.to(DEVICE, dtype), weight.to(DEVICE)


@pytest.mark.parametrize("num_tokens,num_heads,value_dim", [(1, 1, 128), (17, 3, 128), (5, 2, 100)],
                         ids=["T1-H1-V128", "T17-H3-V128", "T5-H2-V100"])
def test_gated_rms_norm_triton_matches_torch(num_tokens, num_heads, value_dim):
    x, gate, weight = random_rows(num_tokens, num_heads, value_dim, seed=value_dim)
    expected = gated_rms_norm_torch(x, gate, weight, 1e-5)
    assert_relative_close("y", gated_rms_norm_triton(x, gate, weight, 1e-5), expected, 1e-6)


@pytest.mark.parametrize("fp8_dtype", [torch.float8_e4m3fn, torch.float8_e4m3fnuz],
                         ids=["e4m3fn", "e4m3fnuz"])
def test_gated_rms_norm_fp8_triton_equals_norm_then_quantize(fp8_dtype):
    x, gate, weight = random_rows(6, 3, 128, seed=1)
    expected_q, expected_scale = ptpc_quantize_torch(
        gated_rms_norm_torch(x, gate, weight, 1e-5).reshape(6, -1), fp8_dtype)
    q, scale = gated_rms_norm_fp8_triton(x, gate, weight, 1e-5, fp8_dtype)
    assert_relative_close("scale", scale, expected_scale, 1e-6)
    assert_relative_close("q", q.float(), expected_q.float(), 0.07)   # one FP8 step at most
    assert (q.float() != expected_q.float()).float().mean() < 0.01


def test_gated_rms_norm_triton_rejects_mismatched_gate():
    x, gate, weight = random_rows(2, 2, 128, seed=2)
    with pytest.raises(ValueError, match=r"gate must have the shape of x \(2, 2, 128\)"):
        gated_rms_norm_triton(x, gate[:1], weight, 1e-5)


@pytest.mark.gpu
def test_gated_rms_norm_triton_real_shapes_gpu():
    x, gate, weight = random_rows(3000, 96, 128, seed=3, dtype=torch.bfloat16)
    expected = gated_rms_norm_torch(x, gate, weight, 1e-5)
    y = gated_rms_norm_triton(x, gate, weight, 1e-5)
    assert_relative_close("y", y.float(), expected.float(), 1e-2)
    q, scale = gated_rms_norm_fp8_triton(x, gate, weight, 1e-5)
    expected_q, expected_scale = ptpc_quantize_torch(expected.reshape(3000, -1))
    assert_relative_close("scale", scale, expected_scale, 1e-2)
    assert (q.float() != expected_q.float()).float().mean() < 0.01
