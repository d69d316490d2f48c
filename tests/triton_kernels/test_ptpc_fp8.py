"""Triton PTPC-FP8 quantizer and scaled GEMM vs the torch ops (MODEL_SPEC §6.5).

CPU: Triton's interpreter at small, awkward shapes; GPU (``-m gpu``): proxy linear shapes.
"""

import pytest
import torch


from atomk31.ops.linear import ptpc_linear_quantized_torch, ptpc_quantize_torch
from atomk31.quant.ptpc import quantize_weight_ptpc
from atomk31.triton_kernels.ptpc_fp8 import (
    GemmConfig, ptpc_linear_quantized_triton, ptpc_linear_triton, ptpc_quantize_triton,
)
from assertions import assert_relative_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP8_DTYPES = [torch.float8_e4m3fn, torch.float8_e4m3fnuz]


def random_matrix(rows, cols, seed, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, cols, generator=generator) * 3).to(device=DEVICE, dtype=dtype)


@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=["e4m3fn", "e4m3fnuz"])
@pytest.mark.parametrize("rows,cols", [(1, 1), (5, 300), (3, 5000)], ids=["1x1", "5x300", "3x5000"])
def test_ptpc_quantize_triton_equals_torch(rows, cols, fp8_dtype):
    x = random_matrix(rows, cols, seed=cols)
    x[0, :] = 0.0 if rows > 1 else x[0, :]                   # an all-zero row: scale floor
    expected_q, expected_scale = ptpc_quantize_torch(x, fp8_dtype)
    q, scale = ptpc_quantize_triton(x, fp8_dtype)
    assert q.dtype == fp8_dtype and torch.equal(scale, expected_scale)
    assert torch.equal(q.float(), expected_q.float())


@pytest.mark.parametrize("config", [None, GemmConfig(16, 32, 64, split_k=3)],
                         ids=["auto", "split-k3"])
@pytest.mark.parametrize("m,n,k", [(1, 70, 300), (37, 128, 256)], ids=["M1-N70-K300", "M37-N128-K256"])
def test_ptpc_linear_quantized_triton_matches_torch(m, n, k, config):
    x_q, x_scale = ptpc_quantize_torch(random_matrix(m, k, seed=1))
    w_q, w_scale = quantize_weight_ptpc(random_matrix(n, k, seed=2))
    expected = ptpc_linear_quantized_torch(x_q, x_scale, w_q, w_scale, torch.float32)
    y = ptpc_linear_quantized_triton(x_q, x_scale, w_q, w_scale, torch.float32, config)
    assert_relative_close("y", y, expected, 1e-6)


def test_ptpc_linear_triton_keeps_leading_dims_and_dtype():
    x = random_matrix(6, 256, seed=3).view(2, 3, 256)
    w_q, w_scale = quantize_weight_ptpc(random_matrix(64, 256, seed=4))
    y = ptpc_linear_triton(x, w_q, w_scale)
    assert y.shape == (2, 3, 64) and y.dtype == x.dtype
    expected = ptpc_linear_quantized_torch(*ptpc_quantize_torch(x), w_q, w_scale, x.dtype)
    assert_relative_close("y", y, expected, 1e-6)


def test_ptpc_linear_quantized_triton_rejects_mismatched_k():
    x_q, x_scale = ptpc_quantize_torch(random_matrix(2, 64, seed=5))
    w_q, w_scale = quantize_weight_ptpc(random_matrix(8, 32, seed=6))
    with pytest.raises(ValueError, match=r"expected x_q \[\.\.\., K\]"):
        ptpc_linear_quantized_triton(x_q, x_scale, w_q, w_scale)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 300, 2048], ids=lambda m: f"M{m}")
@pytest.mark.parametrize("n,k", [(7168, 12288), (576, 7168), (24576, 512)],
                         ids=["o_proj", "kv_a", "kv_b"])
def test_ptpc_linear_triton_proxy_shapes_gpu(m, n, k):
    x = random_matrix(m, k, seed=m, dtype=torch.bfloat16)
    w_q, w_scale = quantize_weight_ptpc(random_matrix(n, k, seed=n, dtype=torch.bfloat16))
    x_q, x_scale = ptpc_quantize_triton(x)
    expected_q, expected_scale = ptpc_quantize_torch(x)
    assert torch.equal(x_q.float(), expected_q.float()) and torch.equal(x_scale, expected_scale)
    expected = ptpc_linear_quantized_torch(x_q, x_scale, w_q, w_scale, torch.float32)
    y = ptpc_linear_quantized_triton(x_q, x_scale, w_q, w_scale, torch.float32)
    assert_relative_close("y", y, expected, 1e-5)
