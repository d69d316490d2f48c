"""The Hopper Gluon indexer's query preparation (gluon_kernels/hopper/indexer_score_query_prep.py,
one Triton launch) against the contract's quantizer, bit for bit: under Triton's interpreter on
the CPU, compiled on an sm_90 GPU (``-m gpu``).
"""

import os

import pytest
import torch

from atomk31.quant.index_keys import quantize_index_keys

IS_HOPPER = torch.cuda.is_available() and torch.version.hip is None and \
    torch.cuda.get_device_capability()[0] == 9
hopper = pytest.mark.skipif(not IS_HOPPER, reason="needs an NVIDIA sm_90 GPU (wgmma, TMA)")
DEVICE = "cuda"


def awkward_queries(num_rows, num_heads, dtype, seed):
    """Queries whose quantization takes every path: an all-zero head (the amax floor), a head
    below the floor, heads whose largest values divide to ~448 (saturation), values that land
    in e4m3's subnormals and under half its smallest step, fp32 subnormals, -0, and random
    magnitudes over 2^-20..2^20."""
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(num_rows, num_heads, 128, generator=generator)
    q *= torch.exp2(torch.randint(-20, 21, (num_rows, num_heads, 1), generator=generator).float())
    q[0, 0] = 0.0
    q[0, 1] = 3e-5 * torch.randn(128, generator=generator)  # amax under the 1e-4 floor
    q[0, 2, :64] = 1.0 / 448 * torch.arange(64) * 2.0**-8  # codes 0, 2^-9.. (subnormals)
    q[0, 2, 64] = 1.0
    q[0, 2, 65:68] = torch.tensor([1.0, 2.0, 3.0]) * 2.0**-11 / 448  # under / at / over half a step
    q[0, 3, :] = -0.0
    q[0, 3, 5] = 7.0
    if num_rows > 1:
        q[1, 0, :] = 448.0 * (1 - torch.rand(128, generator=generator) * 2.0**-10)
        q[1, 0, 3] = -448.0
        q[1, 1, :8] = torch.tensor([1e-40, -1e-39, 1e-38, 0.0, 2e-45, -0.0, 5.0, -5.0])
    return q.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_query_prep_is_bit_exact_with_the_quantizer(dtype, device="cpu"):
    """The launcher's one-launch query preparation (a Triton kernel, run here by the
    interpreter; compiled on the GPU below) against the contract's quantizer: codes bit for
    bit (as FP16), padded heads zero, weights x query scales bit for bit (zero past H_I); a
    strided q view."""
    from gluon_kernels.hopper.indexer_score_query_prep import prepare_queries

    if device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("CPU tensors need Triton's interpreter (the GPU variant runs compiled)")
    num_rows, num_heads, heads_pad = 3, 20, 32
    q = awkward_queries(num_rows, num_heads, dtype, seed=23)
    wide = torch.full((num_rows, 2 * num_heads, 128), float("nan"), dtype=dtype)
    wide[:, ::2] = q
    q = wide[:, ::2]  # strided heads: a view, as a caller's slice
    weights = torch.randn(num_rows, num_heads, generator=torch.Generator().manual_seed(24))
    codes, folded = prepare_queries(q.to(device), weights.to(device), heads_pad)
    codes, folded = codes.cpu(), folded.cpu()
    want_values, want_scales = quantize_index_keys(q, "fp8", "e4m3fn")
    want_codes = want_values.to(torch.float16)
    assert codes.dtype == want_codes.dtype and codes.shape == (num_rows, heads_pad, 128)
    assert torch.equal(codes[:, :num_heads].view(torch.int16), want_codes.view(torch.int16))
    assert not codes[:, num_heads:].view(torch.int16).any()
    want_weights = weights.float() * want_scales
    assert torch.equal(folded[:, :num_heads].view(torch.int32), want_weights.view(torch.int32))
    assert not folded[:, num_heads:].any()
    # the awkward paths were taken
    assert want_scales[0, 0] == want_scales[0, 1] == torch.tensor(1e-4) / 448.0
    assert (want_values[1, 0].float().abs() == 448).sum() >= 2
    assert ((want_values[0, 2].float().abs() > 0) & (want_values[0, 2].float().abs() < 2**-6)).any()


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_query_prep_compiled_is_bit_exact_with_the_quantizer(dtype):
    test_query_prep_is_bit_exact_with_the_quantizer(dtype, device=DEVICE)
