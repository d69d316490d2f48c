"""Triton PTPC-FP8 quantizer and scaled pointer GEMM vs the torch ops (MODEL_SPEC §6.5).

CPU: Triton's interpreter at small, awkward shapes (fp32 products there, so within 1e-6 of
the torch op), and the launcher's tile choice per target. GPU (``-m gpu``): proxy linear
shapes, where the FP8 tensor cores sum with reduced precision (see FP8_GEMM_TOLERANCE).
"""

import pytest
import torch

from atomk31.ops.linear import ptpc_linear_quantized_torch, ptpc_quantize_torch
from atomk31.quant.ptpc import quantize_weight_ptpc
from atomk31.triton_kernels.ptpc_fp8 import (
    GemmConfig, GemmTarget, pick_config_for_target, ptpc_linear_quantized_triton,
    ptpc_linear_triton, ptpc_quantize_triton, split_k_to_fill,
)
from assertions import assert_relative_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP8_DTYPES = [torch.float8_e4m3fn, torch.float8_e4m3fnuz]
H200 = GemmTarget(num_sms=132, is_amd=False)
GFX942 = GemmTarget(num_sms=304, is_amd=True)
GFX942_LDS_BYTES = 64 << 10

# Max-abs error over max-abs output of the FP8 GEMM (fp32 out) against fp32 math of the same
# quantized values. Hopper's FP8 wgmma keeps ~13-14 mantissa bits of its running sum; the
# kernel promotes that partial sum into fp32 every 128 K elements, and so does cuBLASLt: on
# the H200 both measured the same error to three digits (1.3-1.6e-4; 3.3-3.5e-4 at kv_b,
# K = 512, M = 300 / 2048), against 1e-3 to 9e-3 without promotion. So the GPU test allows
# SCALED_MM_ERROR_FACTOR x torch._scaled_mm's error on the same inputs + SCALED_MM_ERROR_SLACK,
# and FP8_GEMM_TOLERANCE where _scaled_mm cannot be measured (a simulation of the promoted
# accumulator gave 1.2-1.5e-4 for K = 512..12288; 3e-4 is twice that).
FP8_GEMM_TOLERANCE = 3e-4
SCALED_MM_ERROR_FACTOR = 1.25
SCALED_MM_ERROR_SLACK = 1e-5


def random_matrix(rows, cols, seed, dtype=torch.float32):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, cols, generator=generator) * 3).to(device=DEVICE, dtype=dtype)


@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=["e4m3fn", "e4m3fnuz"])
@pytest.mark.parametrize("rows,cols", [(1, 1), (5, 300), (3, 5000), (0, 64)],
                         ids=["1x1", "5x300", "3x5000", "0x64"])
def test_ptpc_quantize_triton_equals_torch(rows, cols, fp8_dtype):
    x = random_matrix(rows, cols, seed=cols)
    if rows > 1:
        x[0, :] = 0.0                                         # an all-zero row: scale floor
    expected_q, expected_scale = ptpc_quantize_torch(x, fp8_dtype)
    q, scale = ptpc_quantize_triton(x, fp8_dtype)
    assert q.dtype == fp8_dtype and torch.equal(scale, expected_scale)
    assert torch.equal(q.float(), expected_q.float())


def amax_values_off_by_reciprocal(fmax: float, count: int) -> torch.Tensor:
    """fp32 amax values whose ``amax * fp32(1 / fmax)`` is not the correctly rounded
    ``amax / fmax`` (what CUDA's tensor-by-scalar division computes), so a quantizer that
    divides that way fails on them."""
    candidates = torch.rand(4096, generator=torch.Generator().manual_seed(7)) * 64 + 1e-3
    exact = (candidates.double() / fmax).float()
    by_reciprocal = candidates * torch.tensor(1 / fmax, dtype=torch.float32)
    off = candidates[by_reciprocal != exact][:count]
    assert off.numel() == count
    return off


@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES, ids=["e4m3fn", "e4m3fnuz"])
def test_ptpc_quantize_torch_is_correctly_rounded(fp8_dtype):
    """The torch op defines the contract: scale = amax / fmax and x / scale, each the correctly
    rounded fp32 quotient (float64 division rounded once to fp32 is exactly that), on any
    device. Rows use amax values where dividing by the rounded reciprocal is an ulp off."""
    fmax = torch.finfo(fp8_dtype).max
    amax = amax_values_off_by_reciprocal(fmax, 24)
    x = torch.randn(24, 300, generator=torch.Generator().manual_seed(8)).clamp(-3, 3)
    x = x / x.abs().amax(1, keepdim=True) * amax[:, None]
    x = x.to(DEVICE)
    q, scale = ptpc_quantize_torch(x, fp8_dtype)
    exact_scale = (x.double().abs().amax(1) / fmax).float()
    exact_q = (x.double() / exact_scale.double()[:, None]).float().clamp(-fmax, fmax)
    assert torch.equal(scale, exact_scale)
    assert torch.equal(q.float(), exact_q.to(fp8_dtype).float())
    q, scale = ptpc_quantize_torch(x[0], fp8_dtype)                     # a single token
    assert torch.equal(scale, exact_scale[0])
    assert torch.equal(q.float(), exact_q[0].to(fp8_dtype).float())


@pytest.mark.parametrize("config", [None, GemmConfig(16, 32, 64, split_k=3),
                                    GemmConfig(32, 64, 32, split_k=2)],
                         ids=["auto", "split-k3", "split-k2-block-k32"])
@pytest.mark.parametrize("m,n,k", [(1, 70, 300), (37, 128, 256), (0, 16, 64)],
                         ids=["M1-N70-K300", "M37-N128-K256", "M0-N16-K64"])
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


@pytest.mark.parametrize("tiles,k,block_k,expected", [
    (112, 12288, 256, 1),      # o_proj decode: the tiles already cover half the SMs
    (9, 7168, 256, 7),         # kv_a decode: 28 K tiles, at least 4 per split
    (10, 7168, 128, 12),       # kv_a M=128: 13 wanted, 56 K tiles -> 12 splits of 5
    (1, 300, 64, 1),           # too short to split
])
def test_split_k_to_fill(tiles, k, block_k, expected):
    split = split_k_to_fill(tiles, k, block_k, num_sms=132)
    assert split == expected
    k_tiles = -(-k // block_k)
    per_split = -(-k_tiles // split)
    assert (split - 1) * per_split < k_tiles                # no split is empty


@pytest.mark.parametrize("m", [1, 16, 48, 128, 300, 1024, 4096])
@pytest.mark.parametrize("n,k", [(7168, 12288), (576, 7168), (24576, 512)],
                         ids=["o_proj", "kv_a", "kv_b"])
def test_pick_config_fits_gfx942_lds_and_promotes_on_h200(m, n, k):
    """gfx942 has 64 KiB of LDS; its stream pipeliner keeps num_stages - 1 tiles of A and B
    in flight (the 128x128x128, 4-stage config needed 96 KiB and failed to compile)."""
    amd = pick_config_for_target(m, n, k, GFX942)
    lds = (amd.block_m + amd.block_n) * amd.block_k * max(amd.num_stages - 1, 1)
    assert lds <= GFX942_LDS_BYTES and amd.promote_every is None
    nvidia = pick_config_for_target(m, n, k, H200)
    assert nvidia.promote_every is not None and nvidia.promote_every <= nvidia.block_k


@pytest.mark.parametrize("m, n, k, want", [
    (1, 576, 7168, (16, 64, 512, 1, 4, 3)),         # kv_a decode: no split K on CUDA, and
    (16, 576, 7168, (16, 64, 512, 1, 4, 3)),        # 9 tiles: 512-K steps
    (1, 7168, 12288, (16, 64, 512, 1, 4, 3)),       # o_proj decode: 112 tiles
    (1, 36864, 7168, (16, 64, 256, 1, 4, 4)),       # kda qkv decode: 576 tiles
    (48, 576, 7168, (64, 64, 256, 7, 4, 4)),        # M 17-64: split K
    (128, 7168, 12288, (64, 128, 256, 1, 8, 3)),    # o_proj M = 128: unsplit, 256-K steps
    (128, 576, 7168, (64, 128, 128, 12, 4, 4)),     # kv_a M = 128: split K
    (1024, 576, 7168, (128, 128, 128, 3, 8, 4)),    # kv_a M = 1024 (the "narrow" class)
    (4096, 7168, 12288, (128, 128, 128, 1, 8, 4)),
])
def test_pick_config_cuda_defaults_on_h200(m, n, k, want):
    config = pick_config_for_target(m, n, k, H200)
    assert (config.block_m, config.block_n, config.block_k, config.split_k, config.num_warps,
            config.num_stages) == want


def test_pick_config_amd_keeps_the_portable_tiles():
    assert pick_config_for_target(1, 576, 7168, GFX942).split_k > 1
    amd = pick_config_for_target(128, 7168, 12288, GFX942)
    assert (amd.block_m, amd.block_n, amd.block_k, amd.num_warps) == (64, 128, 128, 4)


def quantizer_mismatch_report(x, q, scale, expected_q, expected_scale) -> str:
    """Where the Triton quantizer and the torch op disagree, with float64 arithmetic as the
    judge (which side is off, and for which values)."""
    fmax = torch.finfo(q.dtype).max
    exact_scale = (x.double().abs().amax(-1).clamp_min(1e-12) / fmax).float()
    rows = (scale != expected_scale).nonzero().flatten().tolist()
    bad = (q.float() != expected_q.float()).nonzero().tolist()
    lines = [f"{len(rows)} scale rows differ (triton==exact: "
             f"{torch.equal(scale, exact_scale)}, torch==exact: "
             f"{torch.equal(expected_scale, exact_scale)}); {len(bad)} q elements differ"]
    for i, j in bad[:6]:
        value = x[i, j].double() / expected_scale[i].double()
        lines.append(f"  [{i},{j}] x={x[i, j].item()!r} x/scale(f64)={value.item()!r} "
                     f"triton={q[i, j].float().item()!r} torch={expected_q[i, j].float().item()!r}")
    return "\n".join(lines)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 300, 2048], ids=lambda m: f"M{m}")
@pytest.mark.parametrize("k", [12288, 7168, 512], ids=lambda k: f"K{k}")
def test_ptpc_quantize_triton_proxy_shapes_gpu(m, k):
    x = random_matrix(m, k, seed=m, dtype=torch.bfloat16)
    q, scale = ptpc_quantize_triton(x)
    expected_q, expected_scale = ptpc_quantize_torch(x)
    assert torch.equal(q.float(), expected_q.float()) and torch.equal(scale, expected_scale), \
        quantizer_mismatch_report(x, q, scale, expected_q, expected_scale)


def scaled_mm_relative_error(x_q, x_scale, w_q, w_scale, expected) -> float:
    """torch._scaled_mm (cuBLASLt FP8) on the same inputs: unit per-tensor scales with an
    fp32 output (row-wise scales only write bf16), the scales applied afterwards in fp32."""
    one = torch.ones((), device=x_q.device)
    y = torch._scaled_mm(x_q, w_q.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
    y = y * x_scale[:, None] * w_scale[None, :]
    return ((y.double() - expected.double()).abs().max() / expected.double().abs().max()).item()


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 128, 300, 1024, 2048], ids=lambda m: f"M{m}")
@pytest.mark.parametrize("n,k", [(7168, 12288), (576, 7168), (24576, 512)],
                         ids=["o_proj", "kv_a", "kv_b"])
def test_ptpc_linear_triton_proxy_shapes_gpu(m, n, k):
    """The launcher's own tile choice, fp32 out, about as close to fp32 math on the same
    quantized values as torch._scaled_mm (the torch op's quantizer: this is about the GEMM)."""
    x_q, x_scale = ptpc_quantize_torch(random_matrix(m, k, seed=m, dtype=torch.bfloat16))
    w_q, w_scale = quantize_weight_ptpc(random_matrix(n, k, seed=n, dtype=torch.bfloat16))
    expected = ptpc_linear_quantized_torch(x_q, x_scale, w_q, w_scale, torch.float32)
    y = ptpc_linear_quantized_triton(x_q, x_scale, w_q, w_scale, torch.float32)
    error = ((y.double() - expected.double()).abs().max() / expected.double().abs().max()).item()
    try:
        peer = scaled_mm_relative_error(x_q, x_scale, w_q, w_scale, expected)
        limit = SCALED_MM_ERROR_FACTOR * peer + SCALED_MM_ERROR_SLACK
        against = f"{SCALED_MM_ERROR_FACTOR} x torch._scaled_mm's {peer:.3g} on the same " \
                  f"inputs + {SCALED_MM_ERROR_SLACK}"
    except RuntimeError as failure:            # this shape or cuBLASLt has no fp32 output
        limit, against = FP8_GEMM_TOLERANCE, f"the fixed bound (_scaled_mm: {failure})"
    assert error <= limit, f"relative error {error:.3g} > {limit:.3g}, {against}"
